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
    /// Finding the tenant of an object failed (an API error while reading its namespace).
    #[error(transparent)]
    Tenant(#[from] idem_runtime::resource::TenantError),
    /// Another API call failed.
    #[error("API request failed: {0}")]
    Kube(#[from] kube::Error),
}
