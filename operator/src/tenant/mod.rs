//! The Tenant controller: `source` (what is watched) → the runtime's fair queue (weighted by
//! `spec.weight`) → `reconcile` → `desired` (applied by idem-runtime) → `status`.

pub mod desired;
pub mod finalize;
pub mod policy;
pub mod quota_gate;
pub mod quota_keys;
pub mod quota_record;
pub mod quota_split;
pub mod quota_usage;
pub mod reconcile;
pub mod source;
pub mod status;
