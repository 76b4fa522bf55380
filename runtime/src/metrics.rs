//! Prometheus metrics of the work queue and the controller loop, named like
//! controller-runtime's where the meaning is the same, plus idem's per-tenant figures.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `workqueue_depth` | gauge | `name` | keys ready to be handed out (not delayed, not in flight) |
//! | `workqueue_adds_total` | counter | `name` | adds that queued a key or marked an in-flight key dirty (deduped adds are not counted, as in client-go) |
//! | `workqueue_retries_total` | counter | `name` | re-adds after a reconcile error (backoff) |
//! | `workqueue_queue_duration_seconds` | histogram | `name` | seconds a key waited between enqueue and dispatch |
//! | `workqueue_work_duration_seconds` | histogram | `name` | seconds between dispatch and done |
//! | `controller_runtime_reconcile_total` | counter | `controller`, `result` | reconciles by result: `success`, `error`, `requeue_after` |
//! | `controller_runtime_reconcile_time_seconds` | histogram | `controller` | seconds spent in the reconcile function |
//! | `controller_runtime_reconcile_total` result `error` and `controller_runtime_reconcile_errors_total` | counter | `controller` | reconciles that returned an error (terminal ones included, as in controller-runtime) or panicked |
//! | `controller_runtime_terminal_reconcile_errors_total` | counter | `controller` | reconciles that ended in a terminal error ([`Action::terminal`](crate::controller::Action::terminal)): not retried |
//! | `controller_runtime_reconcile_panics_total` | counter | `controller` | reconciles that panicked (caught: the worker lives on and the key retries with backoff) |
//! | `controller_runtime_active_workers` | gauge | `controller` | workers running a reconcile now |
//! | `controller_runtime_max_concurrent_reconciles` | gauge | `controller` | the worker count ([`ControllerConfig::workers`](crate::controller::ControllerConfig::workers)) |
//! | `workqueue_unfinished_work_seconds` | gauge | `name` | seconds of work in progress not yet observed by `work_duration` (sum over keys in flight), computed at scrape; grows when a reconcile hangs |
//! | `workqueue_longest_running_processor_seconds` | gauge | `name` | seconds the longest key in flight has been processed, computed at scrape |
//! | `idem_tenant_queue_depth` | gauge | `name`, `tenant` | ready keys per tenant |
//! | `idem_tenant_dispatches_total` | counter | `name`, `tenant` | keys handed to workers per tenant |
//! | `idem_blocked_object_watches` | gauge | `controller` | watches of objects that block a desired child's name, running now (see [`crate::controller::blocked`]) |
//! | `idem_memory_releases_total` | counter | `controller` | times the controller's queue drained and it asked the allocator to give its free pages back to the operating system (Linux with glibc only) ([`ControllerConfig::release_memory_when_idle`](crate::controller::ControllerConfig::release_memory_when_idle)) |
//!
//! A tenant's `idem_tenant_*` series are removed when the queue forgets the tenant (no key
//! refers to it any more), so the series do not grow with every tenant ever seen; a counter
//! that comes back starts again at 0, which Prometheus' `rate()` treats as a reset.
//!
//! Workqueue histograms use client-go's buckets (`ExponentialBuckets(10e-9, 10, 12)`:
//! 10 ns … 1,000 s); the reconcile-time histogram uses 5 ms × 2ⁿ, n = 0..16 (5 ms … ~164 s).

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::TypedMetric;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::queue::{InFlight, QueueMetrics};

/// A label set: `(label name, value)` pairs.
type Labels = Vec<(&'static str, String)>;

fn workqueue_histogram() -> Histogram {
    Histogram::new(exponential_buckets(10e-9, 10.0, 12))
}

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 16))
}

/// Every metric family of idem's runtime, registered once per [`Registry`]; hand out
/// per-controller handles with [`Metrics::queue`] and [`Metrics::controller`].
#[derive(Clone, Debug)]
pub struct Metrics {
    depth: Family<Labels, Gauge>,
    adds: Family<Labels, Counter>,
    retries: Family<Labels, Counter>,
    queue_duration: Family<Labels, Histogram, fn() -> Histogram>,
    work_duration: Family<Labels, Histogram, fn() -> Histogram>,
    reconcile_total: Family<Labels, Counter>,
    reconcile_time: Family<Labels, Histogram, fn() -> Histogram>,
    tenant_depth: Family<Labels, Gauge>,
    tenant_dispatches: Family<Labels, Counter>,
    reconcile_errors: Family<Labels, Counter>,
    terminal_errors: Family<Labels, Counter>,
    reconcile_panics: Family<Labels, Counter>,
    active_workers: Family<Labels, Gauge>,
    max_concurrent: Family<Labels, Gauge>,
    blocked_watches: Family<Labels, Gauge>,
    memory_releases: Family<Labels, Counter>,
    in_flight: Arc<InFlightCollector>,
}

