//! Fair scheduling between tenants: Deficit Round Robin (Shreedhar & Varghese, 1995) with
//! unit cost per dispatch, one round per priority level, and a per-tenant in-flight cap.
//!
//! Every tenant with ready work at a level sits in that level's ring. The tenant at the front
//! of the ring receives a quantum of `weight` dispatches when its turn starts, is served until
//! the quantum is spent (or it runs out of ready work, or reaches its in-flight cap) and then
//! moves to the back. Consequences, which the unit tests check:
//! - with tenants A and B backlogged, dispatches split exactly `wA : wB` per round;
//! - a tenant that becomes ready joins the back of the ring, so its first key waits for at
//!   most the sum of the weights of the tenants ahead of it (= the number of backlogged
//!   tenants when weights are 1), however deep their backlogs are.

use std::collections::VecDeque;

use foldhash::HashMap;

use prometheus_client::metrics::{counter::Counter, gauge::Gauge};

use crate::key::TenantKey;

/// A reference to one queued key: its slot index and the enqueue sequence number that makes
/// the entry valid (entries superseded by a later enqueue are skipped lazily).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Index of the key's slot.
    pub slot: u32,
    /// The slot's enqueue sequence number when this entry was pushed.
    pub seq: u32,
}

/// Per-tenant metric handles, resolved once when the tenant is first seen.
#[derive(Clone, Debug)]
pub(crate) struct TenantMetrics {
    /// `idem_tenant_queue_depth{tenant}`.
    pub depth: Gauge,
    /// `idem_tenant_dispatches_total{tenant}`.
    pub dispatches: Counter,
}

/// Number of priority levels (event, resync).
pub(crate) const LEVELS: usize = 2;

#[derive(Debug)]
struct Tenant {
    name: TenantKey,
    weight: u32,
    /// Entries per level, possibly with stale ones among them.
    queues: [VecDeque<Entry>; LEVELS],
    /// Valid entries per level.
    queued: [usize; LEVELS],
    /// Dispatches left in the current DRR turn, per level.
    deficit: [u32; LEVELS],
    /// Whether the tenant currently sits in a level's ring (maybe ineligible, removed lazily).
    in_ring: [bool; LEVELS],
    in_flight: usize,
    metrics: Option<TenantMetrics>,
}

/// The DRR scheduler state over all tenants.
#[derive(Debug)]
pub(crate) struct Fair {
    tenants: Vec<Tenant>,
    index: HashMap<TenantKey, u32>,
    rings: [VecDeque<u32>; LEVELS],
    per_tenant_cap: usize,
}

impl Fair {
    /// An empty scheduler; `per_tenant_cap` bounds each tenant's keys in flight.
    pub fn new(per_tenant_cap: usize) -> Self {
        Self {
            tenants: Vec::new(),
            index: HashMap::default(),
            rings: Default::default(),
            per_tenant_cap,
        }
    }

    /// The index of `name`, registering the tenant (weight 1) on first sight.
    pub fn tenant_id(
        &mut self,
        name: &TenantKey,
        metrics: impl FnOnce(&TenantKey) -> Option<TenantMetrics>,
    ) -> u32 {
        if let Some(&id) = self.index.get(name) {
            return id;
        }
        let id = u32::try_from(self.tenants.len()).unwrap_or(u32::MAX);
        self.tenants.push(Tenant {
            name: name.clone(),
            weight: 1,
            queues: Default::default(),
            queued: [0; LEVELS],
            deficit: [0; LEVELS],
            in_ring: [false; LEVELS],
            in_flight: 0,
            metrics: metrics(name),
        });
        self.index.insert(name.clone(), id);
        id
    }

    /// The index of a known tenant.
    pub fn lookup(&self, name: &TenantKey) -> Option<&u32> {
        self.index.get(name)
    }

    /// The tenant's name.
    pub fn name(&self, tenant: u32) -> &TenantKey {
        &self.tenants[tenant as usize].name
    }

    /// Set a tenant's weight (`weight` ≥ 1, checked by the caller).
    pub fn set_weight(&mut self, tenant: u32, weight: u32) {
        let t = &mut self.tenants[tenant as usize];
        t.weight = weight;
        for d in &mut t.deficit {
            *d = (*d).min(weight);
        }
    }

    /// Keys of `tenant` in flight.
    pub fn in_flight(&self, tenant: u32) -> usize {
        self.tenants[tenant as usize].in_flight
    }

