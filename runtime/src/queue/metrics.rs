//! The work queue's metric handles: queue depth, adds, retries, durations, keys in flight and
//! the per-tenant series; registered by [`crate::metrics::Metrics`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::time::Instant;

use super::fair::TenantMetrics;
use crate::key::TenantKey;

/// A label set: `(label name, value)` pairs.
pub(crate) type Labels = Vec<(&'static str, String)>;

/// Metric handles of one work queue (cheap atomic updates; per-tenant handles are resolved
/// once per tenant).
#[derive(Clone, Debug)]
pub struct QueueMetrics {
    pub(crate) name: String,
    pub(crate) depth: Gauge,
    pub(crate) adds: Counter,
    pub(crate) retries: Counter,
    pub(crate) queue_duration: Histogram,
    pub(crate) work_duration: Histogram,
    pub(crate) tenant_depth: Family<Labels, Gauge>,
    pub(crate) tenant_dispatches: Family<Labels, Counter>,
    pub(crate) in_flight: InFlight,
}

impl QueueMetrics {
    /// The per-tenant handles for `tenant`.
    pub(crate) fn tenant(&self, tenant: &TenantKey) -> TenantMetrics {
        let labels: Labels = vec![
            ("name", self.name.clone()),
            ("tenant", tenant.as_str().to_owned()),
        ];
        TenantMetrics {
            depth: self.tenant_depth.get_or_create(&labels).clone(),
            dispatches: self.tenant_dispatches.get_or_create(&labels).clone(),
        }
    }

    /// Remove `tenant`'s series from the per-tenant families (the queue forgot the tenant).
    pub(crate) fn forget_tenant(&self, tenant: &TenantKey) {
        let labels: Labels = vec![
            ("name", self.name.clone()),
            ("tenant", tenant.as_str().to_owned()),
        ];
        self.tenant_depth.remove(&labels);
        self.tenant_dispatches.remove(&labels);
    }

    /// Count one retry (a re-add after a reconcile error), as `workqueue_retries_total`.
    pub fn retry(&self) {
        self.retries.inc();
    }
}

/// Start times of the keys in flight of one queue (client-go's `processingStartTimes`).
#[derive(Clone, Debug, Default)]
pub(crate) struct InFlight {
    started: Arc<Mutex<HashMap<u64, Instant>>>,
    next: Arc<AtomicU64>,
}

impl InFlight {
    /// Notes a key dispatched at `at`; give the id to [`InFlight::finish`] when it is done.
    pub(crate) fn start(&self, at: Instant) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut started) = self.started.lock() {
            started.insert(id, at);
        }
        id
    }

    /// The key of `id` is done.
    pub(crate) fn finish(&self, id: u64) {
        if let Ok(mut started) = self.started.lock() {
            started.remove(&id);
        }
    }

    /// Seconds in flight so far: (sum over keys, longest).
    pub(crate) fn seconds(&self) -> (f64, f64) {
        let now = Instant::now();
        let started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        started.values().fold((0.0, 0.0), |(sum, max), at| {
            let s = now.saturating_duration_since(*at).as_secs_f64();
            (sum + s, f64::max(max, s))
        })
    }
}
