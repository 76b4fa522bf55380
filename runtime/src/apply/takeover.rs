//! Our create's ownership record (operation `Update`, as every `POST` records) seen as, and
//! moved to, our `Apply` entry.
//!
//! A create is one `POST`; the `Update` entry it records is moved to an `Apply` entry lazily,
//! only when an apply is needed: until then [`as_applied`] lets the convergence check judge
//! the child as if it had been moved.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use serde_json::{Value, json};

use super::FINGERPRINT_ANNOTATION;

/// `entries` with `manager`'s main-resource `Update` entry folded into its `Apply` entry: the
/// `Update` entry becomes the `Apply` entry when there is none, otherwise its field set is
/// united with the `Apply` entry's and it is dropped. With `desired` (the body that was
/// created), a moved entry keeps only what an apply of that body would have recorded; without
/// it, everything the `Update` recorded (so an apply can remove all of it).
pub(crate) fn fold_update_into_apply(
    entries: &[ManagedFieldsEntry],
    manager: &str,
    desired: Option<&Value>,
) -> Vec<ManagedFieldsEntry> {
    let is = |e: &ManagedFieldsEntry, op: &str| {
        e.manager.as_deref() == Some(manager)
            && e.operation.as_deref() == Some(op)
            && e.subresource.as_deref().unwrap_or("").is_empty()
    };
    let updates: Vec<&ManagedFieldsEntry> = entries.iter().filter(|e| is(e, "Update")).collect();
    let mut out: Vec<ManagedFieldsEntry> = entries
        .iter()
        .filter(|e| !is(e, "Update"))
        .cloned()
        .collect();
    for update in updates {
        match out.iter_mut().find(|e| is(e, "Apply")) {
            Some(apply) => {
                let mut fields = apply.fields_v1.take().map_or(Value::Null, |f| f.0);
                if let Some(more) = &update.fields_v1 {
                    unite(&mut fields, &more.0);
                }
                apply.fields_v1 = Some(FieldsV1(fields));
                apply.time = None;
            }
            None => {
                let mut moved = update.clone();
                moved.operation = Some("Apply".to_owned());
                moved.time = None;
                // An Update entry also records server defaults and every map it touched; keep
                // what an apply of the desired body would have recorded (checked against the
                // API server by the oracle test).
                if let (Some(FieldsV1(f)), Some(desired)) = (&mut moved.fields_v1, desired) {
                    *f = crate::compare::restrict_to_desired(desired, f);
                }
                out.push(moved);
            }
        }
    }
    out
}

/// Unites the `fieldsV1` set `more` into `into` (both nested JSON objects of field paths).
fn unite(into: &mut Value, more: &Value) {
    match (into, more) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                unite(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (slot @ Value::Null, v) => *slot = v.clone(),
        _ => {}
    }
}

/// `manager`'s main-resource entries of `entries` with operation `op`.
fn entries_of<'a>(
    entries: &'a [ManagedFieldsEntry],
    manager: &'a str,
    op: &'a str,
) -> impl Iterator<Item = &'a ManagedFieldsEntry> {
    entries.iter().filter(move |e| {
        e.manager.as_deref() == Some(manager)
            && e.operation.as_deref() == Some(op)
            && e.subresource.as_deref().unwrap_or("").is_empty()
    })
}

/// Whether `live` was created from `desired` and not applied since: `manager` has an `Update`
/// entry and no `Apply` entry, and that `Update` entry owns the [`FINGERPRINT_ANNOTATION`],
/// whose value is `desired`'s (the fingerprint covers the whole stamped body).
fn created_from(
    live: &Value,
    entries: &[ManagedFieldsEntry],
    manager: &str,
    desired: &Value,
) -> bool {
    let print = |v: &Value| {
        v.pointer("/metadata/annotations")
            .and_then(|a| a.get(FINGERPRINT_ANNOTATION))
            .cloned()
    };
    let owns_print = |e: &ManagedFieldsEntry| {
        e.fields_v1
            .as_ref()
            .and_then(|f| f.0.pointer("/f:metadata/f:annotations"))
            .and_then(|a| a.get(format!("f:{FINGERPRINT_ANNOTATION}")))
            .is_some()
    };
    entries_of(entries, manager, "Apply").next().is_none()
        && entries_of(entries, manager, "Update").any(owns_print)
        && print(live).is_some()
        && print(live) == print(desired)
}

fn managed_fields(live: &Value) -> Option<Vec<ManagedFieldsEntry>> {
    serde_json::from_value(live.pointer("/metadata/managedFields")?.clone()).ok()
}

/// `live` as the convergence check ([`crate::compare::check`]) judges it for `manager`: when
/// the child was created from `desired` with a `POST` and not applied to since (our `Update`
/// entry owns the fingerprint annotation and its value is `desired`'s), with that `Update`
/// entry replaced by the `Apply` entry an apply of `desired` records — which is what the
/// server would hold had the create been an apply (the oracle test checks this against the
/// API server's dry-run apply). `None` when the child is to be judged as it is.
///
/// Anyone else's change of a field since moves it out of our `Update` entry (or removes it
/// from every entry) exactly as it would have from an `Apply` entry, so drift is still seen.
pub fn as_applied(live: &Value, manager: &str, desired: &Value) -> Option<Value> {
    let entries = managed_fields(live)?;
    if !created_from(live, &entries, manager, desired) {
        return None;
    }
    let moved = fold_update_into_apply(&entries, manager, Some(desired));
    let mut out = live.clone();
    out["metadata"]["managedFields"] = serde_json::to_value(moved).ok()?;
    Some(out)
}