impl Metrics {
    /// Create the families and register them in `registry` under the names in the module docs.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            depth: Family::default(),
            adds: Family::default(),
            retries: Family::default(),
            queue_duration: Family::new_with_constructor(workqueue_histogram),
            work_duration: Family::new_with_constructor(workqueue_histogram),
            reconcile_total: Family::default(),
            reconcile_time: Family::new_with_constructor(reconcile_histogram),
            tenant_depth: Family::default(),
            tenant_dispatches: Family::default(),
            reconcile_errors: Family::default(),
            terminal_errors: Family::default(),
            reconcile_panics: Family::default(),
            active_workers: Family::default(),
            max_concurrent: Family::default(),
            blocked_watches: Family::default(),
            memory_releases: Family::default(),
            in_flight: Arc::default(),
        };
        registry.register(
            "idem_memory_releases",
            "Times a controller's queue drained and it gave free memory back to the system",
            m.memory_releases.clone(),
        );
        registry.register(
            "idem_blocked_object_watches",
            "Watches of objects blocking a desired child's name, running now, per controller",
            m.blocked_watches.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_terminal_reconcile_errors",
            "Total number of terminal reconciliation errors per controller",
            m.terminal_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_panics",
            "Total number of reconciliation panics per controller",
            m.reconcile_panics.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            m.active_workers.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            m.max_concurrent.clone(),
        );
        registry.register_collector(Box::new(Arc::clone(&m.in_flight)));
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            m.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            m.adds.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            m.retries.clone(),
        );
        registry.register_with_unit(
            "workqueue_queue_duration",
            "How long in seconds an item stays in workqueue before being requested",
            Unit::Seconds,
            m.queue_duration.clone(),
        );
        registry.register_with_unit(
            "workqueue_work_duration",
            "How long in seconds processing an item from workqueue takes",
            Unit::Seconds,
            m.work_duration.clone(),
        );
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            m.reconcile_total.clone(),
        );
        registry.register_with_unit(
            "controller_runtime_reconcile_time",
            "Length of time per reconciliation per controller",
            Unit::Seconds,
            m.reconcile_time.clone(),
        );
        registry.register(
            "idem_tenant_queue_depth",
            "Keys of a tenant ready to be handed out",
            m.tenant_depth.clone(),
        );
        registry.register(
            "idem_tenant_dispatches",
            "Keys of a tenant handed to workers",
            m.tenant_dispatches.clone(),
        );
        m
    }

    /// Handles for the work queue called `name`.
    pub fn queue(&self, name: &str) -> QueueMetrics {
        let labels: Labels = vec![("name", name.to_owned())];
        QueueMetrics {
            name: name.to_owned(),
            depth: self.depth.get_or_create(&labels).clone(),
            adds: self.adds.get_or_create(&labels).clone(),
            retries: self.retries.get_or_create(&labels).clone(),
            queue_duration: self.queue_duration.get_or_create(&labels).clone(),
            work_duration: self.work_duration.get_or_create(&labels).clone(),
            tenant_depth: self.tenant_depth.clone(),
            tenant_dispatches: self.tenant_dispatches.clone(),
            in_flight: self.in_flight.queue(name),
        }
    }

    /// The gauge of the blocking-object watches of the controller called `name`
    /// (`idem_blocked_object_watches`).
    pub fn blocked_watches(&self, name: &str) -> Gauge {
        let labels: Labels = vec![("controller", name.to_owned())];
        self.blocked_watches.get_or_create(&labels).clone()
    }

    /// Handles for the controller called `name`.
    pub fn controller(&self, name: &str) -> ControllerMetrics {
        let result = |r: &str| -> Counter {
            let labels: Labels = vec![("controller", name.to_owned()), ("result", r.to_owned())];
            self.reconcile_total.get_or_create(&labels).clone()
        };
        let labels: Labels = vec![("controller", name.to_owned())];
        ControllerMetrics {
            success: result("success"),
            error: result("error"),
            requeue_after: result("requeue_after"),
            reconcile_time: self.reconcile_time.get_or_create(&labels).clone(),
            errors: self.reconcile_errors.get_or_create(&labels).clone(),
            terminal_errors: self.terminal_errors.get_or_create(&labels).clone(),
            panics: self.reconcile_panics.get_or_create(&labels).clone(),
            active_workers: self.active_workers.get_or_create(&labels).clone(),
            max_concurrent: self.max_concurrent.get_or_create(&labels).clone(),
            memory_releases: self.memory_releases.get_or_create(&labels).clone(),
        }
    }
}

/// Metric handles of one controller's reconciles.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    pub(crate) success: Counter,
    pub(crate) error: Counter,
    pub(crate) requeue_after: Counter,
    pub(crate) reconcile_time: Histogram,
    pub(crate) errors: Counter,
    pub(crate) terminal_errors: Counter,
    pub(crate) panics: Counter,
    pub(crate) active_workers: Gauge,
    pub(crate) max_concurrent: Gauge,
    pub(crate) memory_releases: Counter,
}

/// Computes `workqueue_unfinished_work_seconds` and
/// `workqueue_longest_running_processor_seconds` of every queue at scrape time.
#[derive(Debug, Default)]
struct InFlightCollector {
    queues: Mutex<Vec<(String, InFlight)>>,
}

impl InFlightCollector {
    /// The start times of queue `name` (the same for every call with that name).
    fn queue(&self, name: &str) -> InFlight {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, f)) = queues.iter().find(|(n, _)| n == name) {
            return f.clone();
        }
        let f = InFlight::default();
        queues.push((name.to_owned(), f.clone()));
        f
    }
}

impl Collector for InFlightCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let queues: Vec<(String, (f64, f64))> = {
            let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            queues
                .iter()
                .map(|(n, f)| (n.clone(), f.seconds()))
                .collect()
        };
        for (name, help, longest) in [
            (
                "workqueue_unfinished_work",
                "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
                false,
            ),
            (
                "workqueue_longest_running_processor",
                "How many seconds has the longest running processor for workqueue been running",
                true,
            ),
        ] {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                Some(&Unit::Seconds),
                ConstGauge::<f64>::TYPE,
            )?;
            for (queue, (sum, max)) in &queues {
                let labels: Labels = vec![("name", queue.clone())];
                let value = if longest { *max } else { *sum };
                ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
