//! A fingerprint of what a field manager's apply could change in an object, so that the
//! server's answer for a desired body can be remembered and compared without asking again.
//!
//! The convergence check ([`super::check`]) decides most children exactly from the desired
//! body and the server's record. Where it cannot — a default the server adds inside a value we
//! own as a whole (an item of a StatefulSet's `volumeClaimTemplates`), a canonical form it does
//! not know (a quantity in a custom resource), a field the server moves elsewhere (a Secret's
//! `stringData`) — the engine asks the server once: a `dryRun=All` apply of the desired body
//! returns the object as that apply would leave it. An apply changes nothing exactly when the
//! object it would leave equals the live one; [`settled`] fingerprints the part of an object an
//! apply by `manager` can change, so that the answer is kept as 8 bytes per child and later
//! passes compare the live object's fingerprint with it, making no request. The fingerprint is
//! keyed with a secret of the process (the live side is written by anyone who may edit the
//! child: an unkeyed hash could be matched by a value chosen to collide).
//!
//! What an apply can change: the values of the fields `manager` owns (in any of its entries: a
//! create's `Update` entry owns what the create set), and the values no manager owns (what the
//! server derived from ours, such as a Secret's `data` from its `stringData`). Fields only other
//! managers own (in any of their entries, a subresource's too: a Deployment's revision
//! annotation is written through `status`) are theirs: an apply leaves them alone, so a field another manager takes over
//! leaves the fingerprint (and changes it). Which of our entries owns a field does not count:
//! a create's record and an apply's own the same values. Left out are `status` and
//! what the server changes on every write (`resourceVersion`, `generation`, the time stamps of
//! `managedFields`), which say nothing about what the apply would write.

use serde_json::{Map, Value};

use super::fields::{Drift, DriftKind, children, is_leaf, item_matches_key, parse_key};
use super::fingerprint::{Fingerprint, keyed_fingerprint};

/// Metadata the server rewrites on every write, or that no apply can change.
const VOLATILE_METADATA: [&str; 7] = [
    "resourceVersion",
    "generation",
    "managedFields",
    "creationTimestamp",
    "uid",
    "selfLink",
    "deletionGracePeriodSeconds",
];

/// The fingerprint of what an apply by `manager` could change in `obj` (see the
/// [module docs](self)); `None` when `manager` has no entry on the main resource (then every
/// apply changes the object: it records one).
pub(crate) fn settled(obj: &Value, manager: &str) -> Option<Fingerprint> {
    let (_, projected) = projection(obj, manager)?;
    Some(keyed_fingerprint(&projected))
}

/// The fields whose values differ between what an apply by `manager` could change in
/// `before` and in `after` (the object that apply left): what the apply restored, where the
/// convergence check cannot name it (a value the server derives from ours, such as a
/// Secret's `data` from its `stringData`).
pub(crate) fn differences(before: &Value, after: &Value, manager: &str) -> Vec<Drift> {
    let project = |v| projection(v, manager).map_or(Value::Null, |(_, p)| p);
    let mut out = Vec::new();
    diff(
        &project(before),
        &project(after),
        &mut String::new(),
        &mut out,
    );
    out
}

fn diff(a: &Value, b: &Value, path: &mut String, out: &mut Vec<Drift>) {
    if a == b {
        return;
    }
    let len = path.len();
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                path.push('.');
                path.push_str(k);
                let null = Value::Null;
                diff(
                    x.get(k.as_str()).unwrap_or(&null),
                    y.get(k.as_str()).unwrap_or(&null),
                    path,
                    out,
                );
                path.truncate(len);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                path.push_str(&format!("[{i}]"));
                diff(p, q, path, out);
                path.truncate(len);
            }
        }
        _ => out.push(Drift {
            path: path.clone(),
            kind: DriftKind::Changed,
        }),
    }
}

/// Our field set (every entry of `manager` on the main resource) and the part of `obj` an
/// apply by `manager` could change; `None` without an entry of ours.
fn projection(obj: &Value, manager: &str) -> Option<(Value, Value)> {
    let entries = obj.pointer("/metadata/managedFields")?.as_array()?;
    let mut ours = Value::Null;
    let mut theirs = Value::Null;
    let mut found = false;
    for e in entries {
        let subresource = e
            .get("subresource")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty());
        let Some(fields) = e.get("fieldsV1") else {
            continue;
        };
        if e.get("manager").and_then(Value::as_str) == Some(manager) {
            // What we wrote through a subresource is not what an apply to the object changes.
            if subresource {
                continue;
            }
            found = true;
            unite_fields(&mut ours, fields);
        } else {
            // Another manager's, whichever way they wrote it: a Deployment's revision
            // annotation is written through its `status` subresource.
            unite_fields(&mut theirs, fields);
        }
    }
    if !found {
        return None;
    }
    let mut body = obj.clone();
    if let Some(o) = body.as_object_mut() {
        o.remove("status");
        if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            for f in VOLATILE_METADATA {
                meta.remove(f);
            }
        }
    }
    let empty = Map::new();
    let projected = project(
        &body,
        Some(ours.as_object().unwrap_or(&empty)),
        theirs.as_object(),
    )
    .unwrap_or(Value::Null);
    Some((ours, projected))
}

