//! Shutdown: what was dropped and what was still running when the queue stopped.

use crate::key::ObjectKey;

/// The outcome of [`WorkQueue::shutdown`](super::WorkQueue::shutdown).
///
/// After shutdown no key is handed out again; adds are ignored. Work that was queued,
/// delayed (a retry or requeue), or added again while in flight is dropped and listed here so
/// the caller can log it (the next leader or process will resync it anyway). An idle key
/// whose only pending work is its periodic resync timer is not listed: nothing was lost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Keys that were waiting (queued, delayed at event priority, or dirty) and will not be
    /// handed out; sorted. Pending resync timers are not counted.
    pub dropped: Vec<ObjectKey>,
    /// Keys that were in flight when shutdown began; sorted.
    pub in_flight_at_start: Vec<ObjectKey>,
    /// Keys still in flight when the grace deadline passed (their workers did not call done
    /// in time); sorted. Empty when every worker finished within the deadline.
    pub abandoned: Vec<ObjectKey>,
}

impl ShutdownReport {
    /// Whether every in-flight key finished within the deadline.
    pub fn drained(&self) -> bool {
        self.abandoned.is_empty()
    }
}
