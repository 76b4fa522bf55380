//! A worker: take a key from the fair queue, reconcile the cached object, apply the result
//! (done → resync later, requeue → exactly then, error → per-key backoff).

use std::fmt::{Debug, Display};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use rand::Rng;
use tokio::time::Instant;

use super::mapping::is_gone;
use super::{Action, Attempt};
use crate::backoff::Backoff;
use crate::metrics::ControllerMetrics;
use crate::queue::{Priority, WorkQueue};

/// Everything a worker needs, shared by all workers of one controller.
pub(crate) struct Worker<K: Resource<DynamicType = ()> + 'static, Ctx> {
    pub queue: WorkQueue,
    pub store: Store<K>,
    pub backoff: Arc<Mutex<Backoff>>,
    pub ctx: Arc<Ctx>,
    pub metrics: Option<ControllerMetrics>,
    /// Nominal resync period; 0 disables resync.
    pub resync_period: Duration,
    /// Extra random fraction in `[0, resync_jitter]` added to each resync delay.
    pub resync_jitter: f64,
    /// Objects this replica reconciles ([`super::Controller::shard`]); others are skipped.
    pub owns: Option<super::OwnsFn<K>>,
    /// An object's tenant, looked up again at every dispatch.
    pub tenant_of: super::watch::TenantFn<K>,
    /// Why each key was queued.
    pub reasons: super::reason::Reasons,
    /// Told of each finished key, when the controller releases memory once idle.
    pub idle: Option<Arc<super::idle::Idle>>,
}

/// The wait before an object's next resync: `period` stretched by a random fraction of up to
/// `jitter` of it, so that objects reconciled together do not resync together.
fn resync_delay(period: Duration, jitter: f64) -> Duration {
    let extra: f64 = if jitter > 0.0 {
        rand::rng().random_range(0.0..=jitter)
    } else {
        0.0
    };
    period.mul_f64(1.0 + extra)
}

