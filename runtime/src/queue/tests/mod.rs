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

/// A fully work-conserving queue (no per-tenant cap, no idle reserve): SFQ alone.
pub(super) fn queue(max_in_flight: usize) -> WorkQueue {
    reserved(max_in_flight, 0)
}

/// A queue keeping `idle_reserve` workers for tenants with nothing in flight (the default
/// keeps 1).
pub(super) fn reserved(max_in_flight: usize, idle_reserve: usize) -> WorkQueue {
    WorkQueue::new(QueueConfig {
        max_in_flight,
        idle_reserve,
        ..QueueConfig::default()
    })
    .expect("valid config")
}

/// A queue with an explicit per-tenant cap (and no idle reserve).
pub(super) fn capped(max_in_flight: usize, per_tenant_cap: usize) -> WorkQueue {
    WorkQueue::new(QueueConfig {
        max_in_flight,
        per_tenant_cap: Some(per_tenant_cap),
        idle_reserve: 0,
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
