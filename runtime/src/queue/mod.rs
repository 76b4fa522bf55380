//! A per-tenant fair work queue: deduplicating, one key in flight at a time, delayed adds,
//! event-before-resync priorities with aging, global and per-tenant caps, graceful shutdown.
//!
//! # Rules
//! 1. **Dedupe**: adding a key that is already waiting does not queue it twice.
//! 2. **One in flight**: a key handed out by [`WorkQueue::get`] is not handed out again until
//!    its [`Lease`] is done; an add meanwhile marks it dirty and it comes back once, after done.
//! 3. **Delays**: of several pending [`WorkQueue::add_after`] for one key the earliest wins; an
//!    immediate add supersedes any pending delay (it is the earliest of all).
//! 4. **Fairness**: tenants are scheduled by Deficit Round Robin (Shreedhar & Varghese, 1995)
//!    with the tenant's weight as quantum and unit cost per dispatch. Bounds: with
//!    tenants backlogged, dispatches split exactly by weight per round; a tenant that becomes
//!    ready waits for at most the sum of the weights of the backlogged tenants ahead of it.
//! 5. **Priorities**: [`Priority::Event`] before [`Priority::Resync`]; a resync key waiting
//!    longer than [`QueueConfig::resync_max_wait`] is promoted (aging).
//! 6. **Caps**: at most [`QueueConfig::max_in_flight`] keys in flight in total and
//!    [`QueueConfig::per_tenant_cap`] per tenant.
//! 7. **Shutdown**: [`WorkQueue::shutdown`] stops handing out keys, waits for in-flight work up
//!    to a deadline and reports what was dropped.
//!
//! A key keeps the tenant it was first added with while it is queued, in flight or delayed.

pub(crate) mod core;
pub(crate) mod fair;
mod priority;
mod shutdown;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::{Duration, Instant};

pub use self::core::AddOutcome;
use self::core::{Core, Now};
pub use self::priority::Priority;
pub use self::shutdown::ShutdownReport;
use crate::key::{ObjectKey, TenantKey};
pub use crate::metrics::QueueMetrics;

/// Limits of a [`WorkQueue`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    /// Most keys in flight at once across all tenants (the worker count). Default 10.
    pub max_in_flight: usize,
    /// Most keys of one tenant in flight at once, so one tenant cannot hold every worker.
    /// Default 2.
    pub per_tenant_cap: usize,
    /// How long a resync key may wait behind event work before it is served as event work
    /// (aging). Default 60 s.
    pub resync_max_wait: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 10,
            per_tenant_cap: 2,
            resync_max_wait: Duration::from_secs(60),
        }
    }
}

/// Errors of the work queue.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueError {
    /// `max_in_flight` was 0: no key could ever be handed out.
    #[error("queue max_in_flight must be at least 1")]
    ZeroMaxInFlight,
    /// `per_tenant_cap` was 0: no tenant could ever be served.
    #[error("queue per_tenant_cap must be at least 1")]
    ZeroTenantCap,
    /// A tenant weight of 0 was given: DRR needs a quantum of at least one dispatch.
    #[error("weight of tenant {0} must be at least 1")]
    ZeroWeight(TenantKey),
}