/// Unites the `fieldsV1` set `more` into `into` (both nested JSON objects of field paths).
pub(crate) fn unite_fields(into: &mut Value, more: &Value) {
    match (into, more) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                unite_fields(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (slot @ Value::Null, v) => *slot = v.clone(),
        _ => {}
    }
}

/// The part of `v` that is ours (`ours`: our field set at this node) or no one's (not in
/// `theirs`); `None` when the whole node belongs to other managers only.
fn project(
    v: &Value,
    ours: Option<&Map<String, Value>>,
    theirs: Option<&Map<String, Value>>,
) -> Option<Value> {
    if ours.is_some_and(is_leaf) {
        // Owned as a whole (a scalar, or an atomic list, map or struct): every value counts.
        return Some(v.clone());
    }
    // Theirs as a whole, or a member they added (a list item, a map they created) with
    // nothing of ours in it: an apply of ours leaves it alone.
    if ours.is_none() && theirs.is_some_and(|t| is_leaf(t) || t.contains_key(".")) {
        return None;
    }
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, child) in m {
                let name = format!("f:{k}");
                let o = ours.and_then(|f| f.get(&name)).and_then(Value::as_object);
                let t = theirs.and_then(|f| f.get(&name)).and_then(Value::as_object);
                if let Some(p) = project(child, o, t) {
                    out.insert(k.clone(), p);
                }
            }
            Some(Value::Object(out))
        }
        Value::Array(items) => {
            let out = items
                .iter()
                .enumerate()
                .filter_map(|(i, item)| {
                    project(
                        item,
                        item_fields(ours, item, i),
                        item_fields(theirs, item, i),
                    )
                })
                .collect();
            Some(Value::Array(out))
        }
        scalar => Some(scalar.clone()),
    }
}

