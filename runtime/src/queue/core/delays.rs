//! Delayed adds: one pending delay per key (the earliest deadline, the highest priority),
//! clamped to the end of a backoff wait, fired by every queue operation.

use std::cmp::Reverse;

use tokio::time::{Duration, Instant};

use super::{AddOutcome, Core, Now};
use crate::key::{ObjectKey, TenantKey};
use crate::queue::Priority;

impl Core {
    /// Rule 3: add `key` once `delay` has passed. A key keeps one pending delay: the earlier
    /// deadline with the higher priority of the two. A key already queued or dirty at least
    /// at `priority` is not delayed further; one queued or dirty at a lower priority keeps the
    /// delay, which raises it when it fires. While the key backs off, the deadline is at
    /// least the end of the backoff wait.
    pub fn add_after(
        &mut self,
        key: &ObjectKey,
        tenant: &TenantKey,
        delay: Duration,
        priority: Priority,
        now: &mut Now,
    ) -> AddOutcome {
        if delay.is_zero() {
            return self.add(key, tenant, priority, super::Bypass::Never, now);
        }
        if self.closed {
            return AddOutcome::Closed;
        }
        self.fire_delays(now);
        let id = self.slot_for(key, tenant);
        let mut deadline = now.get() + delay;
        if let Some(hold) = self.slots[id as usize].hold {
            deadline = deadline.max(hold);
        }
        let outcome = self.merge_delay(id, deadline, priority);
        self.release_if_idle(id);
        outcome
    }

    /// Record a delayed add at `deadline` into the slot's single pending delay.
    pub(super) fn merge_delay(
        &mut self,
        id: u32,
        deadline: Instant,
        priority: Priority,
    ) -> AddOutcome {
        let slot = &mut self.slots[id as usize];
        let waiting = slot
            .queued
            .map(Priority::from_level)
            .into_iter()
            .chain(slot.dirty)
            .max();
        if waiting.is_some_and(|p| p >= priority) {
            return AddOutcome::Deduped;
        }
        let merged = match slot.delay {
            None => (deadline, priority),
            Some((d, p)) => (d.min(deadline), p.max(priority)),
        };
        if slot.delay == Some(merged) {
            return AddOutcome::Deduped;
        }
        let earlier = slot.delay.is_none_or(|(d, _)| merged.0 < d);
        slot.delay = Some(merged);
        slot.delay_gen = slot.delay_gen.wrapping_add(1);
        self.delays.push(Reverse((merged.0, id, slot.delay_gen)));
        if earlier {
            AddOutcome::Queued
        } else {
            AddOutcome::Deduped
        }
    }

    /// Fire every delay due at `now`.
    pub(super) fn fire_delays(&mut self, now: &mut Now) {
        while let Some(&Reverse((deadline, id, generation))) = self.delays.peek() {
            if deadline > now.get() {
                break;
            }
            self.delays.pop();
            let slot = &mut self.slots[id as usize];
            if !slot.live || slot.delay_gen != generation {
                continue;
            }
            let Some((_, priority)) = slot.delay.take() else {
                continue;
            };
            slot.hold = None; // a delay never fires before the backoff wait ends
            if self.add_slot(id, priority, super::Bypass::Never, now) != AddOutcome::Deduped
                && let Some(m) = &self.metrics
            {
                m.adds.inc();
            }
        }
    }

    /// The earliest pending delay deadline, for the async waiter's timer.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&Reverse((deadline, id, generation))) = self.delays.peek() {
            let s = &self.slots[id as usize];
            if s.live && s.delay_gen == generation && s.delay.is_some() {
                return Some(deadline);
            }
            self.delays.pop();
        }
        None
    }

    /// Queue every key whose delay has passed at `now` (so counts include them).
    pub fn fire_due(&mut self, now: &mut Now) {
        if !self.closed {
            self.fire_delays(now);
        }
    }
}
