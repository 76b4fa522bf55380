//! Fair scheduling between tenants: Start-time Fair Queuing (SFQ) with
//! unit cost per dispatch, one scheduler per
//! priority level, work-conserving but for an optional idle reserve, with an optional
//! per-tenant in-flight cap.
//!
//! Each tenant with ready work at a level carries a virtual *start tag* `S`; the scheduler
//! dispatches the tenant with the smallest `S` (ties: the one that became ready first) and sets
//! the level's virtual time `V` to that `S`. After a dispatch the tenant's *finish tag* is
//! `F = S + 1/weight`, and its next start tag is `F` while it stays backlogged, or
//! `max(V, F)` when it becomes ready again (so idling earns no credit). Consequences, which
//! the unit tests check:
//! - over any interval in which tenants `a` and `b` are both backlogged, their dispatch counts
//!   satisfy `|n_a/w_a − n_b/w_b| ≤ 1/w_a + 1/w_b` (SFQ's fairness theorem with unit cost):
//!   shares are proportional to weight up to about one dispatch per tenant, for any weights,
//!   and however many keys each tenant has in flight;
//! - a tenant that becomes ready gets `S = V`, at most the tag of every backlogged tenant, so
//!   its first key is handed out after at most one dispatch of each other active tenant,
//!   whatever their backlogs and weights;
//! - it is work-conserving: a tenant is skipped only when it has no ready work or is at its
//!   explicit cap, so one tenant alone may use every worker — except the reserved workers
//!   ([`Fair::pop_for_idle`]), which pass over tenants with keys in flight and go to a
//!   tenant with none, at its turn or for a lone change (one key waiting at the level). A
//!   lone change served out of turn is not charged: neither its tenant's tags nor `V` move,
//!   so the bounds above hold for every other tenant; a tenant with a backlog still waits
//!   for its turn.
//!
//! Tags are integers: `1/weight` is [`STRIDE`]` / weight` (as in stride scheduling), so no
//! floating-point drift. Tenants are forgotten (state and metric series) once no key refers
//! to them; see [`Fair::release`].

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use foldhash::HashMap;

use prometheus_client::metrics::{counter::Counter, gauge::Gauge};

use crate::key::TenantKey;

/// Virtual time of one dispatch of a weight-1 tenant (2⁴⁰; a weight `w` dispatch costs
/// `STRIDE / w`, exact to 2⁻⁴⁰ of a dispatch).
pub(crate) const STRIDE: u128 = 1 << 40;

/// Looks up a tenant's current weight on every dispatch; `None` keeps the weight given to
/// [`Fair::set_weight`] (or 1).
pub(crate) type WeightLookup = Arc<dyn Fn(&TenantKey) -> Option<u32> + Send + Sync>;

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
    /// Finish tag of the last dispatch, per level.
    finish: [u128; LEVELS],
    /// The heap sequence number of this tenant's live heap entry per level, if it has one.
    in_heap: [Option<u64>; LEVELS],
    in_flight: usize,
    /// Slots (keys) that refer to this tenant; at 0 the tenant is forgotten.
    refs: usize,
    metrics: Option<TenantMetrics>,
}

/// One priority level's scheduler: its virtual time and the ready tenants by start tag.
#[derive(Debug, Default)]
struct Level {
    vtime: u128,
    /// `(start tag, sequence, tenant)`; entries whose sequence is not the tenant's
    /// `in_heap` are stale.
    heap: BinaryHeap<Reverse<(u128, u64, u32)>>,
    next_seq: u64,
}

/// The SFQ scheduler state over all tenants.
pub(crate) struct Fair {
    tenants: Vec<Option<Tenant>>,
    free: Vec<u32>,
    index: HashMap<TenantKey, u32>,
    levels: [Level; LEVELS],
    per_tenant_cap: Option<usize>,
    lookup: Option<WeightLookup>,
}

impl std::fmt::Debug for Fair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fair")
            .field("tenants", &self.index.len())
            .field("per_tenant_cap", &self.per_tenant_cap)
            .finish_non_exhaustive()
    }
}

impl Fair {
    /// An empty scheduler; `per_tenant_cap` (if any) bounds each tenant's keys in flight.
    pub fn new(per_tenant_cap: Option<usize>) -> Self {
        Self {
            tenants: Vec::new(),
            free: Vec::new(),
            index: HashMap::default(),
            levels: Default::default(),
            per_tenant_cap,
            lookup: None,
        }
    }

    /// Read weights through `lookup` on every dispatch (see [`WeightLookup`]).
    pub fn set_lookup(&mut self, lookup: WeightLookup) {
        self.lookup = Some(lookup);
    }

    fn t(&self, id: u32) -> &Tenant {
        self.tenants[id as usize]
            .as_ref()
            .expect("tenant ids in use refer to live tenants")
    }

