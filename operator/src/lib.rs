//! idem-operator: the Tenant and TenantApp controllers, run by idem-runtime's manager
//! ([`manager`]: leader election or sharding, probes, metrics, graceful shutdown).
//!
//! The flow of one controller is visible in its file names: `source` (what is watched) →
//! the runtime's fair queue → `reconcile` (an idem-runtime `Reconciler`) → `desired`
//! children (applied by idem-runtime's engine) → `status`.

pub mod context;
pub mod controllers;
pub mod error;
pub mod rbac;
pub mod resources;
pub mod shard;
pub mod tenant;
pub mod tenant_app;

use idem_runtime::manager::{Manager, ManagerOptions};

/// The operator's name: its leader-election Lease, its shard ring (member Leases
/// `idem-operator-shard-<identity>`) and its Events reporter.
pub const NAME: &str = "idem-operator";

/// The operator's manager, running with `options`.
pub fn manager(options: ManagerOptions) -> Manager {
    Manager::new(NAME, options).add(controllers::Operator)
}