impl<K, Ctx> Worker<K, Ctx>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
{
    fn resync_delay(&self) -> Duration {
        resync_delay(self.resync_period, self.resync_jitter)
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serve keys until the queue shuts down.
    pub async fn run<F, Fut, E>(self: Arc<Self>, reconcile: Arc<F>)
    where
        F: Fn(Arc<K>, Arc<Ctx>, Attempt) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Display + Debug + Send + 'static,
    {
        let mut after_first = false;
        loop {
            // Each key handled (the loop's start is not work).
            if let Some(idle) = self.idle.as_ref().filter(|_| after_first) {
                idle.work_done();
            }
            after_first = true;
            let Some(lease) = self.queue.get().await else {
                break;
            };
            let key = lease.key().clone();
            let tenant = lease.tenant().clone();
            let mut oref = ObjectRef::<K>::new(&key.name);
            if let Some(ns) = &key.namespace {
                oref = oref.within(ns);
            }
            let owned = |o: &Arc<K>| self.owns.as_ref().is_none_or(|owns| owns(o));
            let Some(obj) = self
                .store
                .get(&oref)
                .filter(|o| !is_gone(o.meta()) && owned(o))
            else {
                // Deleted (or about to vanish), or another replica's shard: nothing to
                // reconcile, not an error.
                self.backoff().forget(&key);
                tracing::debug!(%key, "object gone or not in this shard; reconcile skipped");
                lease.done();
                continue;
            };
            // The queue keeps a key's tenant while the key waits; the tenant is looked up
            // again now: a key queued under another one (its namespace not known yet, say)
            // goes back to the queue under its tenant, not reconciled as the other's.
            let current = (self.tenant_of)(&obj);
            if current != tenant {
                tracing::debug!(%key, from = %tenant, to = %current, "queued again under its tenant");
                let priority = lease.priority();
                lease.done();
                self.queue.remove(&key);
                self.queue.add(&key, &current, priority);
                continue;
            }
            let failures = self.backoff().failures(&key);
            let resync = lease.priority() == Priority::Resync;
            let attempt = Attempt {
                key: key.clone(),
                tenant: tenant.clone(),
                failures,
                priority: lease.priority(),
                reason: self.reasons.take(&key, resync, failures),
            };
            let started = Instant::now();
            // Counts this worker as active until the reconcile ends, or is cancelled.
            let active = self
                .metrics
                .as_ref()
                .map(|m| Active::new(&m.active_workers));
            // The reconcile's requests are its tenant's, at its weight (`inflight::RequestSlots`).
            let run = crate::inflight::scoped_weighted(
                tenant.clone(),
                lease.weight(),
                reconcile(obj, Arc::clone(&self.ctx), attempt),
            );
            let result = AssertUnwindSafe(run).catch_unwind().await;
            drop(active);
            if let Some(m) = &self.metrics {
                m.reconcile_time.observe(started.elapsed().as_secs_f64());
            }
            let error = match result {
                Ok(Ok(action)) => {
                    self.backoff().success(&key);
                    // Schedule the follow-ups while the key is still in flight, then release
                    // it: an add that fired during the reconcile (say a resync) is then merged
                    // with them and cannot demote the requeue (the queue's **Dedupe** and
                    // **Delays** rules).
                    if let Some(after) = action.requeue_after() {
                        self.reasons.note(&key, super::Reason::Requeue);
                        self.queue.add_after(&key, &tenant, after, Priority::Event);
                    }
                    if !self.resync_period.is_zero() {
                        let delay = self.resync_delay();
                        self.queue.add_after(&key, &tenant, delay, Priority::Resync);
                    }
                    lease.done();
                    if let Some(m) = &self.metrics {
                        match action.requeue_after() {
                            // A handled terminal error: counted as an error, not retried.
                            _ if action.is_terminal() => {
                                m.error.inc();
                                m.errors.inc();
                                m.terminal_errors.inc();
                            }
                            Some(_) => {
                                m.requeue_after.inc();
                            }
                            None => {
                                m.success.inc();
                            }
                        }
                    }
                    continue;
                }
                Ok(Err(e)) => e.to_string(),
                Err(panic) => {
                    if let Some(m) = &self.metrics {
                        m.panics.inc();
                    }
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(ToString::to_string)
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    format!("reconcile panicked: {what}")
                }
            };
            let (failures, delay) = self.backoff().failure(&key);
            tracing::warn!(%key, %tenant, failures, ?delay, %error, "reconcile failed; retrying");
            if let Some(m) = &self.metrics {
                m.error.inc();
                m.errors.inc();
            }
            if let Some(m) = self.queue.metrics() {
                m.retry();
            }
            // Release and back off in one step: events until then do not bypass the delay
            // unless the object's spec changed (the queue's *Backoff holds*).
            lease.retry_after(delay);
        }
    }
}

/// Holds one `controller_runtime_active_workers` increment for its lifetime.
struct Active(prometheus_client::metrics::gauge::Gauge);

impl Active {
    fn new(gauge: &prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;

    use super::*;
    use crate::backoff::BackoffConfig;
    use crate::controller::idle::Idle;
    use crate::queue::QueueConfig;
    use crate::{ObjectKey, TenantKey};

    #[test]
    fn the_resync_jitter_spreads_the_delay_over_its_fraction_of_the_period() {
        let period = Duration::from_secs(100);
        assert_eq!(resync_delay(period, 0.0), period, "no jitter, the period");
        let delays: Vec<Duration> = (0..200).map(|_| resync_delay(period, 0.1)).collect();
        assert!(
            delays
                .iter()
                .all(|d| (period..=Duration::from_secs(110)).contains(d)),
            "{delays:?}"
        );
        let (min, max) = (delays.iter().min().unwrap(), delays.iter().max().unwrap());
        assert!(
            *max - *min > Duration::from_secs(5),
            "spread over the fraction: {min:?}..{max:?}"
        );
    }

    #[tokio::test]
    async fn a_worker_tells_the_idle_task_of_each_key_it_handled_and_not_of_its_start() {
        let queue = WorkQueue::new(QueueConfig::default()).unwrap();
        let (store, _writer) = reflector::store::<ConfigMap>();
        let idle = Arc::new(Idle::default());
        let worker = Arc::new(Worker {
            queue: queue.clone(),
            store,
            backoff: Arc::new(Mutex::new(Backoff::new(BackoffConfig::default()).unwrap())),
            ctx: Arc::new(()),
            metrics: None,
            resync_period: Duration::ZERO,
            resync_jitter: 0.0,
            owns: None,
            tenant_of: Arc::new(|_: &ConfigMap| TenantKey::new("t")),
            reasons: super::super::reason::Reasons::default(),
            idle: Some(Arc::clone(&idle)),
        });
        let reconcile = |_: Arc<ConfigMap>, _: Arc<()>, _: Attempt| async {
            Ok::<_, String>(Action::await_change())
        };
        let run = tokio::spawn(Arc::clone(&worker).run(Arc::new(reconcile)));
        // The worker runs until it waits for a key: it has handled none.
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        assert_eq!(idle.finished_for_test(), 0, "a start is not work");
        // A key whose object is not cached (gone): handled, and counted once the worker is
        // back for the next.
        queue.add(
            &ObjectKey::namespaced("ConfigMap", "ns", "gone"),
            &TenantKey::new("t"),
            Priority::Event,
        );
        while idle.finished_for_test() == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(idle.finished_for_test(), 1);
        queue.shutdown(Duration::from_secs(1)).await;
        run.await.unwrap();
        assert!(
            idle.finished_for_test() <= 2,
            "the last pass ends at the shutdown"
        );
    }
}
