//! The apply engine's metric: drift repaired, by child kind.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// `idem_drift_repaired_total{kind}` (counter): children whose drift, made by another writer,
/// a reconcile repaired. Cheap to clone; register once per [`Registry`].
#[derive(Clone, Debug, Default)]
pub struct DriftMetrics {
    repaired: Family<Vec<(&'static str, String)>, Counter>,
}

impl DriftMetrics {
    /// The family, registered in `registry` as `idem_drift_repaired_total`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "idem_drift_repaired",
            "Children whose drift made by another writer was repaired, by kind",
            m.repaired.clone(),
        );
        m
    }

    /// Counts one repaired child of `kind`.
    pub fn repaired(&self, kind: &str) {
        self.repaired
            .get_or_create(&vec![("kind", kind.to_owned())])
            .inc();
    }

    /// The count for `kind` so far.
    pub fn count(&self, kind: &str) -> u64 {
        self.repaired
            .get_or_create(&vec![("kind", kind.to_owned())])
            .get()
    }
}
