//! The TenantApp controller: `source` → the runtime's fair queue (by tenant) → `reconcile` →
//! `desired` ConfigMap, Deployment and Service (applied by idem-runtime) → `status`.

pub mod desired;
pub mod finalize;
pub mod reconcile;
pub mod source;
pub mod status;
