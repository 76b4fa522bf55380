//! The Event budget of each object, and of each tenant: a burst, then one Event per interval,
//! so that what an object's owner does (edits, deletions, forged claimants) cannot have the
//! controller write Events about it without bound, nor a tenant with many objects.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Objects whose budgets are remembered at most; at the cap, the budgets that are full again
/// (the same as a new one) are forgotten, and if that frees nothing all are: at most one more
/// burst per object, in memory bounded whatever the number of objects.
pub(crate) const BUDGET_OBJECTS_CAP: usize = 10_000;

/// One object's budget.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Events it may publish now.
    tokens: u32,
    /// When `tokens` was last brought up to date.
    at: Instant,
    /// Events held back since the last one published.
    held: u64,
}

/// Per object (by uid), at most `burst` Events at once, then one per `every`: a token bucket
/// as client-go's Event spam filter keeps per involved object.
#[derive(Debug)]
pub(crate) struct EventBudget {
    burst: u32,
    every: Duration,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl EventBudget {
    /// A budget of `burst` Events per object, then one per `every` (a zero `every` holds
    /// nothing back).
    pub(crate) fn new(burst: u32, every: Duration) -> Self {
        Self {
            burst,
            every,
            buckets: Mutex::default(),
        }
    }

    /// Events an object may publish at once.
    pub(crate) fn burst(&self) -> u32 {
        self.burst
    }

    /// The interval that earns an object one more Event.
    pub(crate) fn every(&self) -> Duration {
        self.every
    }

    /// Whether an Event about `object` may be published at `now`: `Some(held)` (with the
    /// number of its Events held back since its last one, for the note to say) takes one from
    /// its budget; `None` holds this one back and counts it.
    pub(crate) fn take(&self, object: &str, now: Instant) -> Option<u64> {
        if self.every.is_zero() {
            return Some(0);
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if !buckets.contains_key(object) && buckets.len() >= BUDGET_OBJECTS_CAP {
            buckets.retain(|_, b| !self.full(b, now));
            if buckets.len() >= BUDGET_OBJECTS_CAP {
                buckets.clear();
            }
        }
        let bucket = buckets.entry(object.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
            held: 0,
        });
        self.refill(bucket, now);
        if bucket.tokens == 0 {
            bucket.held += 1;
            return None;
        }
        bucket.tokens -= 1;
        Some(std::mem::take(&mut bucket.held))
    }

    /// Adds the tokens `every` has earned `bucket` since it was last brought up to date.
    fn refill(&self, bucket: &mut Bucket, now: Instant) {
        let elapsed = now.saturating_duration_since(bucket.at);
        let earned = elapsed.as_nanos() / self.every.as_nanos();
        if bucket
            .tokens
            .saturating_add(u32::try_from(earned).unwrap_or(u32::MAX))
            >= self.burst
        {
            bucket.tokens = self.burst;
            bucket.at = now;
        } else {
            // Below the burst: `earned` fits in a u32 and the remainder keeps counting.
            let earned = u32::try_from(earned).unwrap_or(u32::MAX);
            bucket.tokens += earned;
            bucket.at += self.every * earned;
        }
    }

    /// Whether `bucket` is as a new one would be at `now` (full, nothing held back).
    fn full(&self, bucket: &Bucket, now: Instant) -> bool {
        let mut b = *bucket;
        self.refill(&mut b, now);
        b.tokens >= self.burst && b.held == 0
    }

    /// Gives back the token a [`take`](Self::take) about `object` took, when the Event was
    /// held back after all (its tenant's budget was spent): the object's next Event counts it
    /// among those held back, with the `held` that take returned.
    pub(crate) fn give_back(&self, object: &str, held: u64) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(object) {
            bucket.tokens = (bucket.tokens + 1).min(self.burst);
            bucket.held += held + 1;
        }
    }

    /// The objects whose budgets are remembered.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.buckets.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: Duration = Duration::from_secs(300);

    #[test]
    fn a_burst_then_one_per_interval_and_the_next_one_counts_those_held_back() {
        let budget = EventBudget::new(3, EVERY);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(budget.take("a", t0), Some(0));
        }
        assert_eq!(budget.take("a", t0), None);
        assert_eq!(budget.take("a", t0 + EVERY / 2), None);
        // Another object has a budget of its own.
        assert_eq!(budget.take("b", t0), Some(0));
        // One interval later, one more, saying how many were held back.
        assert_eq!(budget.take("a", t0 + EVERY), Some(2));
        assert_eq!(budget.take("a", t0 + EVERY), None);
        // Two intervals later, two more; the remainder of an interval is not lost.
        let later = t0 + EVERY * 3 + EVERY / 2;
        assert_eq!(budget.take("a", later), Some(1));
        assert_eq!(budget.take("a", later), Some(0));
        assert_eq!(budget.take("a", later), None);
        assert_eq!(budget.take("a", t0 + EVERY * 4), Some(1));
        // Long idle: back to the whole burst, not more.
        let idle = t0 + EVERY * 100;
        for _ in 0..3 {
            assert!(budget.take("a", idle).is_some());
        }
        assert_eq!(budget.take("a", idle), None);
    }

    #[test]
    fn a_zero_burst_holds_every_event_back_and_a_zero_interval_none() {
        let none = EventBudget::new(0, EVERY);
        assert_eq!(none.take("a", Instant::now()), None);
        let all = EventBudget::new(0, Duration::ZERO);
        for _ in 0..100 {
            assert_eq!(all.take("a", Instant::now()), Some(0));
        }
    }

    #[test]
    fn a_token_given_back_is_taken_again_and_counted_as_held_back() {
        let budget = EventBudget::new(1, EVERY);
        let t0 = Instant::now();
        assert_eq!(budget.take("a", t0), Some(0));
        assert_eq!(budget.take("a", t0), None);
        let later = t0 + EVERY;
        let held = budget.take("a", later).expect("refilled");
        assert_eq!(held, 1);
        budget.give_back("a", held);
        assert_eq!(
            budget.take("a", later),
            Some(2),
            "the one given back and the one before"
        );
        assert_eq!(budget.take("a", later), None, "never more than the burst");
    }

    #[test]
    fn memory_stays_bounded_whatever_the_number_of_objects() {
        let budget = EventBudget::new(2, EVERY);
        let t0 = Instant::now();
        // Objects whose budgets are in use stay remembered up to the cap.
        for i in 0..BUDGET_OBJECTS_CAP {
            budget.take(&format!("busy-{i}"), t0);
        }
        assert_eq!(budget.remembered(), BUDGET_OBJECTS_CAP);
        // Full again an interval later: forgotten when a new object needs room.
        let later = t0 + EVERY;
        budget.take("new", later);
        assert_eq!(budget.remembered(), 1);
        // At the cap with every budget in use, all are forgotten rather than growing.
        for i in 0..BUDGET_OBJECTS_CAP * 2 {
            let object = format!("flood-{i}");
            budget.take(&object, later);
            budget.take(&object, later);
            assert!(budget.remembered() <= BUDGET_OBJECTS_CAP);
        }
    }
}
