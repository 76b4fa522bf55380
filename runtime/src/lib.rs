//! idem's runtime: per-tenant fair work queues, per-key backoff, the controller loop and the
//! apply/status engine that `#[derive(IdempotentResource)]` plugs into.

pub mod backoff;
pub mod controller;
pub mod key;
pub mod metrics;
pub mod queue;

pub use key::{ObjectKey, TenantKey};
