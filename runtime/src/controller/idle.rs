//! Gives the allocator's free pages back to the operating system once a controller's queue has
//! drained, so that what a burst of work allocated (a fill, a relist, a tenant's flood) does
//! not stay resident after it.
//!
//! glibc's allocator keeps freed memory in its arenas for the next allocation and returns only
//! the top of each heap by itself; the process's resident memory then follows its busiest
//! moment, never its present work. After a quiet period with nothing ready and nothing in
//! flight ([`ControllerConfig::release_memory_when_idle`](super::ControllerConfig)) a
//! controller asks it to return every free page (`malloc_trim`, on a blocking thread): once per
//! burst (a quiet controller asks nothing again), once the process's other releasing
//! controllers are drained too (the memory is the process's; the last to drain asks), and at
//! most once per [`MIN_GAP`]. Elsewhere than on Linux with glibc there is nothing to ask, and
//! no controller asks.

#![cfg_attr(
    not(all(target_os = "linux", target_env = "gnu")),
    allow(
        dead_code,
        reason = "only Linux with glibc can release; elsewhere nothing runs"
    )
)]

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::queue::WorkQueue;

/// The least time between two releases of one process: each walks every arena under its lock
/// and the pages it returns are faulted in again by the next allocations, so a controller that
/// polls (a hold re-checked every 2 s, resyncs spread by jitter) asks once per gap, not at each
/// poll.
///
/// The releases' clock is tokio's: a process whose controllers run on a runtime with paused
/// time shares [`PROCESS`] with that clock.
pub(crate) const MIN_GAP: Duration = Duration::from_secs(10);

/// The process's releasing controllers and its last release: the memory is the process's, so
/// it is released once all of them are drained, and at most once per [`MIN_GAP`].
#[derive(Debug)]
pub(crate) struct Releaser {
    queues: Mutex<Vec<(u64, WorkQueue)>>,
    next: AtomicU64,
    last: Mutex<Option<Instant>>,
    min_gap: Duration,
}

/// This process's [`Releaser`].
pub(crate) static PROCESS: LazyLock<Releaser> = LazyLock::new(|| Releaser::new(MIN_GAP));

/// How long a controller's release waits for the process's other releasing controllers to
/// drain before it asks anyway (one that never drains, say with a reconcile that hangs, must not
/// keep every other's memory).
pub(crate) const BUSY_LIMIT: Duration = Duration::from_secs(30);

/// Why the process did not release now.
enum NotNow {
    /// It released after the work was finished: that work's memory is back already.
    Done,
    /// Another releasing controller has work ready or in flight.
    Busy,
    /// The last release was less than the gap ago: not before this.
    Until(Instant),
}

impl Releaser {
    pub(crate) fn new(min_gap: Duration) -> Self {
        Self {
            queues: Mutex::default(),
            next: AtomicU64::new(0),
            last: Mutex::default(),
            min_gap,
        }
    }

    /// Counts `queue` among the process's until the registration is dropped.
    pub(crate) fn register(&self, queue: WorkQueue) -> Registration<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock_queues().push((id, queue));
        Registration { releaser: self, id }
    }

    fn lock_queues(&self) -> std::sync::MutexGuard<'_, Vec<(u64, WorkQueue)>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the turn to release now for work finished before `finished`: when no release
    /// followed that work yet, every registered queue is drained (unless `busy_ok`) and the gap
    /// has passed.
    fn begin(&self, finished: Instant, busy_ok: bool) -> Result<(), NotNow> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|at| at >= finished) {
            return Err(NotNow::Done);
        }
        if !busy_ok && !self.lock_queues().iter().all(|(_, q)| drained(q)) {
            return Err(NotNow::Busy);
        }
        let now = Instant::now();
        if let Some(at) = *last
            && now < at + self.min_gap
        {
            return Err(NotNow::Until(at + self.min_gap));
        }
        *last = Some(now);
        Ok(())
    }
}

