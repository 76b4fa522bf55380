//! Which changes of an owned child are worth reconciling its owner for: what the reconcile
//! owns or reads, not the status churn and metadata other controllers add.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// How changes of an owned child kind reach its owner ([`Controller::owns_with`]).
///
/// By default a child event enqueues the owner only when something the reconcile can act on
/// changed: anything but `status`, `metadata.resourceVersion` and the `managedFields`
/// bookkeeping; of the labels and annotations only those our field manager owns (by the
/// child's `managedFields`), so another controller's annotation (a Deployment's
/// `deployment.kubernetes.io/revision`) does not count while a tenant removing or editing one
/// of ours does. Deletion, `deletionTimestamp`, finalizers and ownerReferences always count.
///
/// [`Controller::owns_with`]: super::Controller::owns_with
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnsOptions {
    /// The reconcile reads this kind's `status` (as the TenantApp reconcile reads its
    /// Deployment's ready replicas): the child cache keeps it, and a change of the child's
    /// `status` enqueues the owner too. Default `false`: status-only changes (a ResourceQuota's
    /// usage, a Deployment's rollout progress) do not. A
    /// [`Driver`](crate::reconciler::Driver) sets it for the kinds its reconciler names in
    /// [`Reconciler::children`](crate::reconciler::Reconciler::children).
    pub reads_status: bool,
}

impl OwnsOptions {
    /// Options for a kind whose `status` the reconcile reads ([`OwnsOptions::reads_status`]).
    pub fn reading_status() -> Self {
        Self { reads_status: true }
    }
}

/// A hash of what of `child` (as JSON) matters to its owner's reconcile, see [`OwnsOptions`]
/// and [`child_print_text`].
#[cfg(test)]
pub(crate) fn child_print(child: &Value, managers: &BTreeSet<String>, options: OwnsOptions) -> u64 {
    let meta = child.get("metadata").cloned().unwrap_or_default();
    child_print_text(&child.to_string(), &meta, managers, options)
}

/// A hash of what of the child serialised as `text` (JSON), with its metadata `meta` (as the
/// watch decoded it), matters to its owner's reconcile, see [`OwnsOptions`]. Nothing but the
/// top level of `text` is parsed; the rest is hashed as the text it is, so a large child costs
/// no copy of its content (the same object always serialises to the same text).
///
/// `managers` are the field managers the reconcile writes as; while none is known (before the
/// engine's first reconcile) every label, annotation and main-resource `managedFields` entry
/// counts.
pub(crate) fn child_print_text(
    text: &str,
    meta: &Value,
    managers: &BTreeSet<String>,
    options: OwnsOptions,
) -> u64 {
    let top: BTreeMap<String, &RawValue> = serde_json::from_str(text).unwrap_or_default();
    let mut h = DefaultHasher::new();
    // `apiVersion` and `kind` are the kind's own, and absent from the items of a list.
    for (k, v) in top.iter().filter(|(k, _)| {
        !matches!(k.as_str(), "metadata" | "apiVersion" | "kind")
            && (options.reads_status || k.as_str() != "status")
    }) {
        k.hash(&mut h);
        v.get().hash(&mut h);
    }
    meta_print(meta, managers, &mut h);
    h.finish()
}

/// As [`child_print_text`] for a child of which only the metadata `meta` (as JSON) counts: an
/// object the child caches keep as a stub, not one of the owner's children, whose content the
/// reconcile never acts on (it may act on who it claims to belong to, its labels, its deletion).
pub(crate) fn child_print_meta(meta: &Value, managers: &BTreeSet<String>) -> u64 {
    let mut h = DefaultHasher::new();
    "stub".hash(&mut h);
    meta_print(meta, managers, &mut h);
    h.finish()
}

