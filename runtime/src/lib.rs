//! idem's runtime: per-tenant fair work queues, per-key backoff, the controller loop and the
//! apply/status engine that `#[derive(IdempotentResource)]` plugs into.

mod api_error;
pub mod apply;
pub mod backoff;
mod cache;
pub mod compare;
pub mod controller;
pub mod derive;
pub mod http;
pub mod inflight;
pub mod key;
mod labels;
pub mod leader;
pub mod metrics;
pub mod prelude;
pub mod queue;
pub mod reconciler;
pub mod resource;
pub mod schema;
pub mod shard;
pub mod status;

/// Derives [`resource::IdempotentResource`] for a kube `CustomResource`; see [`derive`](mod@derive) for
/// every attribute.
pub use idem_macros::IdempotentResource;
pub use key::{ObjectKey, TenantKey};

/// Crates the derive's generated code refers to; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use k8s_openapi;
    pub use kube;
    pub use serde_json;
}
