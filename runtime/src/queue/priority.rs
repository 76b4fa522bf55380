//! Priorities: event-driven work is served before anti-entropy resync work, with aging so
//! that resync work cannot starve.

use std::collections::VecDeque;

use tokio::time::{Duration, Instant};

use super::fair::Entry;

/// How urgent a piece of work is.
///
/// Event-driven work (a watch event, a requeue asked for by the reconcile, a retry after an
/// error) is always preferred over [`Priority::Resync`] work (the periodic anti-entropy pass),
/// except that resync work which has waited longer than
/// [`QueueConfig::resync_max_wait`](super::QueueConfig::resync_max_wait) is promoted to event
/// priority (aging), so a steady stream of events cannot starve it. This addresses
/// controller-runtime's priority queue starvation report (kubernetes-sigs/controller-runtime
/// #3496).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Priority {
    /// Anti-entropy resync: served only when no event work is ready, or once aged.
    Resync,
    /// Event-driven work: served first.
    #[default]
    Event,
}

impl Priority {
    /// The index of this priority's level in per-tenant queues (0 = served first).
    pub(crate) fn level(self) -> usize {
        match self {
            Priority::Event => 0,
            Priority::Resync => 1,
        }
    }

    /// The priority of a level index, the inverse of [`Priority::level`].
    pub(crate) fn from_level(level: usize) -> Self {
        if level == 0 {
            Priority::Event
        } else {
            Priority::Resync
        }
    }

    /// The label value used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Event => "event",
            Priority::Resync => "resync",
        }
    }
}

/// One resync entry waiting to be aged: where it lives and when it was enqueued.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AgingEntry {
    /// The queue entry at resync level.
    pub entry: Entry,
    /// The tenant index the entry is queued under.
    pub tenant: u32,
    /// When the entry was enqueued.
    pub since: Instant,
}

/// A FIFO of resync entries in enqueue order; since enqueue times only grow, the front is
/// always the oldest, so finding every aged entry costs O(aged).
#[derive(Debug, Default)]
pub(crate) struct Aging {
    fifo: VecDeque<AgingEntry>,
}

impl Aging {
    /// Remember a resync entry enqueued at `since`.
    pub fn push(&mut self, entry: AgingEntry) {
        self.fifo.push_back(entry);
    }

    /// Pop the oldest entry if it has waited at least `max_wait` at `now`. Entries may be stale
    /// (the key was dispatched or upgraded since); the caller checks validity.
    pub fn pop_aged(&mut self, now: Instant, max_wait: Duration) -> Option<AgingEntry> {
        let front = self.fifo.front()?;
        if now.saturating_duration_since(front.since) >= max_wait {
            self.fifo.pop_front()
        } else {
            None
        }
    }

    /// Whether no entry is remembered.
    pub fn is_empty(&self) -> bool {
        self.fifo.is_empty()
    }

    /// Drop every remembered entry (used at shutdown).
    pub fn clear(&mut self) {
        self.fifo.clear();
    }

    /// Drop stale entries from the front; keeps memory bounded when resync work is served
    /// normally (before aging).
    pub fn trim(&mut self, mut is_valid: impl FnMut(&AgingEntry) -> bool) {
        while let Some(front) = self.fifo.front() {
            if is_valid(front) {
                break;
            }
            self.fifo.pop_front();
        }
    }
}
