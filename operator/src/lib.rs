//! idem-operator: the Tenant and TenantApp controllers, and the manager that runs them
//! (leader election, probes, metrics, graceful shutdown).
//!
//! The flow of one controller is visible in its file names: `source` (what is watched) →
//! the runtime's fair queue → `reconcile` (an idem-runtime `Reconciler`) → `desired`
//! children (applied by idem-runtime's engine) → `status`.

pub mod client;
pub mod context;
pub mod error;
pub mod leader;
pub mod manager;
pub mod rbac;
pub mod resources;
pub mod shard;
pub mod tenant;
pub mod tenant_app;
