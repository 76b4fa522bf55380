//! A per-tenant fair work queue: deduplicating, one key in flight at a time, delayed adds,
//! event-before-resync priorities with aging, weighted fair sharing with a worker kept for
//! idle tenants' changes, backoff
//! that events cannot bypass, graceful shutdown.
//!
//! # Rules
//! 1. **Dedupe**: adding a key that is already waiting does not queue it twice; the waiting
//!    work keeps the higher of the two priorities.
//! 2. **One in flight**: a key handed out by [`WorkQueue::get`] is not handed out again until
//!    its [`Lease`] is done; an add meanwhile marks it dirty and it comes back once, after done.
//! 3. **Delays**: a key has at most one pending delay — of several [`WorkQueue::add_after`]
//!    the earliest deadline wins and it carries the highest priority asked for; an immediate
//!    add supersedes a pending delay of no higher priority.
//! 4. **Fairness**: tenants are scheduled by Start-time Fair Queuing with
//!    unit cost per dispatch (see `fair`). Under contention each
//!    backlogged tenant's share of dispatches is proportional to its weight, to within about
//!    one dispatch per tenant over any interval, however many of its keys are in flight; a
//!    tenant that becomes ready is served after at most one dispatch of each other active
//!    tenant, whatever their backlogs. The queue is work-conserving but for a reserve: a
//!    tenant alone may use every worker except the last [`QueueConfig::idle_reserve`]
//!    (default 1), which serve only event work of a tenant with nothing in flight — when its
//!    turn comes, or out of turn when one event key is all it has waiting (a lone change).
//!    Tenants with keys in flight are passed over and keep their place, so a tenant's change
//!    does not wait for busy tenants' backlogs to free a worker (it does wait behind a
//!    tenant with nothing in flight and a backlog whose turn is before its own). A change
//!    served out of turn is not charged to its tenant's share and does not move virtual
//!    time, so the bounds above hold for everyone else; a tenant with a backlog waits for its
//!    turn. The reserved workers stay idle while every tenant with ready work has keys in
//!    flight.
//! 5. **Priorities**: [`Priority::Event`] before [`Priority::Resync`]; a resync key waiting
//!    longer than [`QueueConfig::resync_max_wait`] is promoted (aging).
//! 6. **Caps**: at most [`QueueConfig::max_in_flight`] keys in flight in total, the last
//!    [`QueueConfig::idle_reserve`] of them for tenants with none in flight; a per-tenant
//!    cap ([`QueueConfig::per_tenant_cap`]) is an explicit option, off by default.
//! 7. **Shutdown**: [`WorkQueue::shutdown`] stops handing out keys, waits for in-flight work up
//!    to a deadline and reports what was dropped.
//! 8. **Backoff holds**: after [`Lease::retry_after`] the key waits out its backoff; adds
//!    meanwhile (child events, resyncs, requeues) are folded into the retry, and only
//!    [`WorkQueue::add_bypassing_backoff`] (a change of the object's own spec) ends the wait.
//!    [`WorkQueue::add_repairing`] (one of its children was deleted) ends it too, at most once
//!    per 10 s, so a failing reconcile that deletes its own children retries no more often;
//!    the early attempt, if it fails, waits no longer than the retry it replaced.
//! 9. **Forgetting**: a key with nothing left to do frees its slot (and its key); a tenant that
//!    no key refers to any more is forgotten with its `idem_tenant_*` metric series.
//!
//! A key keeps the tenant it was first added with while it is queued, in flight or delayed.
//! Counts ([`WorkQueue::len`], [`WorkQueue::tenant_len`], the depth gauges) include keys whose
//! delay has passed: every queue operation first queues the keys that are due.

pub(crate) mod core;
pub(crate) mod fair;
mod metrics;
mod priority;
mod shutdown;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::{Duration, Instant};

pub use self::core::AddOutcome;
use self::core::{Bypass, Core, Now};
pub(crate) use self::metrics::InFlight;
pub use self::metrics::QueueMetrics;
pub use self::priority::Priority;
pub use self::shutdown::ShutdownReport;
use crate::key::{ObjectKey, TenantKey};