/// A queue counted by a [`Releaser`]; dropping it forgets the queue.
pub(crate) struct Registration<'a> {
    releaser: &'a Releaser,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.releaser.lock_queues().retain(|(id, _)| *id != self.id);
    }
}

/// Nothing ready and nothing in flight (delayed keys, such as resyncs, are not work yet).
fn drained(queue: &WorkQueue) -> bool {
    queue.is_empty() && queue.in_flight() == 0
}

/// What the workers tell the idle task: a count of the keys they have finished.
#[derive(Debug, Default)]
pub(crate) struct Idle {
    finished: AtomicU64,
    notify: Notify,
}

impl Idle {
    /// A worker is done with a key.
    pub(crate) fn work_done(&self) {
        self.finished.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_one();
    }

    /// The keys finished so far.
    #[cfg(test)]
    pub(crate) fn finished_for_test(&self) -> u64 {
        self.finished.load(Ordering::Relaxed)
    }

    /// Each time `queue` has had nothing ready and nothing in flight for `quiet` after work
    /// was finished, calls `release` (counted in `releases`) once `releaser` agrees: not before
    /// the gap since the process's last release has passed; not while another releasing
    /// controller is busy, for up to [`BUSY_LIMIT`]; never when a release after the work
    /// covered it. Once per burst: no call without work finished since the last. Runs until
    /// dropped.
    ///
    /// # Cancel safety
    /// Cancel safe: it holds no lock across an await.
    pub(crate) async fn run<F, Fut>(
        &self,
        releaser: &Releaser,
        queue: &WorkQueue,
        quiet: Duration,
        releases: Counter,
        release: F,
    ) where
        F: Fn() -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut handled = None;
        loop {
            self.notify.notified().await;
            let mut busy_since = None;
            // The count last seen and when: the work it counts was finished before then.
            let mut counted: Option<(u64, Instant)> = None;
            loop {
                let seen = self.finished.load(Ordering::Relaxed);
                if handled == Some(seen) {
                    break;
                }
                let finished = match counted {
                    Some((n, at)) if n == seen => at,
                    _ => counted.insert((seen, Instant::now())).1,
                };
                tokio::time::sleep(quiet).await;
                if !drained(queue) {
                    // Busy: the next finished key wakes this task again.
                    break;
                }
                if self.finished.load(Ordering::Relaxed) != seen {
                    continue;
                }
                let busy_ok = busy_since.is_some_and(|at: Instant| at.elapsed() >= BUSY_LIMIT);
                match releaser.begin(finished, busy_ok) {
                    Ok(()) => {
                        release().await;
                        releases.inc();
                        handled = Some(seen);
                        break;
                    }
                    Err(NotNow::Done) => {
                        handled = Some(seen);
                        break;
                    }
                    // The busy one asks when it drains (then this one finds it `Done`).
                    Err(NotNow::Busy) => {
                        busy_since.get_or_insert_with(Instant::now);
                        tokio::time::sleep(releaser.min_gap).await;
                    }
                    Err(NotNow::Until(at)) => tokio::time::sleep_until(at).await,
                }
            }
        }
    }
}

/// Asks the allocator, on a blocking thread, to return its free pages to the operating system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) async fn release_free_memory() {
    let released = tokio::task::spawn_blocking(malloc_trim).await;
    tracing::debug!(?released, "asked the allocator to return its free pages");
}

/// glibc's `malloc_trim(0)`: every arena's free pages back to the operating system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn malloc_trim() -> bool {
    // SAFETY: `malloc_trim` takes no pointer and only walks the allocator's own arenas under
    // their locks; any thread may call it at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Whether this build can release memory at all (Linux with glibc); elsewhere no task runs.