/// The field set of list item `item` (at position `index`) within the list's field set `f`:
/// by its key (`k:{…}`), its value (`v:…`) or its position (`i:n`).
fn item_fields<'a>(
    f: Option<&'a Map<String, Value>>,
    item: &Value,
    index: usize,
) -> Option<&'a Map<String, Value>> {
    children(f?).find_map(|(k, node)| {
        let hit = if let Some(key) = parse_key(k) {
            item_matches_key(item, &key, false)
        } else if let Some(v) = k.strip_prefix("v:") {
            serde_json::from_str::<Value>(v).is_ok_and(|v| v == *item)
        } else if let Some(i) = k.strip_prefix("i:") {
            i.parse::<usize>() == Ok(index)
        } else {
            false
        };
        if hit { node.as_object() } else { None }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::settled;

    fn obj(spec: serde_json::Value, entries: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "X",
            "metadata": {"name": "x", "resourceVersion": "1", "managedFields": entries},
            "spec": spec})
    }

    fn entry(manager: &str, fields: serde_json::Value) -> serde_json::Value {
        json!({"manager": manager, "operation": "Apply", "apiVersion": "v1",
            "fieldsType": "FieldsV1", "fieldsV1": fields})
    }

    #[test]
    fn what_only_others_own_does_not_count_and_what_we_or_no_one_owns_does() {
        let ours = json!({"f:spec": {"f:a": {}}});
        let theirs = json!({"f:spec": {"f:b": {}}});
        let entries = json!([entry("idem", ours), entry("kubectl", theirs)]);
        let base = settled(
            &obj(json!({"a": 1, "b": 2, "c": 3}), entries.clone()),
            "idem",
        );
        assert!(base.is_some());
        // Theirs changed: no difference for our apply.
        let b = settled(
            &obj(json!({"a": 1, "b": 9, "c": 3}), entries.clone()),
            "idem",
        );
        assert_eq!(base, b);
        // Ours changed, or no one's (derived by the server): different.
        let a = settled(
            &obj(json!({"a": 9, "b": 2, "c": 3}), entries.clone()),
            "idem",
        );
        let c = settled(&obj(json!({"a": 1, "b": 2, "c": 9}), entries), "idem");
        assert_ne!(base, a);
        assert_ne!(base, c);
    }

    #[test]
    fn what_others_wrote_through_a_subresource_does_not_count() {
        let ours = entry(
            "idem",
            json!({"f:metadata": {"f:annotations": {"f:p": {}}}}),
        );
        let mut status = entry(
            "kube-controller-manager",
            json!({"f:metadata": {"f:annotations": {"f:revision": {}}}}),
        );
        status["subresource"] = json!("status");
        let with = |annotations: serde_json::Value, entries: serde_json::Value| {
            let mut o = obj(json!({}), entries);
            o["metadata"]["annotations"] = annotations;
            settled(&o, "idem")
        };
        let created = with(json!({"p": "1"}), json!([ours.clone()]));
        let revised = with(json!({"p": "1", "revision": "1"}), json!([ours, status]));
        assert!(created.is_some());
        assert_eq!(created, revised);
    }

    #[test]
    fn an_item_another_manager_added_does_not_count() {
        let ours = entry(
            "idem",
            json!({"f:spec": {"f:items": {"k:{\"name\":\"a\"}": {".": {}, "f:name": {}}}}}),
        );
        let theirs = entry(
            "mallory",
            json!({"f:spec": {"f:items": {"k:{\"name\":\"m\"}": {".": {}, "f:name": {}}}}}),
        );
        let before = settled(
            &obj(json!({"items": [{"name": "a"}]}), json!([ours.clone()])),
            "idem",
        );
        let after = settled(
            &obj(
                json!({"items": [{"name": "a"}, {"name": "m"}]}),
                json!([ours, theirs]),
            ),
            "idem",
        );
        assert!(before.is_some());
        assert_eq!(before, after);
    }

    #[test]
    fn a_field_another_manager_takes_changes_the_fingerprint() {
        let spec = json!({"a": 1, "b": 2});
        let before = json!([entry("idem", json!({"f:spec": {"f:a": {}, "f:b": {}}})),]);
        let after = json!([
            entry("idem", json!({"f:spec": {"f:a": {}}})),
            entry("kubectl", json!({"f:spec": {"f:b": {}}})),
        ]);
        assert_ne!(
            settled(&obj(spec.clone(), before), "idem"),
            settled(&obj(spec, after), "idem")
        );
    }

    #[test]
    fn keyed_items_are_matched_by_key_and_atomic_values_count_whole() {
        let ours = json!({"f:spec": {"f:ports": {"k:{\"port\":80}": {".": {}, "f:port": {}}},
            "f:templates": {}}});
        let theirs = json!({"f:spec": {"f:ports": {"k:{\"port\":81}": {".": {}, "f:port": {},
            "f:x": {}}}}});
        let entries = json!([entry("idem", ours), entry("other", theirs)]);
        let s = |spec| settled(&obj(spec, entries.clone()), "idem");
        let base = s(json!({"ports": [{"port": 80}, {"port": 81, "x": 1}],
            "templates": [{"mode": "Filesystem"}]}));
        // Their item changed: no difference.
        assert_eq!(
            base,
            s(json!({"ports": [{"port": 80}, {"port": 81, "x": 2}],
                "templates": [{"mode": "Filesystem"}]}))
        );
        // A default inside the value we own whole: different.
        assert_ne!(
            base,
            s(json!({"ports": [{"port": 80}, {"port": 81, "x": 1}],
                "templates": [{"mode": "Block"}]}))
        );
    }

    #[test]
    fn status_and_volatile_metadata_do_not_count() {
        let entries = json!([entry("idem", json!({"f:spec": {"f:a": {}}}))]);
        let mut a = obj(json!({"a": 1}), entries.clone());
        let mut b = obj(json!({"a": 1}), entries);
        a["status"] = json!({"ready": 1});
        b["status"] = json!({"ready": 2});
        b["metadata"]["resourceVersion"] = json!("7");
        b["metadata"]["generation"] = json!(3);
        assert_eq!(settled(&a, "idem"), settled(&b, "idem"));
    }

    #[test]
    fn differences_name_what_the_apply_restored() {
        let before = obj(
            json!({"a": 1, "derived": {"k": "theirs"}}),
            json!([
                entry("idem", json!({"f:spec": {"f:a": {}}})),
                entry("kubectl", json!({"f:spec": {"f:derived": {"f:k": {}}}}))
            ]),
        );
        let after = obj(
            json!({"a": 1, "derived": {"k": "ours"}}),
            json!([entry("idem", json!({"f:spec": {"f:a": {}}}))]),
        );
        let d = super::differences(&before, &after, "idem");
        let paths: Vec<&str> = d.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(paths, [".spec.derived.k"]);
    }

    #[test]
    fn without_an_entry_of_ours_there_is_nothing_to_compare() {
        let entries = json!([entry("kubectl", json!({"f:spec": {"f:a": {}}}))]);
        assert_eq!(settled(&obj(json!({"a": 1}), entries), "idem"), None);
    }
}
