//! Why a [`Manager`](super::Manager) stopped with an error.

use crate::controller::ControllerError;

/// Why a manager could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// No client configuration could be loaded.
    #[error(transparent)]
    Config(#[from] super::client::ConfigError),
    /// The client stack could not be built, or a request at start failed.
    #[error("Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    /// The metrics/health addresses could not be bound, or the tokio runtime not built.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// What failed.
        source: std::io::Error,
    },
    /// Leader election could not start.
    #[error(transparent)]
    Leader(#[from] crate::leader::LeaderError),
    /// Leadership was lost: every reconcile was cancelled (a standby takes over).
    #[error("lost leadership")]
    LostLeadership,
    /// A controller's configuration is invalid.
    #[error("controller {name}: {source}")]
    Controller {
        /// The controller.
        name: String,
        /// Why it did not start.
        source: ControllerError,
    },
    /// A kind's CRD has no structural schema.
    #[error(transparent)]
    Schema(#[from] crate::schema::SchemaError),
    /// A CRD could not be printed or installed.
    #[error("CRD {name}: {message}")]
    Crd {
        /// The CRD.
        name: String,
        /// What failed.
        message: String,
    },
}
