//! The queue's synchronous state machine: per-key state (dedupe, one in flight, delays),
//! driven with an explicit `now` so it is deterministic to test and cheap to benchmark.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::collections::hash_map::Entry as MapEntry;

use foldhash::HashMap;
use std::sync::Arc;

use tokio::time::{Duration, Instant};

mod delays;

use super::fair::{Entry, Fair, LEVELS};
use super::priority::{Aging, AgingEntry, Priority};
use super::{QueueConfig, QueueMetrics};
use crate::key::{ObjectKey, TenantKey};

/// What an add did to the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddOutcome {
    /// The key was not waiting: it is now queued, or a delay was recorded for it (or its
    /// pending delay brought forward).
    Queued,
    /// The key was already waiting at least as soon (queued, dirty, an earlier pending delay,
    /// or a backoff wait the add was folded into): no new dispatch was scheduled, but the
    /// waiting work now has the higher of the two priorities (a queued resync key is raised
    /// to event priority at once; a pending delay fires at event priority).
    Deduped,
    /// The key is in flight: it will be queued once more after its worker calls done.
    Dirty,
    /// The queue is shut down: the add was ignored.
    Closed,
}

/// The current time, read from the clock at most once per operation and only when needed
/// (event-only work without metrics never reads it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Now(Option<Instant>);

impl Now {
    /// Read the clock on first use.
    pub fn lazy() -> Self {
        Self(None)
    }

    /// A fixed time (tests).
    #[cfg(test)]
    pub fn at(t: Instant) -> Self {
        Self(Some(t))
    }

