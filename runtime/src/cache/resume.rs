//! What a watch leaves for the next run of its controller on the same caches (after a shard
//! ring change): its store, the resourceVersion the store is complete to, and the buckets its
//! selector held.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::CompactStore;
use crate::shard::Ranges;

/// One watch's store (`S`: a child kind's [`CompactStore`], a primary kind's reflector store)
/// and how far it is complete, kept in its [`super::ChildCaches`] for the watch of the same kind
/// in the next run.
pub(crate) struct Resume<S = Arc<CompactStore>> {
    /// The watch's store.
    pub(crate) store: S,
    /// The buckets its selector held.
    pub(crate) buckets: Ranges,
    /// The resourceVersion the store holds every change up to (a watch started from it misses
    /// none); 0 while unknown (no list complete yet, or a relist under way).
    complete_to: AtomicU64,
}

impl<S> Resume<S> {
    /// `store`, of the watch of the objects in `buckets`, complete to no version yet.
    pub(crate) fn new(store: S, buckets: Ranges) -> Self {
        Self {
            store,
            buckets,
            complete_to: AtomicU64::new(0),
        }
    }

    /// The store holds every change up to `rv` (`None`: unknown).
    pub(crate) fn complete_to(&self, rv: Option<u64>) {
        self.complete_to.store(rv.unwrap_or(0), Ordering::Release);
    }

    /// The resourceVersion the store is complete to, if known.
    pub(crate) fn version(&self) -> Option<u64> {
        Some(self.complete_to.load(Ordering::Acquire)).filter(|rv| *rv > 0)
    }
}
