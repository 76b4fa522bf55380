//! Gives the allocator's free pages back to the operating system once a controller's queue has
//! drained, so that what a burst of work allocated (a fill, a relist, a tenant's flood) does
//! not stay resident after it.
//!
//! glibc's allocator keeps freed memory in its arenas for the next allocation and returns only
//! the top of each heap by itself; the process's resident memory then follows its busiest
//! moment, never its present work. After a quiet period with nothing ready and nothing in
//! flight ([`ControllerConfig::release_memory_when_idle`](super::ControllerConfig)) the
//! controller asks it to return every free page (`malloc_trim`), once per burst: a quiet
//! controller releases nothing again. Elsewhere than on Linux with glibc there is nothing to
//! ask, and the controller asks nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;

use crate::queue::WorkQueue;

/// What the workers tell the idle task: a count of the keys they have finished.
#[derive(Debug, Default)]
pub(crate) struct Idle {
    finished: AtomicU64,
    notify: Notify,
}

impl Idle {
    /// A worker is done with a key (or starts).
    pub(crate) fn work_done(&self) {
        self.finished.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_one();
    }

    /// Releases memory (`release`, counted in `releases`) each time `queue` has had nothing
    /// ready and nothing in flight for `quiet` after work was finished, once per burst.
    /// Runs until dropped.
    ///
    /// # Cancel safety
    /// Cancel safe: it holds nothing between its awaits.
    pub(crate) async fn run(
        &self,
        queue: &WorkQueue,
        quiet: Duration,
        releases: Counter,
        release: impl Fn() -> bool,
    ) {
        let mut released_at = None;
        loop {
            self.notify.notified().await;
            loop {
                let seen = self.finished.load(Ordering::Relaxed);
                if released_at == Some(seen) {
                    break;
                }
                tokio::time::sleep(quiet).await;
                let drained = queue.is_empty() && queue.in_flight() == 0;
                if drained && self.finished.load(Ordering::Relaxed) == seen {
                    release();
                    releases.inc();
                    released_at = Some(seen);
                    break;
                }
                if !drained {
                    // Busy: the next finished key wakes this task again.
                    break;
                }
            }
        }
    }
}

/// Asks the allocator to return its free pages to the operating system; whether it could.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub(crate) fn release_free_memory() -> bool {
    // SAFETY: `malloc_trim` takes no pointer and only walks the allocator's own arenas under
    // their locks; any thread may call it at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Asks the allocator to return its free pages to the operating system; whether it could.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release_free_memory() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::TenantKey;
    use crate::key::ObjectKey;
    use crate::queue::{Priority, QueueConfig};

    const QUIET: Duration = Duration::from_millis(500);

    /// The idle task over `queue`, counting its releases.
    fn start(queue: &WorkQueue) -> (Arc<Idle>, Arc<AtomicUsize>, Counter) {
        let idle = Arc::new(Idle::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = Counter::default();
        let (task_idle, task_queue, task_calls, task_counter) = (
            Arc::clone(&idle),
            queue.clone(),
            Arc::clone(&calls),
            counter.clone(),
        );
        tokio::spawn(async move {
            task_idle
                .run(&task_queue, QUIET, task_counter, || {
                    task_calls.fetch_add(1, Ordering::SeqCst);
                    true
                })
                .await;
        });
        (idle, calls, counter)
    }

    async fn settle(d: Duration) {
        tokio::time::sleep(d).await;
        // Let the idle task run its due timer.
        tokio::task::yield_now().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_drained_queue_releases_once_per_burst_and_a_busy_one_never() {
        let queue = WorkQueue::new(QueueConfig::default()).unwrap();
        let (idle, calls, counter) = start(&queue);
        tokio::task::yield_now().await;
        assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing was done yet");

        // A key in flight: finished work elsewhere does not release while it runs.
        let key = ObjectKey::cluster("Thing", "a");
        queue.add(&key, &TenantKey::new("t"), Priority::Event);
        let lease = queue.try_get().unwrap();
        idle.work_done();
        settle(QUIET * 3).await;
        assert_eq!(calls.load(Ordering::SeqCst), 0, "a key was in flight");

        // Done, and quiet for the period: one release.
        lease.done();
        idle.work_done();
        settle(QUIET * 2).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(counter.get(), 1);

        // Nothing new: no second release, however long it stays quiet.
        idle.work_done_without_work_for_test();
        settle(QUIET * 4).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "no work since the last release"
        );

        // Work again, each key finished before the period ends: one release after the last.
        for _ in 0..4 {
            idle.work_done();
            settle(QUIET / 2).await;
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "work kept coming");
        settle(QUIET * 2).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    impl Idle {
        /// A wake-up with no key finished (as a spurious notification would be).
        fn work_done_without_work_for_test(&self) {
            self.notify.notify_one();
        }
    }
}