/// The merge patch that folds `manager`'s `Update` entry of `live` into its `Apply` entry,
/// guarded by `live`'s `resourceVersion`; `None` when there is nothing to fold. The moved
/// entry keeps what an apply of `desired` records when `live` was created from `desired`
/// (see [`as_applied`]), else everything the `Update` recorded: the fields of an older
/// desired body must be ours for the apply to remove them (server defaults among them are
/// defaulted again by the API server).
pub(crate) fn fold_patch(live: &Value, manager: &str, desired: &Value) -> Option<Value> {
    let entries = managed_fields(live)?;
    entries_of(&entries, manager, "Update").next()?;
    let exact = created_from(live, &entries, manager, desired);
    let moved = fold_update_into_apply(&entries, manager, exact.then_some(desired));
    Some(json!({"metadata": {
        "managedFields": moved,
        "resourceVersion": live.pointer("/metadata/resourceVersion"),
    }}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(manager: &str, op: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(op.into()),
            api_version: Some("v1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn update_entry_is_moved_or_united_into_apply() {
        let create = [
            entry("idem", "Update", json!({"f:data": {"f:a": {}}})),
            entry("rival", "Update", json!({"f:data": {"f:r": {}}})),
        ];
        let desired = json!({"data": {"a": "x"}});
        let moved = fold_update_into_apply(&create, "idem", Some(&desired));
        assert_eq!(moved.len(), 2);
        assert_eq!(moved[0], create[1]);
        assert_eq!(moved[1].operation.as_deref(), Some("Apply"));
        assert_eq!(moved[1].fields_v1, create[0].fields_v1);

        let replaced = [
            entry(
                "idem",
                "Apply",
                json!({"f:spec": {"f:selector": {}, "f:ports": {"k:{\"port\":80}": {".": {}}}}}),
            ),
            entry(
                "idem",
                "Update",
                json!({"f:spec": {"f:ports": {"k:{\"port\":80}": {"f:name": {}}}}}),
            ),
        ];
        let united = fold_update_into_apply(&replaced, "idem", Some(&desired));
        assert_eq!(united.len(), 1);
        assert_eq!(united[0].operation.as_deref(), Some("Apply"));
        assert_eq!(
            united[0].fields_v1,
            Some(FieldsV1(json!({"f:spec": {
                "f:selector": {},
                "f:ports": {"k:{\"port\":80}": {".": {}, "f:name": {}}},
            }})))
        );
    }

    /// A ConfigMap as a `POST` of `{"data": {"a": "x"}}` with fingerprint `p1` leaves it.
    fn created() -> Value {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": "c", "resourceVersion": "5",
                "annotations": {FINGERPRINT_ANNOTATION: "p1"},
                "managedFields": [entry("idem", "Update", json!({
                    "f:data": {".": {}, "f:a": {}},
                    "f:metadata": {"f:annotations": {".": {}, format!("f:{FINGERPRINT_ANNOTATION}"): {}}}
                }))]
            },
            "data": {"a": "x"}
        })
    }

    fn desired(print: &str, data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "c", "annotations": {FINGERPRINT_ANNOTATION: print}},
               "data": data})
    }

    #[test]
    fn a_create_is_judged_as_applied_only_while_its_body_is_desired() {
        let live = created();
        let same = desired("p1", json!({"a": "x"}));
        let judged = as_applied(&live, "idem", &same).expect("created from the desired body");
        let entries = judged["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0]["operation"], "Apply");
        // What an apply records: no `.` markers of the maps the create touched.
        assert_eq!(
            entries[0]["fieldsV1"],
            json!({"f:data": {"f:a": {}},
                   "f:metadata": {"f:annotations": {format!("f:{FINGERPRINT_ANNOTATION}"): {}}}})
        );
        assert!(crate::compare::check(&same, &judged, "idem").is_empty());

        // Another desired body (another fingerprint): judged as it is, never applied.
        assert!(as_applied(&live, "idem", &desired("p2", json!({}))).is_none());
        // The fingerprint written by someone else (their entry owns it): as it is.
        let mut forged = live.clone();
        forged["metadata"]["managedFields"] = json!([
            entry("idem", "Update", json!({"f:data": {"f:a": {}}})),
            entry(
                "mallory",
                "Update",
                json!({"f:metadata": {"f:annotations": {
                format!("f:{FINGERPRINT_ANNOTATION}"): {}}}})
            ),
        ]);
        assert!(as_applied(&forged, "idem", &same).is_none());
        // Applied since: the Apply entry is the record.
        let mut applied = live.clone();
        applied["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::to_value(entry("idem", "Apply", json!({}))).unwrap());
        assert!(as_applied(&applied, "idem", &same).is_none());
    }

    #[test]
    fn a_fold_for_a_changed_body_keeps_every_field_the_create_set() {
        let live = created();
        // Desired now lacks `a`: the moved entry must own it for the apply to remove it.
        let patch = fold_patch(&live, "idem", &desired("p2", json!({"b": "y"}))).unwrap();
        let moved = &patch["metadata"]["managedFields"][0];
        assert_eq!(moved["operation"], "Apply");
        assert_eq!(moved["fieldsV1"]["f:data"], json!({".": {}, "f:a": {}}));
        assert_eq!(patch["metadata"]["resourceVersion"], "5");
        // The same body: exactly what its apply records.
        let patch = fold_patch(&live, "idem", &desired("p1", json!({"a": "x"}))).unwrap();
        assert_eq!(
            patch["metadata"]["managedFields"][0]["fieldsV1"]["f:data"],
            json!({"f:a": {}})
        );
    }
}