    /// Valid queued entries of `tenant` at `level`.
    pub fn queued(&self, tenant: u32, level: usize) -> usize {
        self.tenants[tenant as usize].queued[level]
    }

    /// Append a valid entry for `tenant` at `level` (or put it first with `front`).
    pub fn push(&mut self, tenant: u32, level: usize, entry: Entry, front: bool) {
        let t = &mut self.tenants[tenant as usize];
        if front {
            t.queues[level].push_front(entry);
        } else {
            t.queues[level].push_back(entry);
        }
        t.queued[level] += 1;
        if let Some(m) = &t.metrics {
            m.depth.inc();
        }
        self.make_eligible(tenant, level);
    }

    /// Record that one of `tenant`'s entries at `level` became stale (the key moved level,
    /// or the queue was cleared) without being dispatched.
    pub fn forget(&mut self, tenant: u32, level: usize) {
        let t = &mut self.tenants[tenant as usize];
        t.queued[level] = t.queued[level].saturating_sub(1);
        if t.queued[level] == 0 {
            t.queues[level].clear();
        }
        if let Some(m) = &t.metrics {
            m.depth.dec();
        }
    }

    /// A key of `tenant` finished; it may become eligible again under its cap.
    pub fn finish(&mut self, tenant: u32) {
        let t = &mut self.tenants[tenant as usize];
        t.in_flight = t.in_flight.saturating_sub(1);
        for level in 0..LEVELS {
            self.make_eligible(tenant, level);
        }
    }

    fn eligible(&self, tenant: u32, level: usize) -> bool {
        let t = &self.tenants[tenant as usize];
        t.queued[level] > 0 && t.in_flight < self.per_tenant_cap
    }

    fn make_eligible(&mut self, tenant: u32, level: usize) {
        if self.eligible(tenant, level) && !self.tenants[tenant as usize].in_ring[level] {
            self.tenants[tenant as usize].in_ring[level] = true;
            self.rings[level].push_back(tenant);
        }
    }

    /// Dispatch the next entry at `level` by DRR, skipping stale entries with `valid`.
    /// Returns the tenant index and the entry.
    pub fn pop(&mut self, level: usize, valid: impl Fn(Entry) -> bool) -> Option<(u32, Entry)> {
        loop {
            let tenant = *self.rings[level].front()?;
            if !self.eligible(tenant, level) {
                // Lazily drop a tenant that ran dry or hit its cap since it joined the ring.
                self.rings[level].pop_front();
                let t = &mut self.tenants[tenant as usize];
                t.in_ring[level] = false;
                t.deficit[level] = 0;
                continue;
            }
            let cap = self.per_tenant_cap;
            let t = &mut self.tenants[tenant as usize];
            if t.deficit[level] == 0 {
                t.deficit[level] = t.weight; // a new DRR turn: grant the quantum
            }
            let mut found = None;
            while let Some(entry) = t.queues[level].pop_front() {
                if valid(entry) {
                    found = Some(entry);
                    break;
                }
            }
            let Some(entry) = found else {
                // Count and entries disagree: cannot happen while callers keep `queued` in
                // step; recover by treating the tenant as empty rather than looping.
                t.queued[level] = 0;
                continue;
            };
            t.queued[level] -= 1;
            t.deficit[level] -= 1;
            t.in_flight += 1;
            if let Some(m) = &t.metrics {
                m.depth.dec();
                m.dispatches.inc();
            }
            if t.queued[level] == 0 || t.in_flight >= cap {
                self.rings[level].pop_front();
                t.in_ring[level] = false;
                t.deficit[level] = 0;
            } else if t.deficit[level] == 0 {
                self.rings[level].rotate_left(1);
            }
            return Some((tenant, entry));
        }
    }

    /// Clear every queue (at shutdown); in-flight counts are kept.
    pub fn clear_queues(&mut self) {
        for t in &mut self.tenants {
            for level in 0..LEVELS {
                if let Some(m) = &t.metrics {
                    m.depth
                        .dec_by(i64::try_from(t.queued[level]).unwrap_or(i64::MAX));
                }
                t.queues[level].clear();
                t.queued[level] = 0;
                t.in_ring[level] = false;
                t.deficit[level] = 0;
            }
        }
        for ring in &mut self.rings {
            ring.clear();
        }
    }
}