/// Limits of a [`WorkQueue`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    /// Most keys in flight at once across all tenants (the worker count). Default 10.
    pub max_in_flight: usize,
    /// Most keys of one tenant in flight at once, if set. Default `None`: shares are enforced
    /// only under contention, and a tenant alone may use every worker but the
    /// [`idle_reserve`](QueueConfig::idle_reserve). A cap trades idle workers for a hard bound
    /// (e.g. for reconciles that load a tenant's own backend).
    pub per_tenant_cap: Option<usize>,
    /// How long a resync key may wait behind event work before it is served as event work
    /// (aging). Default 60 s.
    pub resync_max_wait: Duration,
    /// Workers kept for tenants with no key in flight: once only this many are free, only
    /// event work of a tenant with none in flight is handed out — at its turn, or out of
    /// turn when one event key is all it has waiting (a lone change) — so a tenant's change
    /// does not wait for busy tenants' backlogs to free a worker (the **Fairness** rule above). At
    /// most a quarter of `max_in_flight` is kept (none below 4 workers). Default 1; 0 makes the
    /// queue fully work-conserving (a tenant alone may use every worker).
    pub idle_reserve: usize,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 10,
            per_tenant_cap: None,
            resync_max_wait: Duration::from_secs(60),
            idle_reserve: 1,
        }
    }
}

/// Errors of the work queue.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueError {
    /// `max_in_flight` was 0: no key could ever be handed out.
    #[error("queue max_in_flight must be at least 1")]
    ZeroMaxInFlight,
    /// `per_tenant_cap` was `Some(0)`: no tenant could ever be served.
    #[error("queue per_tenant_cap must be at least 1 (or None for no cap)")]
    ZeroTenantCap,
    /// A tenant weight of 0 was given: a tenant's share must be positive.
    #[error("weight of tenant {0} must be at least 1")]
    ZeroWeight(TenantKey),
}

impl QueueConfig {
    /// The workers [`QueueConfig::idle_reserve`] keeps: at most a quarter of the workers.
    pub(crate) fn effective_idle_reserve(&self) -> usize {
        self.idle_reserve.min(self.max_in_flight / 4)
    }