pub(crate) const SUPPORTED: bool = cfg!(all(target_os = "linux", target_env = "gnu"));

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::TenantKey;
    use crate::key::ObjectKey;
    use crate::queue::{Priority, QueueConfig};

    const QUIET: Duration = Duration::from_millis(500);
    const GAP: Duration = Duration::from_secs(10);

    /// An idle task over `queue`, with `releaser`, counting its releases.
    fn start(queue: &WorkQueue, releaser: &'static Releaser) -> (Arc<Idle>, Arc<AtomicUsize>) {
        let idle = Arc::new(Idle::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let (task_idle, task_queue, task_calls) =
            (Arc::clone(&idle), queue.clone(), Arc::clone(&calls));
        tokio::spawn(async move {
            let release = || {
                task_calls.fetch_add(1, Ordering::SeqCst);
                async {}
            };
            (task_idle.run(releaser, &task_queue, QUIET, Counter::default(), release)).await;
        });
        (idle, calls)
    }

    async fn settle(d: Duration) {
        tokio::time::sleep(d).await;
        // Let the idle tasks run their due timers.
        tokio::task::yield_now().await;
    }

    fn queue() -> WorkQueue {
        WorkQueue::new(QueueConfig::default()).unwrap()
    }

    fn releaser() -> &'static Releaser {
        Box::leak(Box::new(Releaser::new(GAP)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_drained_queue_releases_once_per_burst_and_a_busy_one_never() {
        let releaser = releaser();
        let queue = queue();
        let _registered = releaser.register(queue.clone());
        let (idle, calls) = start(&queue, releaser);
        settle(QUIET * 3).await;
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

        // Nothing new: no second release, however long it stays quiet.
        idle.notify.notify_one();
        settle(GAP * 2).await;
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

        // A burst right after a release waits out the gap, then releases.
        idle.work_done();
        settle(QUIET * 2).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2, "within the gap");
        settle(GAP).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3, "after the gap");
    }

    #[tokio::test(start_paused = true)]
    async fn the_process_releases_once_when_its_last_busy_controller_drains() {
        let releaser = releaser();
        let (a, b) = (queue(), queue());
        let _ra = releaser.register(a.clone());
        let rb = releaser.register(b.clone());
        let (idle_a, calls_a) = start(&a, releaser);
        let (idle_b, calls_b) = start(&b, releaser);
        let calls = || calls_a.load(Ordering::SeqCst) + calls_b.load(Ordering::SeqCst);

        // b busy: a drains and leaves the release to b.
        b.add(
            &ObjectKey::cluster("Thing", "b"),
            &TenantKey::new("t"),
            Priority::Event,
        );
        let lease = b.try_get().unwrap();
        idle_a.work_done();
        settle(QUIET * 4).await;
        assert_eq!(calls(), 0, "another controller is busy");

        // b drains: one release for both.
        lease.done();
        idle_b.work_done();
        settle(QUIET * 2).await;
        assert_eq!(calls_b.load(Ordering::SeqCst), 1);
        assert_eq!(calls(), 1);
        settle(GAP * 2).await;
        assert_eq!(calls(), 1, "a's work was finished before b's release");

        // Both finish work together, past the gap: one release, not two.
        settle(GAP).await;
        idle_a.work_done();
        idle_b.work_done();
        settle(QUIET * 2).await;
        assert_eq!(calls(), 2, "one release per process");
        settle(GAP * 2).await;
        assert_eq!(calls(), 2, "the other's burst was released with it");

        // One that stays busy holds the others back for BUSY_LIMIT, not for good.
        b.add(
            &ObjectKey::cluster("Thing", "d"),
            &TenantKey::new("t"),
            Priority::Event,
        );
        let stuck = b.try_get().unwrap();
        settle(GAP).await;
        idle_a.work_done();
        settle(QUIET * 2).await;
        assert_eq!(calls(), 2, "b is busy");
        settle(BUSY_LIMIT + GAP).await;
        assert_eq!(calls(), 3, "b busy for longer than the limit");
        stuck.done();

        // A controller that stopped no longer holds the others back.
        b.add(
            &ObjectKey::cluster("Thing", "c"),
            &TenantKey::new("t"),
            Priority::Event,
        );
        let _held = b.try_get().unwrap();
        drop(rb);
        settle(GAP).await;
        idle_a.work_done();
        settle(QUIET * 2).await;
        assert_eq!(calls(), 4, "the stopped controller's queue is forgotten");
    }
}
