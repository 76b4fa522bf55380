//! Moving the ownership a create recorded (operation `Update`) to our `Apply` entry.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use serde_json::{Value, json};

/// `entries` with `manager`'s main-resource `Update` entry folded into its `Apply` entry: the
/// `Update` entry becomes the `Apply` entry when there is none, otherwise its field set is
/// united with the `Apply` entry's and it is dropped.
pub(crate) fn fold_update_into_apply(
    entries: &[ManagedFieldsEntry],
    manager: &str,
    desired: &Value,
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
                if let Some(FieldsV1(f)) = &mut moved.fields_v1 {
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

/// Whether `entries` hold an `Update` entry of `manager` on the main resource.
pub(crate) fn has_update_entry(entries: &[ManagedFieldsEntry], manager: &str) -> bool {
    entries.iter().any(|e| {
        e.manager.as_deref() == Some(manager)
            && e.operation.as_deref() == Some("Update")
            && e.subresource.as_deref().unwrap_or("").is_empty()
    })
}

/// The merge patch that folds `manager`'s `Update` entry of `live` into its `Apply` entry,
/// guarded by `live`'s `resourceVersion`; `None` when there is nothing to fold.
pub(crate) fn fold_patch(live: &Value, manager: &str, desired: &Value) -> Option<Value> {
    let entries: Vec<ManagedFieldsEntry> =
        serde_json::from_value(live.pointer("/metadata/managedFields")?.clone()).ok()?;
    if !has_update_entry(&entries, manager) {
        return None;
    }
    let moved = fold_update_into_apply(&entries, manager, desired);
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
        let moved = fold_update_into_apply(&create, "idem", &desired);
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
        let united = fold_update_into_apply(&replaced, "idem", &desired);
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
}