    /// Check the limits.
    ///
    /// # Errors
    /// [`QueueError::ZeroMaxInFlight`] or [`QueueError::ZeroTenantCap`] for a zero limit.
    pub fn validate(&self) -> Result<(), QueueError> {
        if self.max_in_flight == 0 {
            return Err(QueueError::ZeroMaxInFlight);
        }
        if self.per_tenant_cap == Some(0) {
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

    /// Wake every waiting worker, so each re-arms its timer for a (maybe earlier) deadline.
    fn wake_all(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.ready.notify_waiters();
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

    /// Set `tenant`'s fair-share weight: under contention its share of dispatches is
    /// proportional to it. Tenants start at weight 1; the weight applies from the tenant's
    /// next dispatch and is forgotten with the tenant (when no key refers to it any more).
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

    /// Read each tenant's weight through `lookup` at every dispatch of that tenant, so a
    /// changed weight applies without anyone calling [`WorkQueue::set_weight`]; `None` (or
    /// 0) falls back to the weight set there. `lookup` runs under the queue's lock: it must
    /// be cheap and must not call into this queue (a cache read is the intended use).
    pub fn set_weight_lookup(
        &self,
        lookup: impl Fn(&TenantKey) -> Option<u32> + Send + Sync + 'static,
    ) {
        self.shared.lock().set_weight_lookup(Arc::new(lookup));
    }

    /// Add `key` of `tenant` now (rules 1–3). While the key backs off after a failed
    /// reconcile ([`Lease::retry_after`]), the add is folded into the pending retry (**Backoff holds** above).
    pub fn add(&self, key: &ObjectKey, tenant: &TenantKey, priority: Priority) -> AddOutcome {
        self.add_inner(key, tenant, priority, Bypass::Never)
    }

    /// [`WorkQueue::add`] that also ends the key's backoff wait: for a change of the object
    /// itself (its spec, i.e. `metadata.generation`, or its deletion), which a failing
    /// reconcile should see at once, as opposed to child events and resyncs (**Backoff holds** above).
    pub fn add_bypassing_backoff(
        &self,
        key: &ObjectKey,
        tenant: &TenantKey,
        priority: Priority,
    ) -> AddOutcome {
        self.add_inner(key, tenant, priority, Bypass::Always)
    }

    /// [`WorkQueue::add`] for a repair the next reconcile makes (one of the object's children
    /// was deleted): it ends the key's backoff wait, or queues a failing reconcile's retry at
    /// once, unless one did less than 10 s ago (**Backoff holds** above).
    pub fn add_repairing(
        &self,
        key: &ObjectKey,
        tenant: &TenantKey,
        priority: Priority,
    ) -> AddOutcome {
        self.add_inner(key, tenant, priority, Bypass::Repair)
    }

    fn add_inner(
        &self,
        key: &ObjectKey,
        tenant: &TenantKey,
        priority: Priority,
        bypass: Bypass,
    ) -> AddOutcome {
        let mut core = self.shared.lock();
        let outcome = core.add(key, tenant, priority, bypass, &mut Now::lazy());
        let ready = core.has_ready();
        drop(core);
        match outcome {
            // A key queued, or one raised to event work (which a reserved worker may serve,
            // see the **Caps** rule in this module's docs).
            _ if ready => self.shared.wake_one(),
            // Folded into a backoff wait with an earlier deadline: re-arm waiting timers.
            AddOutcome::Queued => self.shared.wake_all(),
            _ => {}
        }
        outcome
    }

    /// Add `key` of `tenant` once `delay` has passed (**Delays** above). A zero delay is an immediate add.
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
            self.shared.wake_all();
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
            weight: dispatch.weight,
            dispatched_at: self.shared.metrics.as_ref().map(|m| {
                let at = Instant::now();
                (at, m.in_flight.start(at))
            }),
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

    /// Keys ready to be handed out now, including keys whose delay has just passed (those
    /// are queued by this call); keys still delayed and keys in flight are not counted.
    pub fn len(&self) -> usize {
        let mut core = self.shared.lock();
        core.fire_due(&mut Now::lazy());
        let (len, ready) = (core.len(), core.has_ready());
        drop(core);
        if ready {
            self.shared.wake_one();
        }
        len
    }

    /// Tenants the queue currently tracks: those some queued, delayed or in-flight key
    /// refers to (a tenant with none is forgotten, with its metric series).
    pub fn tenants(&self) -> usize {
        self.shared.lock().tenants()
    }

    /// Whether no key is ready to be handed out now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop `key`'s waiting work — queued, delayed (its next resync, say), backing off, or
    /// due again after its current reconcile — because its object was deleted; an in-flight
    /// reconcile runs to its end. Frees the key and, if it was the last, its tenant (**Forgetting** above).
    /// Returns whether anything was dropped.
    pub fn remove(&self, key: &ObjectKey) -> bool {
        let mut core = self.shared.lock();
        let removed = core.remove(key);
        let ready = core.has_ready();
        drop(core);
        // The tenant first in line may have changed, and a reserved worker may serve the new
        // one (the **Caps** rule in this module's docs).
        if removed && ready {
            self.shared.wake_one();
        }
        removed
    }

    /// Keys in flight.
    pub fn in_flight(&self) -> usize {
        self.shared.lock().in_flight()
    }

    /// Keys of `tenant` in flight.
    pub fn tenant_in_flight(&self, tenant: &TenantKey) -> usize {
        self.shared.lock().tenant_in_flight(tenant)
    }

    /// Keys of `tenant` ready at `priority` (keys whose delay has passed included).
    pub fn tenant_len(&self, tenant: &TenantKey, priority: Priority) -> usize {
        let mut core = self.shared.lock();
        core.fire_due(&mut Now::lazy());
        core.tenant_queued(tenant, priority)
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
    weight: u32,
    /// Dispatch time and in-flight id, kept only for the work metrics.
    dispatched_at: Option<(Instant, u64)>,
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

    /// The tenant's fair-share weight when the key was handed out (at least 1).
    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// The priority it was served at (a promoted resync key reports [`Priority::Event`]).
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// The key is done: release it (**One in flight** above). A key added meanwhile is queued again.
    pub fn done(mut self) {
        self.release(None);
    }

    /// The reconcile failed: release the key and queue it again at event priority after
    /// `delay` (the backoff). Until then adds of the key are folded into this retry, except
    /// [`WorkQueue::add_bypassing_backoff`] (**Backoff holds** above). An add made while the key was in flight
    /// is folded in too, unless it bypassed backoff; then the key is queued at once.
    pub fn retry_after(mut self, delay: Duration) {
        self.release(Some(delay));
    }

    fn release(&mut self, retry: Option<Duration>) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        let mut now = Now::lazy();
        let (requeued, closing) = {
            let mut core = self.shared.lock();
            core.done(self.slot, retry, &mut now);
            (core.has_ready(), core.is_closed())
        };
        if retry.is_some() {
            // A new retry deadline: waiting workers re-arm their timers.
            self.shared.wake_all();
        }
        if let (Some(m), Some((at, id))) = (&self.shared.metrics, self.dispatched_at) {
            m.in_flight.finish(id);
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
        self.release(None);
    }
}
