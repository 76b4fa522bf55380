//! Who wrote what, by the API server's own record: the `reportingInstance` of the Events
//! (`events.k8s.io/v1`) that controllers leave on the objects they reconcile.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};

/// Per uid of an object of kind `kind`: the `reportingInstance`s of the Events about it that
/// were recorded (an Event's `eventTime`, or its series' `lastObservedTime`) at or after
/// `since`. Events without a reporting instance or a regarding uid are skipped.
///
/// # Errors
/// [`crate::Error::Kube`] when the cluster-wide LIST of Events fails.
pub async fn reporters(
    client: &kube::Client,
    kind: &str,
    since: Timestamp,
) -> crate::Result<BTreeMap<String, BTreeSet<String>>> {
    let events = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in events.items {
        let Some(regarding) = &e.regarding else {
            continue;
        };
        if regarding.kind.as_deref() != Some(kind) {
            continue;
        }
        let at = e
            .series
            .as_ref()
            .map(|s| s.last_observed_time.0)
            .or(e.event_time.as_ref().map(|t| t.0));
        if at.is_none_or(|t| t < since) {
            continue;
        }
        if let (Some(uid), Some(instance)) = (regarding.uid.clone(), e.reporting_instance) {
            out.entry(uid).or_default().insert(instance);
        }
    }
    Ok(out)
}
