//! The engine's own writes of children, remembered so that the controller's child watches can
//! tell the events of our writes from changes made by others (controller-runtime's
//! "expectations": a controller does not reconcile what it just wrote itself).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::key::ObjectKey;

/// More children with unseen own writes than this are forgotten at once (forgetting only costs
/// a redundant reconcile).
const CAP: usize = 10_000;

/// Unseen own versions kept per child (a watch that skipped versions leaves older ones behind).
const PER_CHILD: usize = 8;

/// How long a watch event waits for a write of the same child that is still in flight before
/// it is treated as someone else's change.
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a watch event of a child is, as far as our own writes tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Its `resourceVersion` is one our own write returned.
    Ours,
    /// Not ours so far, but a write of ours to the same child is in flight: its answer may be
    /// this very version (the watch may deliver an event before the writer gets its answer).
    Pending,
    /// Someone else's change (or one we cannot attribute).
    Other,
}

#[derive(Default)]
struct Inner {
    /// `resourceVersion`s our writes returned that the watch has not seen yet, per child.
    written: HashMap<ObjectKey, Vec<u64>>,
    /// Writes in flight, per child.
    pending: HashMap<ObjectKey, usize>,
}

/// The record of our writes; shared by the [`ChildCaches`](super::ChildCaches) clones.
pub(crate) struct OwnWrites {
    inner: Mutex<Inner>,
    /// Bumped whenever a write in flight ends.
    settled: watch::Sender<u64>,
}

impl Default for OwnWrites {
    fn default() -> Self {
        Self {
            inner: Mutex::default(),
            settled: watch::Sender::new(0),
        }
    }
}

/// A write in flight; dropping it (after [`OwnWrites::wrote`], or on error or cancellation)
/// ends it.
pub(crate) struct InFlight {
    writes: Arc<OwnWrites>,
    key: ObjectKey,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.writes.inner.lock()
            && let Some(n) = inner.pending.get_mut(&self.key)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                inner.pending.remove(&self.key);
            }
        }
        self.writes.settled.send_modify(|n| *n = n.wrapping_add(1));
    }
}

impl OwnWrites {
    /// Marks a write of `key` as in flight until the returned guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>, key: &ObjectKey) -> InFlight {
        if let Ok(mut inner) = self.inner.lock() {
            *inner.pending.entry(key.clone()).or_default() += 1;
        }
        InFlight {
            writes: Arc::clone(self),
            key: key.clone(),
        }
    }

    /// Remembers that our write of `key` returned `resource_version`.
    pub(crate) fn wrote(&self, key: &ObjectKey, resource_version: u64) {
        if let Ok(mut inner) = self.inner.lock() {
            if inner.written.len() >= CAP && !inner.written.contains_key(key) {
                inner.written.clear();
            }
            let versions = inner.written.entry(key.clone()).or_default();
            if versions.len() >= PER_CHILD {
                versions.remove(0);
            }
            versions.push(resource_version);
        }
    }

    /// What the watch event of `key` at `resource_version` is; a version of ours is forgotten
    /// once seen. Older versions are not: an event waiting in [`OwnWrites::settle`] may still
    /// ask for one.
    pub(crate) fn observe(&self, key: &ObjectKey, resource_version: u64) -> Origin {
        let Ok(mut inner) = self.inner.lock() else {
            return Origin::Other;
        };
        let mut ours = false;
        if let Some(versions) = inner.written.get_mut(key) {
            let before = versions.len();
            versions.retain(|v| *v != resource_version);
            ours = versions.len() < before;
            if versions.is_empty() {
                inner.written.remove(key);
            }
        }
        if ours {
            Origin::Ours
        } else if inner.pending.contains_key(key) {
            Origin::Pending
        } else {
            Origin::Other
        }
    }

    /// Waits until no write of `key` is in flight (at most [`SETTLE_TIMEOUT`]), then tells
    /// whether `resource_version` was one of ours.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub(crate) async fn settle(&self, key: &ObjectKey, resource_version: u64) -> Origin {
        let mut rx = self.settled.subscribe();
        let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
        loop {
            match self.observe(key, resource_version) {
                Origin::Pending => {}
                origin => return origin,
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Origin::Other;
            }
        }
    }

    /// Forgets the writes of `key` (deleted).
    pub(crate) fn forget(&self, key: &ObjectKey) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.written.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ObjectKey {
        ObjectKey::namespaced("ConfigMap", "ns", "c")
    }

    #[test]
    fn our_versions_are_recognised_once_in_any_order() {
        let w = Arc::new(OwnWrites::default());
        w.wrote(&key(), 10);
        w.wrote(&key(), 12);
        assert_eq!(w.observe(&key(), 9), Origin::Other);
        assert_eq!(w.observe(&key(), 11), Origin::Other, "someone else's");
        // Two deferred events may settle out of order.
        assert_eq!(w.observe(&key(), 12), Origin::Ours);
        assert_eq!(w.observe(&key(), 10), Origin::Ours);
        assert_eq!(w.observe(&key(), 12), Origin::Other, "seen once");
        for rv in 100..120 {
            w.wrote(&key(), rv);
        }
        assert_eq!(
            w.observe(&key(), 100),
            Origin::Other,
            "only the last few are kept"
        );
        assert_eq!(w.observe(&key(), 119), Origin::Ours);
        w.wrote(&key(), 20);
        w.forget(&key());
        assert_eq!(w.observe(&key(), 20), Origin::Other);
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_racing_a_write_in_flight_waits_for_its_answer() {
        let w = Arc::new(OwnWrites::default());
        let guard = w.begin(&key());
        assert_eq!(w.observe(&key(), 5), Origin::Pending);
        let waiter = {
            let w = Arc::clone(&w);
            tokio::spawn(async move { w.settle(&key(), 5).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "waits while the write is in flight");
        w.wrote(&key(), 5);
        drop(guard);
        assert_eq!(waiter.await.unwrap(), Origin::Ours);

        // A write that fails (no version remembered) makes the event someone else's.
        let guard = w.begin(&key());
        let waiter = {
            let w = Arc::clone(&w);
            tokio::spawn(async move { w.settle(&key(), 6).await })
        };
        tokio::task::yield_now().await;
        drop(guard);
        assert_eq!(waiter.await.unwrap(), Origin::Other);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_never_ends_stops_the_wait_after_the_timeout() {
        let w = Arc::new(OwnWrites::default());
        let _stuck = w.begin(&key());
        let start = tokio::time::Instant::now();
        assert_eq!(w.settle(&key(), 5).await, Origin::Other);
        assert_eq!(start.elapsed(), SETTLE_TIMEOUT);
    }
}