/// Feeds what of `meta` matters into `h` (see [`OwnsOptions`]).
fn meta_print(meta: &Value, managers: &BTreeSet<String>, h: &mut DefaultHasher) {
    let empty = Map::new();
    let meta = meta.as_object().unwrap_or(&empty);
    let entries: Vec<&Map<String, Value>> = meta
        .get("managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        // Subresource entries (status) change with the subresource only.
        .filter(|e| {
            e.get("subresource")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
        })
        .collect();
    let is_ours = |e: &Map<String, Value>| {
        managers.is_empty()
            || e.get("manager")
                .and_then(Value::as_str)
                .is_some_and(|m| managers.contains(m))
    };
    // Our entries without their timestamps: a tampered or reset entry of ours counts.
    let ours: Vec<[Option<&Value>; 3]> = entries
        .iter()
        .filter(|e| is_ours(e))
        .map(|e| [e.get("manager"), e.get("operation"), e.get("fieldsV1")])
        .collect();
    // A label or annotation counts unless only other managers own it.
    let relevant = |map: &str| -> Option<Vec<(&String, &Value)>> {
        let Some(Value::Object(values)) = meta.get(map) else {
            return None;
        };
        let field = format!("f:{map}");
        let fields: Vec<Option<&Map<String, Value>>> = entries
            .iter()
            .map(|e| {
                e.get("fieldsV1")
                    .and_then(|f| f.get("f:metadata"))
                    .and_then(|f| f.get(&field))
                    .and_then(Value::as_object)
            })
            .collect();
        Some(
            values
                .iter()
                .filter(|(k, _)| {
                    let key = format!("f:{k}");
                    let mut owners = (entries.iter().zip(&fields))
                        .filter(|(_, f)| f.is_some_and(|f| f.contains_key(&key)))
                        .peekable();
                    owners.peek().is_none() || owners.any(|(e, _)| is_ours(e))
                })
                .collect(),
        )
    };
    let print = (
        meta.get("uid"),
        meta.get("deletionTimestamp"),
        meta.get("finalizers"),
        meta.get("ownerReferences"),
        relevant("labels"),
        relevant("annotations"),
        ours,
    );
    // Fed to the hash as it serialises: nothing of it is copied.
    let _ = serde_json::to_writer(HashWriter(h), &print);
}

/// An [`std::io::Write`] that feeds what is written to a hasher.
struct HashWriter<'a>(&'a mut DefaultHasher);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const US: &str = "idem-operator";

    fn managers() -> BTreeSet<String> {
        BTreeSet::from([US.to_owned()])
    }

    /// A Deployment as the API server returns it after our apply and the controller-manager's
    /// first status and revision-annotation writes.
    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": "web", "namespace": "acme", "uid": "u1", "resourceVersion": "10",
                "labels": {"app.kubernetes.io/managed-by": US},
                "annotations": {"deployment.kubernetes.io/revision": "1"},
                "managedFields": [
                    {"manager": US, "operation": "Apply", "time": "t1",
                     "fieldsV1": {"f:metadata": {"f:labels": {"f:app.kubernetes.io/managed-by": {}}},
                                  "f:spec": {"f:replicas": {}}}},
                    {"manager": "kube-controller-manager", "operation": "Update", "time": "t1",
                     "fieldsV1": {"f:metadata": {"f:annotations": {
                         ".": {}, "f:deployment.kubernetes.io/revision": {}}}}},
                    {"manager": "kube-controller-manager", "operation": "Update",
                     "subresource": "status", "time": "t1",
                     "fieldsV1": {"f:status": {"f:replicas": {}}}}
                ]
            },
            "spec": {"replicas": 2},
            "status": {"replicas": 1}
        })
    }

    fn print(v: &Value) -> u64 {
        child_print(v, &managers(), OwnsOptions::default())
    }

    #[test]
    fn a_list_item_without_api_version_and_kind_prints_as_its_watch_event() {
        let mut item = deployment();
        let map = item.as_object_mut().unwrap();
        map.remove("apiVersion");
        map.remove("kind");
        assert_eq!(print(&deployment()), print(&item));
    }

    #[test]
    fn status_churn_and_other_managers_metadata_do_not_count() {
        let before = deployment();
        let mut after = before.clone();
        after["metadata"]["resourceVersion"] = json!("11");
        after["status"]["replicas"] = json!(2);
        after["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = json!("2");
        after["metadata"]["managedFields"][1]["time"] = json!("t2");
        after["metadata"]["managedFields"][2]["time"] = json!("t2");
        after["metadata"]["managedFields"][2]["fieldsV1"] =
            json!({"f:status": {"f:replicas": {}, "f:readyReplicas": {}}});
        assert_eq!(print(&before), print(&after));
    }

    #[test]
    fn reads_status_makes_status_changes_count() {
        let before = deployment();
        let mut after = before.clone();
        after["status"]["replicas"] = json!(2);
        let reading = OwnsOptions::reading_status();
        assert_ne!(
            child_print(&before, &managers(), reading),
            child_print(&after, &managers(), reading)
        );
    }

    #[test]
    fn spec_our_labels_our_entry_and_deletion_count() {
        let before = deployment();
        let mut spec = before.clone();
        spec["spec"]["replicas"] = json!(3);
        let mut removed_label = before.clone();
        removed_label["metadata"]["labels"] = json!({});
        removed_label["metadata"]["managedFields"][0]["fieldsV1"] =
            json!({"f:spec": {"f:replicas": {}}});
        // A tenant's edit of our label moves it to their entry: the value and owner change.
        let mut edited_label = before.clone();
        edited_label["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("mallory");
        edited_label["metadata"]["managedFields"][0]["fieldsV1"] =
            json!({"f:spec": {"f:replicas": {}}});
        let mut reset_fields = before.clone();
        reset_fields["metadata"]["managedFields"] = json!([]);
        let mut deleting = before.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let mut orphaned = before.clone();
        orphaned["metadata"]["ownerReferences"] = json!([]);
        for changed in [
            spec,
            removed_label,
            edited_label,
            reset_fields,
            deleting,
            orphaned,
        ] {
            assert_ne!(print(&before), print(&changed), "{changed}");
        }
    }

    #[test]
    fn a_label_nobody_owns_yet_and_unknown_managers_count() {
        let before = deployment();
        let mut other = before.clone();
        other["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = json!("2");
        // Before the engine's first reconcile our manager is unknown: everything counts.
        let nobody = BTreeSet::new();
        assert_ne!(
            child_print(&before, &nobody, OwnsOptions::default()),
            child_print(&other, &nobody, OwnsOptions::default())
        );
        // A label not recorded in any entry (cannot be attributed) counts.
        let mut unowned = before.clone();
        unowned["metadata"]["labels"]["x"] = json!("y");
        assert_ne!(print(&before), print(&unowned));
    }
}