    /// The time, reading the clock if not read yet.
    pub fn get(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

/// Whether an add ends the key's backoff wait (the **Backoff holds** rule of [`super`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bypass {
    /// Folded into the retry (child events, resyncs, requeues).
    Never,
    /// Ends the wait, at most once per [`REPAIR_SPACING`] (one of the object's children was
    /// deleted, which the next attempt repairs).
    Repair,
    /// Ends the wait (the object's own spec changed).
    Always,
}

/// The least time between two attempts of one key started early by repair adds: a failing
/// reconcile that deletes its own children retries at most this often.
pub(crate) const REPAIR_SPACING: Duration = Duration::from_secs(10);

/// Per-key state. A slot lives while the key is queued, in flight, dirty or delayed.
#[derive(Debug)]
struct Slot {
    key: ObjectKey,
    tenant: u32,
    /// The level whose entry with `seq` is the key's valid queue entry, if queued.
    queued: Option<usize>,
    /// Enqueue sequence number; never reset, so stale entries stay stale across reuse.
    seq: u32,
    in_flight: bool,
    /// Added again while in flight: queue again at this priority after done.
    dirty: Option<Priority>,
    /// The dirty mark came from an add that bypasses backoff (the primary's spec changed).
    dirty_forced: bool,
    /// The dirty mark came from a repair add ([`Bypass::Repair`]).
    dirty_repair: bool,
    /// Backing off after a failure until then: plain adds are folded into the retry delay.
    hold: Option<Instant>,
    /// When a repair add last started an attempt early ([`REPAIR_SPACING`]).
    repaired_at: Option<Instant>,
    /// The retry an early attempt replaced: if that attempt fails, its wait ends no later.
    resume: Option<Instant>,
    /// The earliest pending delayed add, if any.
    delay: Option<(Instant, Priority)>,
    /// Delay generation; heap entries with another generation are stale.
    delay_gen: u32,
    /// When the key was last enqueued (for queue-duration metrics).
    enqueued_at: Instant,
    live: bool,
}

impl Slot {
    fn idle(&self) -> bool {
        self.queued.is_none() && !self.in_flight && self.dirty.is_none() && self.delay.is_none()
    }
}

/// A key handed to a worker by [`Core::pop`].
#[derive(Debug)]
pub(crate) struct Dispatch {
    pub slot: u32,
    pub key: ObjectKey,
    pub tenant: TenantKey,
    pub priority: Priority,
    /// The tenant's weight at this dispatch.
    pub weight: u32,
}

/// The queue state; see the module docs of [`super`] for the rules it keeps.
#[derive(Debug)]
pub(crate) struct Core {
    slots: Vec<Slot>,
    free: Vec<u32>,
    index: HashMap<ObjectKey, u32>,
    fair: Fair,
    aging: Aging,
    delays: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    in_flight: usize,
    queued: usize,
    config: QueueConfig,
    closed: bool,
    metrics: Option<Arc<QueueMetrics>>,
    /// Placeholder for `enqueued_at` when no time is needed.
    epoch: Instant,
    /// Placeholder key of free slots (one shared allocation).
    vacant: ObjectKey,
}

impl Core {
    pub fn new(config: QueueConfig, metrics: Option<Arc<QueueMetrics>>) -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            index: HashMap::default(),
            fair: Fair::new(config.per_tenant_cap),
            vacant: ObjectKey::cluster("", ""),
            aging: Aging::default(),
            delays: BinaryHeap::new(),
            in_flight: 0,
            queued: 0,
            config,
            closed: false,
            metrics,
            epoch: Instant::now(),
        }
    }

    /// Read tenant weights through `lookup` on every dispatch.
    pub fn set_weight_lookup(&mut self, lookup: super::fair::WeightLookup) {
        self.fair.set_lookup(lookup);
    }

    fn tenant_id(&mut self, tenant: &TenantKey) -> u32 {
        let metrics = &self.metrics;
        self.fair
            .tenant_id(tenant, |t| metrics.as_ref().map(|m| m.tenant(t)))
    }

    /// Set a tenant's fair-share weight (≥ 1; validated by the caller).
    pub fn set_weight(&mut self, tenant: &TenantKey, weight: u32) {
        let id = self.tenant_id(tenant);
        self.fair.set_weight(id, weight);
    }

    /// The slot of `key`, created for `tenant` if the key is idle.
    fn slot_for(&mut self, key: &ObjectKey, tenant: &TenantKey) -> u32 {
        let vacant = match self.index.entry(key.clone()) {
            MapEntry::Occupied(e) => return *e.get(),
            MapEntry::Vacant(v) => v,
        };
        let metrics = &self.metrics;
        let tenant = self
            .fair
            .tenant_id(tenant, |t| metrics.as_ref().map(|m| m.tenant(t)));
        self.fair.retain(tenant);
        let slot = Slot {
            key: key.clone(),
            tenant,
            queued: None,
            seq: 0,
            in_flight: false,
            dirty: None,
            dirty_forced: false,
            dirty_repair: false,
            hold: None,
            repaired_at: None,
            resume: None,
            delay: None,
            delay_gen: 0,
            enqueued_at: self.epoch,
            live: true,
        };
        let id = match self.free.pop() {
            Some(id) => {
                let old = &mut self.slots[id as usize];
                let (seq, delay_gen) = (old.seq, old.delay_gen);
                *old = Slot {
                    seq,
                    delay_gen,
                    ..slot
                };
                id
            }
            None => {
                self.slots.push(slot);
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        vacant.insert(id);
        id
    }

    /// Free the slot of a key with nothing left to do: drop its key (no clone stays behind in
    /// the dead slot) and its reference to its tenant (forgotten when it was the last).
    fn release_if_idle(&mut self, id: u32) {
        let slot = &mut self.slots[id as usize];
        if slot.live && slot.idle() {
            slot.live = false;
            slot.hold = None;
            let key = std::mem::replace(&mut slot.key, self.vacant.clone());
            self.index.remove(&key);
            self.free.push(id);
            let metrics = &self.metrics;
            self.fair.release(slot.tenant, |t| {
                if let Some(m) = metrics {
                    m.forget_tenant(t);
                }
            });
        }
    }

    /// Put an idle (not queued, not in flight) key into its tenant's queue at `priority`.
    fn enqueue(&mut self, id: u32, priority: Priority, now: &mut Now, front: bool) {
        let slot = &mut self.slots[id as usize];
        let level = priority.level();
        slot.seq = slot.seq.wrapping_add(1);
        slot.queued = Some(level);
        if priority == Priority::Resync || self.metrics.is_some() {
            slot.enqueued_at = now.get();
        }
        let entry = Entry {
            slot: id,
            seq: slot.seq,
        };
        let tenant = slot.tenant;
        self.fair.push(tenant, level, entry, front);
        if priority == Priority::Resync {
            self.aging.push(AgingEntry {
                entry,
                tenant,
                since: slot.enqueued_at,
            });
        }
        self.queued += 1;
        if let Some(m) = &self.metrics {
            m.depth.inc();
        }
    }

    /// Apply an immediate add to an existing slot (also used when a delay fires); `bypass`
    /// marks a dirty key as bypassing backoff.
    fn add_slot(
        &mut self,
        id: u32,
        priority: Priority,
        bypass: Bypass,
        now: &mut Now,
    ) -> AddOutcome {
        let slot = &mut self.slots[id as usize];
        if slot.in_flight {
            let was = slot.dirty;
            slot.dirty = Some(was.map_or(priority, |p| p.max(priority)));
            slot.dirty_forced |= bypass == Bypass::Always;
            slot.dirty_repair |= bypass == Bypass::Repair;
            return if was.is_some() {
                AddOutcome::Deduped
            } else {
                AddOutcome::Dirty
            };
        }
        match slot.queued {
            Some(level) => {
                if priority.level() < level {
                    // Raise resync → event: the old entry goes stale, a new one is queued.
                    let tenant = slot.tenant;
                    slot.queued = None;
                    self.queued -= 1;
                    if let Some(m) = &self.metrics {
                        m.depth.dec();
                    }
                    self.fair.forget(tenant, level);
                    self.enqueue(id, priority, now, false);
                }
                AddOutcome::Deduped
            }
            None => {
                self.enqueue(id, priority, now, false);
                AddOutcome::Queued
            }
        }
    }

    /// Rules 1–3: add `key` now. An immediate add supersedes a pending delay of the key of no
    /// higher priority (a higher one stays and raises the key when it fires). While the key
    /// backs off after a failure (see [`Core::done`]), the add is folded into the retry unless
    /// `bypass` ends the backoff wait ([`Bypass`]).
    pub fn add(
        &mut self,
        key: &ObjectKey,
        tenant: &TenantKey,
        priority: Priority,
        bypass: Bypass,
        now: &mut Now,
    ) -> AddOutcome {
        if self.closed {
            return AddOutcome::Closed;
        }
        self.fire_delays(now);
        let id = self.slot_for(key, tenant);
        let slot = &mut self.slots[id as usize];
        if let Some(hold) = slot.hold {
            let now = now.get();
            let early = hold > now;
            let repair = bypass == Bypass::Repair
                && early
                && slot.repaired_at.is_none_or(|t| now >= t + REPAIR_SPACING);
            if early && bypass != Bypass::Always && !repair {
                return self.merge_delay(id, hold, priority);
            }
            if repair {
                slot.repaired_at = Some(now);
                slot.resume = Some(hold);
            } else if bypass == Bypass::Always {
                slot.resume = None;
            }
            slot.hold = None;
        }
        if slot.delay.is_some_and(|(_, p)| p <= priority) {
            slot.delay = None;
        }
        let outcome = self.add_slot(id, priority, bypass, now);
        if outcome != AddOutcome::Deduped
            && let Some(m) = &self.metrics
        {
            m.adds.inc();
        }
        outcome
    }

    /// Rule 5 (aging): promote resync entries that waited `resync_max_wait` to the front of
    /// their tenant's event queue.
    fn promote_aged(&mut self, now: &mut Now) {
        if self.aging.is_empty() {
            return;
        }
        let now = now.get();
        let max_wait = self.config.resync_max_wait;
        let resync = Priority::Resync.level();
        while let Some(aged) = self.aging.pop_aged(now, max_wait) {
            let slot = &mut self.slots[aged.entry.slot as usize];
            if slot.queued != Some(resync) || slot.seq != aged.entry.seq {
                continue;
            }
            slot.seq = slot.seq.wrapping_add(1);
            slot.queued = Some(Priority::Event.level());
            let entry = Entry {
                slot: aged.entry.slot,
                seq: slot.seq,
            };
            self.fair.forget(aged.tenant, resync);
            self.fair
                .push(aged.tenant, Priority::Event.level(), entry, true);
        }
        let slots = &self.slots;
        self.aging.trim(|a| {
            let s = &slots[a.entry.slot as usize];
            s.queued == Some(resync) && s.seq == a.entry.seq
        });
    }

    /// Hand out the next key, or `None` if nothing is ready, the global cap is reached, or
    /// the queue is shut down.
    pub fn pop(&mut self, now: &mut Now) -> Option<Dispatch> {
        if self.closed {
            return None;
        }
        self.fire_delays(now);
        if self.in_flight >= self.config.max_in_flight || self.queued == 0 {
            return None;
        }
        self.promote_aged(now);
        // The last workers are kept for changes of tenants with nothing in flight (the **Caps** rule
        // of `queue`'s module docs): event work only.
        let reserved =
            self.in_flight + self.config.effective_idle_reserve() >= self.config.max_in_flight;
        let levels = if reserved { 0..1 } else { 0..LEVELS };
        for level in levels {
            let slots = &self.slots;
            let valid = |e: Entry| {
                let s = &slots[e.slot as usize];
                s.queued == Some(level) && s.seq == e.seq
            };
            let popped = if reserved {
                self.fair.pop_for_idle(level, valid)
            } else {
                self.fair.pop(level, valid)
            };
            if let Some((tenant, entry)) = popped {
                let slot = &mut self.slots[entry.slot as usize];
                slot.queued = None;
                slot.in_flight = true;
                slot.hold = None;
                self.queued -= 1;
                self.in_flight += 1;
                if let Some(m) = &self.metrics {
                    m.depth.dec();
                    m.queue_duration.observe(
                        now.get()
                            .saturating_duration_since(slot.enqueued_at)
                            .as_secs_f64(),
                    );
                }
                return Some(Dispatch {
                    slot: entry.slot,
                    key: slot.key.clone(),
                    tenant: self.fair.name(tenant).clone(),
                    priority: Priority::from_level(level),
                    weight: self.fair.weight(tenant),
                });
            }
        }
        None
    }

    /// Rule 2: the worker holding `slot` is done; a key added meanwhile is queued again.
    ///
    /// With `retry = Some(delay)` the reconcile failed: the key is queued again at event
    /// priority once `delay` has passed and backs off until then — adds meanwhile (including
    /// one that made it dirty while in flight) are folded into the retry, except a forced add
    /// (the primary's spec changed), which queues it at once, and a repair add, which does
    /// at most once per [`REPAIR_SPACING`]. An attempt a repair add started early that fails
    /// waits no longer than the retry it replaced. Returns whether the slot was in flight
    /// (false means a double done, ignored).
    pub fn done(&mut self, slot: u32, retry: Option<Duration>, now: &mut Now) -> bool {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return false;
        };
        if !s.live || !s.in_flight {
            return false;
        }
        s.in_flight = false;
        let tenant = s.tenant;
        let dirty = s.dirty.take();
        let forced = std::mem::take(&mut s.dirty_forced);
        let repair = std::mem::take(&mut s.dirty_repair);
        // An attempt started early by a repair add that fails waits no longer than the retry it
        // replaced.
        let resume = s.resume.take();
        self.in_flight -= 1;
        self.fair.finish(tenant);
        let spec_changed = forced && dirty.is_some();
        let retry = match (retry, resume) {
            (Some(delay), Some(resume)) => {
                Some(delay.min(resume.saturating_duration_since(now.get())))
            }
            (retry, _) => retry,
        };
        // A child deleted during a failing attempt: retried at once, as a repair add would.
        let repaired = repair
            && dirty.is_some()
            && !spec_changed
            && retry.is_some_and(|d| !d.is_zero())
            && (self.slots[slot as usize].repaired_at)
                .is_none_or(|t| now.get() >= t + REPAIR_SPACING);
        if repaired {
            let at = now.get();
            let s = &mut self.slots[slot as usize];
            s.repaired_at = Some(at);
            s.resume = retry.map(|d| at + d);
        }
        if !self.closed {
            match (retry, dirty) {
                (Some(delay), _) if !spec_changed && !repaired && !delay.is_zero() => {
                    let until = now.get() + delay;
                    let s = &mut self.slots[slot as usize];
                    s.hold = Some(until);
                    // The retry replaces any pending delay: nothing fires before it.
                    s.delay = None;
                    self.merge_delay(slot, until, Priority::Event);
                }
                (Some(_), None) => {
                    self.enqueue(slot, Priority::Event, now, false);
                }
                (_, Some(priority)) => {
                    let priority = if retry.is_some() {
                        Priority::Event
                    } else {
                        priority
                    };
                    self.enqueue(slot, priority, now, false);
                }
                (None, None) => {}
            }
        }
        self.fire_delays(now);
        self.release_if_idle(slot);
        true
    }

    /// Whether a worker may get a key right now: ready work under the global cap (a tenant at
    /// its cap, or the idle reserve, may still hold it back).
    pub fn has_ready(&self) -> bool {
        !self.closed && self.queued > 0 && self.in_flight < self.config.max_in_flight
    }

    /// Keys ready to be handed out (not delayed, not in flight); call [`Core::fire_due`]
    /// first to count keys whose delay has passed.
    pub fn len(&self) -> usize {
        self.queued
    }

    /// Tenants the queue tracks (those some key refers to, plus any given a weight since).
    pub fn tenants(&self) -> usize {
        self.fair.tenants()
    }

    /// Keys currently handed to workers.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Keys of `tenant` in flight (0 for an unknown tenant).
    pub fn tenant_in_flight(&self, tenant: &TenantKey) -> usize {
        self.tenant_index(tenant)
            .map_or(0, |&id| self.fair.in_flight(id))
    }

    /// Ready keys of `tenant` at `priority` (0 for an unknown tenant).
    pub fn tenant_queued(&self, tenant: &TenantKey, priority: Priority) -> usize {
        self.tenant_index(tenant)
            .map_or(0, |&id| self.fair.queued(id, priority.level()))
    }

    fn tenant_index(&self, tenant: &TenantKey) -> Option<&u32> {
        self.fair.lookup(tenant)
    }

    /// Stop handing out keys; drop queued, dirty and delayed work and return the dropped
    /// keys (sorted) plus the keys still in flight.
    pub fn close(&mut self) -> (Vec<ObjectKey>, Vec<ObjectKey>) {
        self.closed = true;
        let mut dropped = Vec::new();
        let mut in_flight = Vec::new();
        for slot in self.slots.iter_mut().filter(|s| s.live) {
            // A pending resync timer is not dropped work: every process resyncs all objects
            // after its first list anyway; retries and requeues are.
            let delayed_work = slot.delay.is_some_and(|(_, p)| p == Priority::Event);
            if slot.queued.is_some() || slot.dirty.is_some() || delayed_work {
                dropped.push(slot.key.clone());
            }
            if slot.in_flight {
                in_flight.push(slot.key.clone());
            }
            slot.queued = None;
            slot.dirty = None;
            slot.dirty_forced = false;
            slot.dirty_repair = false;
            slot.hold = None;
            slot.delay = None;
        }
        if let Some(m) = &self.metrics {
            m.depth.set(0);
        }
        self.queued = 0;
        self.fair.clear_queues();
        self.aging.clear();
        self.delays.clear();
        let idle: Vec<u32> = (0..self.slots.len())
            .filter(|&i| self.slots[i].live && self.slots[i].idle())
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
        for id in idle {
            self.release_if_idle(id);
        }
        dropped.sort();
        in_flight.sort();
        (dropped, in_flight)
    }

    /// The keys in flight, sorted.
    pub fn in_flight_keys(&self) -> Vec<ObjectKey> {
        let mut keys: Vec<ObjectKey> = self
            .slots
            .iter()
            .filter(|s| s.live && s.in_flight)
            .map(|s| s.key.clone())
            .collect();
        keys.sort();
        keys
    }

    /// Drop the waiting work of `key` (queued, delayed, backing off, or the dirty mark of an
    /// in-flight key): its object is gone. Returns whether anything was dropped.
    pub fn remove(&mut self, key: &ObjectKey) -> bool {
        let Some(&id) = self.index.get(key) else {
            return false;
        };
        let slot = &mut self.slots[id as usize];
        let mut dropped = slot.delay.take().is_some() | slot.dirty.take().is_some();
        slot.dirty_forced = false;
        slot.dirty_repair = false;
        slot.hold = None;
        if let Some(level) = slot.queued.take() {
            dropped = true;
            let tenant = slot.tenant;
            self.queued -= 1;
            if let Some(m) = &self.metrics {
                m.depth.dec();
            }
            self.fair.forget(tenant, level);
        }
        self.release_if_idle(id);
        dropped
    }

    /// Whether [`Core::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}
