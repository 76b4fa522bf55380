//! The operator's reconcile error.

/// Why a reconcile failed; the key is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Applying or pruning children failed.
    #[error(transparent)]
    Apply(#[from] idem_runtime::apply::ApplyError),
    /// Writing status or finalizers failed.
    #[error(transparent)]
    Status(#[from] idem_runtime::status::StatusError),
    /// Another API call failed.
    #[error("API request failed: {0}")]
    Kube(#[from] kube::Error),
}
