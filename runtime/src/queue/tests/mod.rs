//! Unit and property tests of the queue rules (see the numbered rules in [`super`]).

mod fairness;
mod holds;
mod prop;
mod rules;

use super::{Lease, QueueConfig, WorkQueue};
use crate::key::{ObjectKey, TenantKey};

pub(super) fn key(name: &str) -> ObjectKey {
    ObjectKey::namespaced("App", "ns", name)
}

pub(super) fn tenant(name: &str) -> TenantKey {
    TenantKey::new(name)
}

/// A work-conserving queue (no per-tenant cap).
pub(super) fn queue(max_in_flight: usize) -> WorkQueue {
    WorkQueue::new(QueueConfig {
        max_in_flight,
        ..QueueConfig::default()
    })
    .expect("valid config")
}

/// A queue with an explicit per-tenant cap.
pub(super) fn capped(max_in_flight: usize, per_tenant_cap: usize) -> WorkQueue {
    WorkQueue::new(QueueConfig {
        max_in_flight,
        per_tenant_cap: Some(per_tenant_cap),
        ..QueueConfig::default()
    })
    .expect("valid config")
}

/// Get and immediately finish one key, returning its name.
pub(super) fn serve(q: &WorkQueue) -> Option<String> {
    let lease: Lease = q.try_get()?;
    let name = lease.key().name.to_string();
    lease.done();
    Some(name)
}
