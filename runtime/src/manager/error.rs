//! Why a [`Manager`](super::Manager) stopped with an error.

use std::fmt;

use crate::controller::ControllerError;

/// Why a manager could not start or stopped abnormally.
///
/// Its `Debug` is its message, because `main` returning `Err` prints the error's `Debug`: a
/// user's binary without a kubeconfig says so in a sentence, not as nested structs.
#[derive(thiserror::Error)]
pub enum ManagerError {
    /// No client configuration could be loaded.
    #[error(transparent)]
    Config(#[from] super::client::ConfigError),
    /// The client stack could not be built, or a request at start failed.
    #[error("Kubernetes client: {}", client_message(.0))]
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
    /// A shard ring came alive beside this replica, which runs outside it: it stopped every
    /// reconcile and exits (restarted, it waits while the ring is live, ready as a standby).
    #[error("refusing to run on: {0}")]
    RingLive(String),
    /// Another process renews this shard member's Lease (two replicas with one identity): it
    /// reconciled nothing and exits (restarted, it looks at the Lease again).
    #[error("refusing to run: {0}")]
    Refused(String),
    /// A controller's configuration is invalid.
    #[error("controller {name}: {source}")]
    Controller {
        /// The controller.
        name: String,
        /// Why it did not start.
        source: ControllerError,
    },
    /// The options ask for what cannot go together (e.g. `shards` with `leader_elect`).
    #[error("invalid options: {0}")]
    Options(&'static str),
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
    /// An RBAC object could not be printed.
    #[error("RBAC object {kind}: {message}")]
    Rbac {
        /// Its kind.
        kind: String,
        /// What failed.
        message: String,
    },
}

/// A client error in words (the server's status, not its debug form); a refusal (403) says
/// what to do about it.
fn client_message(err: &kube::Error) -> String {
    let described = crate::api_error::describe(err);
    match err {
        kube::Error::Api(status) if status.code == 403 => format!(
            "{described}; the account this runs as lacks that permission: apply the RBAC \
             objects its `rbac` command prints (e.g. `<binary> rbac -n <namespace> | kubectl \
             apply --server-side -f -`)"
        ),
        _ => described,
    }
}

impl fmt::Debug for ManagerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn main_returning_the_error_prints_its_message() {
        let e = ManagerError::Io {
            what: "binding the metrics address 127.0.0.1:8080",
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        assert_eq!(format!("{e:?}"), e.to_string());
        assert!(
            format!("{e:?}").starts_with("binding the metrics address"),
            "{e:?}"
        );
    }

    #[test]
    fn a_forbidden_request_at_start_says_to_apply_the_rbac() {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "reason": "Forbidden", "code": 403,
            "message": "customresourcedefinitions.apiextensions.k8s.io is forbidden: User \"system:serviceaccount:ops:x\" cannot patch resource \"customresourcedefinitions\"",
        }))
        .unwrap();
        let e = ManagerError::Client(kube::Error::Api(status.into()));
        let text = format!("{e:?}");
        assert!(
            text.starts_with("Kubernetes client: 403 Forbidden: customresourcedefinitions")
                && text.contains("`rbac` command")
                && !text.contains("Status {"),
            "{text}"
        );
    }
}