impl QueueConfig {
    /// Check the limits.
    ///
    /// # Errors
    /// [`QueueError::ZeroMaxInFlight`] or [`QueueError::ZeroTenantCap`] for a zero limit.
    pub fn validate(&self) -> Result<(), QueueError> {
        if self.max_in_flight == 0 {
            return Err(QueueError::ZeroMaxInFlight);
        }
        if self.per_tenant_cap == 0 {
            return Err(QueueError::ZeroTenantCap);
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Shared {
    core: Mutex<Core>,
    /// Wakes waiting workers: work became ready, a cap was released, or shutdown began.
    ready: Notify,
    /// Workers waiting in `get`; adds skip waking anyone when there are none.
    waiters: AtomicUsize,
    /// Wakes `shutdown` when a key finishes.
    finished: Notify,
    metrics: Option<Arc<QueueMetrics>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        // The core never panics while locked on valid input; tolerate poisoning anyway.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wake one waiting worker, if any. A worker registers in `waiters` before it checks the
    /// queue under the lock, and we read `waiters` after changing the queue under the lock,
    /// so a worker either sees the change or is counted here.
    fn wake_one(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.ready.notify_one();
        }
    }
}

/// The fair work queue; cheap to clone (all clones share one queue).
#[derive(Clone, Debug)]
pub struct WorkQueue {
    shared: Arc<Shared>,
}

impl WorkQueue {
    /// A queue with `config` and no metrics.
    ///
    /// # Errors
    /// See [`QueueConfig::validate`].
    pub fn new(config: QueueConfig) -> Result<Self, QueueError> {
        Self::build(config, None)
    }

    /// A queue that reports to `metrics` (see [`crate::metrics`]).
    ///
    /// # Errors
    /// See [`QueueConfig::validate`].
    pub fn with_metrics(config: QueueConfig, metrics: QueueMetrics) -> Result<Self, QueueError> {
        Self::build(config, Some(Arc::new(metrics)))
    }

    fn build(config: QueueConfig, metrics: Option<Arc<QueueMetrics>>) -> Result<Self, QueueError> {
        config.validate()?;
        Ok(Self {
            shared: Arc::new(Shared {
                core: Mutex::new(Core::new(config, metrics.clone())),
                ready: Notify::new(),
                waiters: AtomicUsize::new(0),
                finished: Notify::new(),
                metrics,
            }),
        })
    }

    /// Set `tenant`'s fair-share weight (its DRR quantum, in dispatches per round). Tenants
    /// start at weight 1.
    ///
    /// # Errors
    /// [`QueueError::ZeroWeight`] if `weight` is 0.
    pub fn set_weight(&self, tenant: &TenantKey, weight: u32) -> Result<(), QueueError> {
        if weight == 0 {
            return Err(QueueError::ZeroWeight(tenant.clone()));
        }
        self.shared.lock().set_weight(tenant, weight);
        Ok(())
    }

    /// Add `key` of `tenant` now (rules 1 and 2).
    pub fn add(&self, key: &ObjectKey, tenant: &TenantKey, priority: Priority) -> AddOutcome {
        let outcome = self
            .shared
            .lock()
            .add(key, tenant, priority, &mut Now::lazy());
        if outcome == AddOutcome::Queued {
            self.shared.wake_one();
        }
        outcome
    }

    /// Add `key` of `tenant` once `delay` has passed (rule 3). A zero delay is an immediate add.
    pub fn add_after(
        &self,
        key: &ObjectKey,
        tenant: &TenantKey,
        delay: Duration,
        priority: Priority,
    ) -> AddOutcome {
        let outcome = self
            .shared
            .lock()
            .add_after(key, tenant, delay, priority, &mut Now::lazy());
        if outcome == AddOutcome::Queued {
            // Waiting workers must re-arm their timer for the (maybe earlier) deadline.
            if self.shared.waiters.load(Ordering::SeqCst) > 0 {
                self.shared.ready.notify_waiters();
            }
        }
        outcome
    }

    /// Take the next ready key without waiting; `None` if nothing is ready, a cap is reached
    /// or the queue is shut down.
    pub fn try_get(&self) -> Option<Lease> {
        let mut core = self.shared.lock();
        let dispatch = core.pop(&mut Now::lazy())?;
        let more = core.has_ready();
        drop(core);
        if more {
            self.shared.wake_one();
        }
        Some(Lease {
            shared: Arc::clone(&self.shared),
            slot: dispatch.slot,
            key: dispatch.key,
            tenant: dispatch.tenant,
            priority: dispatch.priority,
            dispatched_at: self.shared.metrics.as_ref().map(|_| Instant::now()),
            released: false,
        })
    }

    /// Wait for the next key; `None` once the queue is shut down.
    ///
    /// # Cancel safety
    /// Cancel safe: a key is only taken from the queue when this returns it.
    pub async fn get(&self) -> Option<Lease> {
        self.shared.waiters.fetch_add(1, Ordering::SeqCst);
        let _registered = Unregister(&self.shared.waiters);
        loop {
            let notified = self.shared.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(lease) = self.try_get() {
                return Some(lease);
            }
            let deadline = {
                let mut core = self.shared.lock();
                if core.is_closed() {
                    return None;
                }
                core.next_deadline()
            };
            match deadline {
                Some(deadline) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Keys ready to be handed out now (delayed and in-flight keys are not counted).
    pub fn len(&self) -> usize {
        self.shared.lock().len()
    }

    /// Whether no key is ready to be handed out now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys in flight.
    pub fn in_flight(&self) -> usize {
        self.shared.lock().in_flight()
    }

    /// Keys of `tenant` in flight.
    pub fn tenant_in_flight(&self, tenant: &TenantKey) -> usize {
        self.shared.lock().tenant_in_flight(tenant)
    }

    /// Keys of `tenant` ready at `priority`.
    pub fn tenant_len(&self, tenant: &TenantKey, priority: Priority) -> usize {
        self.shared.lock().tenant_queued(tenant, priority)
    }

    /// The queue's metric handles, if it has any.
    pub fn metrics(&self) -> Option<&QueueMetrics> {
        self.shared.metrics.as_deref()
    }

    /// Rule 7: stop handing out keys (waiting [`WorkQueue::get`] calls return `None`), drop
    /// waiting work, then wait up to `grace` for in-flight keys to be done.
    ///
    /// # Cancel safety
    /// The queue is closed as soon as this is first polled; cancelling only stops the wait.
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        let deadline = Instant::now() + grace;
        let (dropped, in_flight_at_start) = self.shared.lock().close();
        self.shared.ready.notify_waiters();
        loop {
            let finished = self.shared.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            if self.shared.lock().in_flight() == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, finished).await.is_err() {
                break;
            }
        }
        ShutdownReport {
            dropped,
            in_flight_at_start,
            abandoned: self.shared.lock().in_flight_keys(),
        }
    }
}

/// A key handed to a worker. Call [`Lease::done`] when the reconcile is over; dropping the
/// lease (e.g. when the worker panics) is the same as done, so a key cannot stay in flight
/// forever.
#[derive(Debug)]
pub struct Lease {
    shared: Arc<Shared>,
    slot: u32,
    key: ObjectKey,
    tenant: TenantKey,
    priority: Priority,
    /// Dispatch time, kept only for the work-duration metric.
    dispatched_at: Option<Instant>,
    released: bool,
}

impl Lease {
    /// The key to reconcile.
    pub fn key(&self) -> &ObjectKey {
        &self.key
    }

    /// The tenant the key was queued under.
    pub fn tenant(&self) -> &TenantKey {
        &self.tenant
    }

    /// The priority it was served at (a promoted resync key reports [`Priority::Event`]).
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// The key is done: release it (rule 2). A key added meanwhile is queued again.
    pub fn done(mut self) {
        self.release();
    }

    fn release(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        let mut now = Now::lazy();
        let (requeued, closing) = {
            let mut core = self.shared.lock();
            core.done(self.slot, &mut now);
            (core.has_ready(), core.is_closed())
        };
        if let (Some(m), Some(at)) = (&self.shared.metrics, self.dispatched_at) {
            m.work_duration
                .observe(now.get().saturating_duration_since(at).as_secs_f64());
        }
        if requeued {
            self.shared.wake_one();
        }
        if closing {
            self.shared.finished.notify_waiters();
        }
    }
}

/// Decrements the waiting-worker count when a `get` returns or is cancelled.
struct Unregister<'a>(&'a AtomicUsize);

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release();
    }
}