    fn t_mut(&mut self, id: u32) -> &mut Tenant {
        self.tenants[id as usize]
            .as_mut()
            .expect("tenant ids in use refer to live tenants")
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
        let tenant = Tenant {
            name: name.clone(),
            weight: 1,
            queues: Default::default(),
            queued: [0; LEVELS],
            finish: [0; LEVELS],
            in_heap: [None; LEVELS],
            in_flight: 0,
            refs: 0,
            metrics: metrics(name),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.tenants[id as usize] = Some(tenant);
                id
            }
            None => {
                self.tenants.push(Some(tenant));
                u32::try_from(self.tenants.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.index.insert(name.clone(), id);
        id
    }

    /// A key now refers to `tenant` (it stays known at least until [`Fair::release`]).
    pub fn retain(&mut self, tenant: u32) {
        self.t_mut(tenant).refs += 1;
    }

    /// A key no longer refers to `tenant`; when none does, the tenant (its weight, tags and
    /// metric series, via `forget_metrics`) is forgotten. Returns whether it was.
    pub fn release(&mut self, tenant: u32, forget_metrics: impl FnOnce(&TenantKey)) -> bool {
        let t = self.t_mut(tenant);
        t.refs = t.refs.saturating_sub(1);
        if t.refs > 0 || t.in_flight > 0 || t.queued.iter().any(|&q| q > 0) {
            return false;
        }
        let t = self.tenants[tenant as usize]
            .take()
            .expect("checked live above");
        self.index.remove(&t.name);
        if t.metrics.is_some() {
            forget_metrics(&t.name);
        }
        self.free.push(tenant);
        true
    }

    /// Tenants currently known.
    pub fn tenants(&self) -> usize {
        self.index.len()
    }

    /// The index of a known tenant.
    pub fn lookup(&self, name: &TenantKey) -> Option<&u32> {
        self.index.get(name)
    }

    /// The tenant's name.
    pub fn name(&self, tenant: u32) -> &TenantKey {
        &self.t(tenant).name
    }

    /// A tenant's weight now: its lookup's answer, else the weight set for it (at least 1).
    pub fn weight(&self, tenant: u32) -> u32 {
        let looked_up = match &self.lookup {
            Some(lookup) => lookup(self.name(tenant)).filter(|&w| w > 0),
            None => None,
        };
        looked_up.unwrap_or(self.t(tenant).weight).max(1)
    }

    /// Set a tenant's weight (`weight` ≥ 1, checked by the caller); it applies from the
    /// tenant's next dispatch.
    pub fn set_weight(&mut self, tenant: u32, weight: u32) {
        self.t_mut(tenant).weight = weight;
    }

    /// Keys of `tenant` in flight.
    pub fn in_flight(&self, tenant: u32) -> usize {
        self.t(tenant).in_flight
    }

    /// Valid queued entries of `tenant` at `level`.
    pub fn queued(&self, tenant: u32, level: usize) -> usize {
        self.t(tenant).queued[level]
    }

    /// Append a valid entry for `tenant` at `level` (or put it first with `front`).
    pub fn push(&mut self, tenant: u32, level: usize, entry: Entry, front: bool) {
        let t = self.t_mut(tenant);
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

    /// Record that one of `tenant`'s entries at `level` became stale (the key moved level)
    /// without being dispatched.
    pub fn forget(&mut self, tenant: u32, level: usize) {
        let t = self.t_mut(tenant);
        t.queued[level] = t.queued[level].saturating_sub(1);
        if t.queued[level] == 0 {
            t.queues[level].clear();
        }
        if let Some(m) = &t.metrics {
            m.depth.dec();
        }
    }

    /// A key of `tenant` finished; the tenant may become eligible again under its cap.
    pub fn finish(&mut self, tenant: u32) {
        let t = self.t_mut(tenant);
        t.in_flight = t.in_flight.saturating_sub(1);
        for level in 0..LEVELS {
            self.make_eligible(tenant, level);
        }
    }

    fn eligible(&self, tenant: u32, level: usize) -> bool {
        let t = self.t(tenant);
        t.queued[level] > 0 && self.per_tenant_cap.is_none_or(|cap| t.in_flight < cap)
    }

    /// Put a tenant that has ready work (and room under its cap) into the level's heap with
    /// start tag `max(V, F)`.
    fn make_eligible(&mut self, tenant: u32, level: usize) {
        if !self.eligible(tenant, level) || self.t(tenant).in_heap[level].is_some() {
            return;
        }
        let vtime = self.levels[level].vtime;
        let start = self.t(tenant).finish[level].max(vtime);
        self.enter(tenant, level, start);
    }

    fn enter(&mut self, tenant: u32, level: usize, start: u128) {
        let l = &mut self.levels[level];
        let seq = l.next_seq;
        l.next_seq += 1;
        l.heap.push(Reverse((start, seq, tenant)));
        self.t_mut(tenant).in_heap[level] = Some(seq);
    }

    /// Dispatch the next entry at `level` by SFQ, skipping stale entries with `valid`.
    /// Returns the tenant index and the entry.
    pub fn pop(&mut self, level: usize, valid: impl Fn(Entry) -> bool) -> Option<(u32, Entry)> {
        loop {
            let Reverse((start, seq, tenant)) = self.levels[level].heap.pop()?;
            if !self.take_heap_entry(level, seq, tenant) {
                continue; // stale, ran dry or at its cap; re-enters when ready
            }
            if let Some(entry) = self.dispatch(level, tenant, start, &valid, true) {
                return Some((tenant, entry));
            }
        }
    }

    /// The dispatch of a reserved worker
    /// ([`QueueConfig::idle_reserve`](super::QueueConfig::idle_reserve)): in tag order, tenants with keys in flight are passed over (and keep their place); the
    /// first tenant with none in flight is served if its turn has come (no tenant before it
    /// is ready) or its one waiting key is all it has queued at `level` (a lone change, such
    /// as a tenant's next edit right after its last one was served). A tenant with a backlog
    /// waits for its turn, so weighted shares among backlogged tenants hold. A change served
    /// out of turn is not charged (see below). Looks at most at one entry per busy tenant,
    /// plus one.
    pub fn pop_for_idle(
        &mut self,
        level: usize,
        valid: impl Fn(Entry) -> bool,
    ) -> Option<(u32, Entry)> {
        let mut passed = Vec::new();
        let found = loop {
            let Some(Reverse((start, seq, tenant))) = self.levels[level].heap.pop() else {
                break None;
            };
            let live = self.tenants[tenant as usize]
                .as_ref()
                .is_some_and(|t| t.in_heap[level] == Some(seq));
            if live && self.eligible(tenant, level) {
                let t = self.t(tenant);
                let turn = passed.is_empty();
                if t.in_flight > 0 || !(turn || t.queued[level] == 1) {
                    passed.push(Reverse((start, seq, tenant)));
                    if t.in_flight > 0 {
                        continue;
                    }
                    break None;
                }
            }
            if !self.take_heap_entry(level, seq, tenant) {
                continue;
            }
            // Served out of turn (past a busy tenant), a lone change is not charged: its
            // tenant's finish tag and the virtual time stay as they were, so neither it nor a
            // tenant that becomes active later is set back by it (the bounds in this module's
            // docs hold).
            let charged = passed.is_empty();
            if let Some(entry) = self.dispatch(level, tenant, start, &valid, charged) {
                break Some((tenant, entry));
            }
        };
        // Passed-over tenants keep their entries (`in_heap` still names them).
        self.levels[level].heap.extend(passed);
        found
    }

    /// Takes a popped heap entry: whether it is the tenant's live entry and the tenant can be
    /// served (its entry is gone from the heap either way).
    fn take_heap_entry(&mut self, level: usize, seq: u64, tenant: u32) -> bool {
        let live = self.tenants[tenant as usize]
            .as_ref()
            .is_some_and(|t| t.in_heap[level] == Some(seq));
        if !live {
            return false; // stale: the tenant left the heap (or was forgotten) since
        }
        self.t_mut(tenant).in_heap[level] = None;
        self.eligible(tenant, level)
    }

    /// Hands out `tenant`'s next valid entry at `level`, served at tag `start`, `charged` to
    /// its share (its finish tag and the virtual time advance) or not; `None` if its count and
    /// entries disagree.
    fn dispatch(
        &mut self,
        level: usize,
        tenant: u32,
        start: u128,
        valid: &impl Fn(Entry) -> bool,
        charged: bool,
    ) -> Option<Entry> {
        let weight = self.weight(tenant);
        let t = self.t_mut(tenant);
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
            return None;
        };
        t.queued[level] -= 1;
        t.in_flight += 1;
        if charged {
            t.finish[level] = start + STRIDE / u128::from(weight);
        }
        if let Some(m) = &t.metrics {
            m.depth.dec();
            m.dispatches.inc();
        }
        let next = t.finish[level].max(start);
        if charged {
            self.levels[level].vtime = start;
        }
        if self.eligible(tenant, level) {
            self.enter(tenant, level, next);
        }
        Some(entry)
    }

    /// Clear every queue (at shutdown); in-flight counts are kept.
    pub fn clear_queues(&mut self) {
        for t in self.tenants.iter_mut().flatten() {
            for level in 0..LEVELS {
                if let Some(m) = &t.metrics {
                    m.depth
                        .dec_by(i64::try_from(t.queued[level]).unwrap_or(i64::MAX));
                }
                t.queues[level].clear();
                t.queued[level] = 0;
                t.in_heap[level] = None;
            }
        }
        for level in &mut self.levels {
            level.heap.clear();
        }
    }
}
