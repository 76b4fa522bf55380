//! Read-repair against another field manager: for every field the reconcile set on every
//! child (its entries in `metadata.managedFields`), another field manager changes it
//! with a JSON merge patch and, in the same write, sets a field of its own (an annotation);
//! reconciling again must restore the field and leave the other manager's field alone. Fields
//! holding the server's default (a dry-run create without them gets them back alike) are left
//! out: a create's `Update` entry owns them, yet no reconcile asked for them; so are values
//! created once ([`Subject::created_once`](super::Subject::created_once)), which a reconcile
//! that creates once never writes again.

use std::time::Instant;

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::{Client, ResourceExt};
use serde_json::{Map, Value};

use super::harness::{Harness, Reference, describe};
use super::report::CheckReport;
use super::state::{EndState, key};
use super::{Error, Subject};

/// Field manager of the tampering writes.
pub const TAMPERER: &str = "idem-kit-tamperer";
/// The annotation the tamperer sets as its own field (its value: the tamper's number).
pub const TAMPERER_ANNOTATION: &str = "kit.idem.dev/tamperer-own";
/// Managers whose fields are not the reconcile's: Kubernetes' own components and the tamperer.
const NOT_THE_RECONCILE: [&str; 5] = [
    "kube-controller-manager",
    "kube-scheduler",
    "kube-apiserver",
    "kubelet",
    TAMPERER,
];
/// Fields left alone: identity, and the owner references and finalizers a careless edit of
/// which means "take this child away" or blocks its deletion (a reconcile may rightly let go).
const SKIPPED: [&[&str]; 4] = [
    &["metadata", "name"],
    &["metadata", "namespace"],
    &["metadata", "ownerReferences"],
    &["metadata", "finalizers"],
];

/// Runs the check on the reference instance (it is left tampered-with and repaired).
///
/// # Errors
/// [`Error::Setup`] when the cluster cannot be read or written by the kit.
pub(crate) async fn run<S: Subject>(
    h: &Harness<'_, S>,
    reference: &Reference<S>,
    r: &mut CheckReport,
) -> Result<(), Error> {
    let instance = &reference.instance;
    let expected = children_only(h.state(instance).await?);
    let mut tampered = 0usize;
    let mut refused = Vec::new();
    let mut failures = 0usize;
    let mut defaults = 0usize;
    let mut left_once = 0usize;
    'children: for (ar, child) in h.children(instance).await? {
        let value = serde_json::to_value(&child).map_err(|e| Error::Setup(e.to_string()))?;
        let child_key = key(&value);
        let created_once = h.subject.created_once(&value);
        for path in owned_paths(&value) {
            let Some(pointer) = resolve(&value, &path) else {
                continue;
            };
            if created_once
                .iter()
                .any(|once| super::once::within(&pointer, once))
            {
                left_once += 1;
                continue;
            }
            let Some(new) = value.pointer(&pointer).and_then(tampered_value) else {
                continue;
            };
            if defaulted(&h.admin, &ar, &value, &path).await {
                defaults += 1;
                continue;
            }
            let mark = (tampered + 1).to_string();
            let Some(mut patch) = patch_for(&value, &path, new.clone()) else {
                continue;
            };
            merge(
                &mut patch,
                nest(
                    &[
                        "metadata".into(),
                        "annotations".into(),
                        TAMPERER_ANNOTATION.into(),
                    ],
                    Value::String(mark.clone()),
                ),
            );
            match tamper(&h.admin, &ar, &child, &patch).await {
                Ok(()) => tampered += 1,
                Err(kube::Error::Api(e)) if (400..500).contains(&e.code) => {
                    refused.push(format!("{child_key} {pointer}: {}", e.message));
                    continue;
                }
                Err(e) => return Err(Error::Setup(format!("tampering {child_key}: {e}"))),
            }
            let start = Instant::now();
            loop {
                let pass = h
                    .pass(&reference.session, &reference.probe, instance)
                    .await?;
                let mut state = children_only(h.state(instance).await?);
                let own = take_own(&mut state, &child_key);
                // Children tampered with before keep the tamperer's annotation, rightly.
                let keys: Vec<String> = state.children.keys().cloned().collect();
                for k in keys {
                    take_own(&mut state, &k);
                }
                let mut diffs = state.diff(&expected);
                if own.as_deref() != Some(mark.as_str()) {
                    diffs.push(format!(
                        "the tamperer's own annotation {TAMPERER_ANNOTATION} on {child_key} \
                         is {own:?}, it set {mark:?}"
                    ));
                }
                if diffs.is_empty() {
                    // A controller reconciles again on the watch event of its own repair:
                    // so does the kit, until a pass writes nothing, before the next tamper.
                    if let Err(why) = h
                        .converge(&reference.session, &reference.probe, instance)
                        .await?
                    {
                        failures += 1;
                        r.fail(format!(
                            "after repairing {child_key} {pointer} it does not settle: {why}"
                        ));
                    }
                    break;
                }
                if start.elapsed() >= h.options.repair_timeout {
                    failures += 1;
                    r.fail(format!(
                        "{TAMPERER} set {child_key} {pointer} to {new}; after {:.1} s of \
                         reconciles (the last: {}):\n{}",
                        start.elapsed().as_secs_f64(),
                        describe(&pass),
                        diffs.join("\n")
                    ));
                    if failures >= h.options.max_failures {
                        r.fail(format!("stopped after {failures} fields not repaired"));
                        break 'children;
                    }
                    // Put the field back, so that the next one starts from the reference.
                    let original = value.pointer(&pointer).cloned();
                    if let Some(undo) = original.and_then(|o| patch_for(&value, &path, o)) {
                        tamper(&h.admin, &ar, &child, &undo)
                            .await
                            .map_err(|e| Error::Setup(format!("undoing a tamper: {e}")))?;
                    }
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
    r.figure("fields tampered", tampered);
    r.figure("tampers the API server refused", refused.len());
    r.figure("server defaults left alone", defaults);
    r.figure("created-once values left alone", left_once);
    if tampered == 0 {
        r.fail(format!(
            "no field of any child could be tampered with (refused: {refused:?}): nothing proves \
             read-repair"
        ));
    }
    Ok(())
}

/// Whether the field at `path` of `live` holds what the API server defaults it to: a copy of
/// the object without that field, under another name, created with `dryRun=All` (the server
/// as oracle), gets the same value back. A create records such fields under its manager's
/// `Update` entry although the reconcile never asked for them, so it need not restore them.
async fn defaulted(client: &Client, ar: &ApiResource, live: &Value, path: &[Seg]) -> bool {
    let (Some(pointer), Some((last, parent))) = (resolve(live, path), path.split_last()) else {
        return false;
    };
    let Seg::Field(field) = last else {
        return false;
    };
    let Some(parent_pointer) = resolve(live, parent) else {
        return false;
    };
    let mut body = live.clone();
    let meta = live.get("metadata").cloned().unwrap_or_default();
    let name = format!("{}-kd", meta["name"].as_str().unwrap_or_default());
    body["metadata"] = serde_json::json!({
        "name": name,
        "labels": meta.get("labels").cloned().unwrap_or_default(),
        "annotations": meta.get("annotations").cloned().unwrap_or_default(),
    });
    if let Some(obj) = body.as_object_mut() {
        obj.remove("status");
    }
    if let Some(parent) = body
        .pointer_mut(&parent_pointer)
        .and_then(Value::as_object_mut)
    {
        parent.remove(field);
    }
    let Ok(obj) = serde_json::from_value::<DynamicObject>(body) else {
        return false;
    };
    let namespace = meta.get("namespace").and_then(Value::as_str);
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match api.create(&pp, &obj).await {
        Ok(created) => serde_json::to_value(created)
            .ok()
            .is_some_and(|v| v.pointer(&pointer) == live.pointer(&pointer)),
        Err(_) => false,
    }
}

async fn tamper(
    client: &Client,
    ar: &ApiResource,
    child: &DynamicObject,
    patch: &Value,
) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = match child.namespace() {
        Some(ns) => Api::namespaced_with(client.clone(), &ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    let pp = PatchParams {
        field_manager: Some(TAMPERER.into()),
        ..PatchParams::default()
    };
    api.patch(&child.name_any(), &pp, &Patch::Merge(patch))
        .await
        .map(|_| ())
}

fn children_only(mut state: EndState) -> EndState {
    state.primary = Value::Null;
    state
}

/// Removes the tamperer's annotation from the child `key` and returns its value.
fn take_own(state: &mut EndState, key: &str) -> Option<String> {
    let meta = state.children.get_mut(key)?.get_mut("metadata")?;
    let annotations = meta.get_mut("annotations")?.as_object_mut()?;
    let own = annotations.remove(TAMPERER_ANNOTATION)?;
    if annotations.is_empty() {
        meta.as_object_mut()?.remove("annotations");
    }
    own.as_str().map(str::to_owned)
}

/// One step of a field path: a map key, or the item of an associative list with these key
/// fields (the JSON of a `k:` entry of `fieldsV1`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Seg {
    /// A map key.
    Field(String),
    /// A list item, by its key fields (JSON object text).
    Item(String),
}

/// Every field path the reconcile owns on the object itself (not a subresource), from the
/// `fieldsV1` of its managers' `managedFields` entries: map keys down to leaves; a list counts
/// as one field, and the non-key fields of its `k:`-keyed items are fields too (a key field
/// changed would make another item, owned by the other manager).
pub(crate) fn owned_paths(obj: &Value) -> Vec<Vec<Seg>> {
    let mut out = Vec::new();
    let entries = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for entry in entries {
        let manager = entry.get("manager").and_then(Value::as_str).unwrap_or("");
        let sub = entry
            .get("subresource")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !sub.is_empty() || NOT_THE_RECONCILE.contains(&manager) {
            continue;
        }
        if let Some(fields) = entry.get("fieldsV1") {
            leaves(fields, &mut Vec::new(), &mut out);
        }
    }
    out.retain(|p| {
        !SKIPPED.iter().any(|s| {
            p.len() >= s.len()
                && p.iter()
                    .zip(s.iter())
                    .all(|(a, b)| *a == Seg::Field((*b).to_owned()))
        })
    });
    out.sort();
    out.dedup();
    out
}

fn leaves(node: &Value, path: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    let Some(map) = node.as_object() else { return };
    let inner: Vec<(&String, &Value)> = map.iter().filter(|(k, _)| *k != ".").collect();
    if inner.is_empty() {
        if !path.is_empty() {
            out.push(path.clone());
        }
        return;
    }
    if inner.iter().any(|(k, _)| !k.starts_with("f:")) {
        out.push(path.clone());
        for (k, v) in inner {
            let Some(keys) = k.strip_prefix("k:") else {
                continue;
            };
            let Ok(key_fields) = serde_json::from_str::<Map<String, Value>>(keys) else {
                continue;
            };
            path.push(Seg::Item(keys.to_owned()));
            for (f, fv) in v.as_object().into_iter().flatten() {
                if let Some(name) = f.strip_prefix("f:")
                    && !key_fields.contains_key(name)
                {
                    path.push(Seg::Field(name.to_owned()));
                    leaves(fv, path, out);
                    path.pop();
                }
            }
            path.pop();
        }
        return;
    }
    for (k, v) in inner {
        path.push(Seg::Field(k[2..].to_owned()));
        leaves(v, path, out);
        path.pop();
    }
}

/// The JSON pointer of `path` in `obj` (list items found by their key fields), if present.
pub(crate) fn resolve(obj: &Value, path: &[Seg]) -> Option<String> {
    let mut cur = obj;
    let mut pointer = String::new();
    for seg in path {
        match seg {
            Seg::Field(k) => {
                cur = cur.get(k)?;
                pointer.push('/');
                pointer.push_str(&k.replace('~', "~0").replace('/', "~1"));
            }
            Seg::Item(keys) => {
                let keys: Map<String, Value> = serde_json::from_str(keys).ok()?;
                let items = cur.as_array()?;
                let i = items
                    .iter()
                    .position(|item| keys.iter().all(|(k, v)| item.get(k) == Some(v)))?;
                cur = &items[i];
                pointer.push_str(&format!("/{i}"));
            }
        }
    }
    Some(pointer)
}

/// A JSON merge patch setting `path` of `obj` to `value`: nested maps down to the field, or,
/// inside a list, the whole list (a merge patch replaces lists) with the one item changed.
fn patch_for(obj: &Value, path: &[Seg], value: Value) -> Option<Value> {
    let split = path
        .iter()
        .position(|s| matches!(s, Seg::Item(_)))
        .unwrap_or(path.len());
    let names: Vec<String> = path[..split]
        .iter()
        .filter_map(|s| match s {
            Seg::Field(k) => Some(k.clone()),
            Seg::Item(_) => None,
        })
        .collect();
    if split == path.len() {
        return Some(nest(&names, value));
    }
    let list_pointer = resolve(obj, &path[..split])?;
    let full = resolve(obj, path)?;
    let mut list = obj.pointer(&list_pointer)?.clone();
    *list.pointer_mut(&full[list_pointer.len()..])? = value;
    Some(nest(&names, list))
}

/// `{"a": {"b": value}}` for path `[a, b]`.
fn nest(path: &[String], value: Value) -> Value {
    path.iter().rev().fold(value, |v, k| {
        Value::Object(Map::from_iter([(k.clone(), v)]))
    })
}

/// Deep-merges object `b` into `a`.
fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(am), Value::Object(bm)) => {
            for (k, v) in bm {
                match am.get_mut(&k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        am.insert(k, v);
                    }
                }
            }
        }
        (a, b) => *a = b,
    }
}

/// A different value of the same shape, likely still valid: the last number in a string
/// bumped (`4` → `5`, `8Gi` → `9Gi`), else `x` appended; numbers + 1; booleans flipped; a
/// list without its last item (a changed item of a set or keyed list would be a new item of
/// the other manager's). `None` for null, `[]` and `{}`.
pub(crate) fn tampered_value(v: &Value) -> Option<Value> {
    Some(match v {
        Value::String(s) => Value::String(bump(s)),
        Value::Bool(b) => Value::Bool(!b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Value::from(i.wrapping_add(1)),
            None => Value::from(n.as_f64()? + 1.0),
        },
        Value::Array(items) if !items.is_empty() => Value::Array(items[..items.len() - 1].to_vec()),
        Value::Object(map) => {
            let (k, first) = map.iter().next()?;
            let mut map = map.clone();
            map.insert(k.clone(), tampered_value(first)?);
            Value::Object(map)
        }
        _ => return None,
    })
}

fn bump(s: &str) -> String {
    let bytes = s.as_bytes();
    let Some(end) = bytes.iter().rposition(u8::is_ascii_digit).map(|i| i + 1) else {
        return format!("{s}x");
    };
    let start = bytes[..end]
        .iter()
        .rposition(|b| !b.is_ascii_digit())
        .map_or(0, |i| i + 1)
        .max(end.saturating_sub(9));
    let n: u64 = s[start..end].parse().unwrap_or(0);
    format!("{}{}{}", &s[..start], n + 1, &s[end..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tampered_values_differ_and_keep_their_shape() {
        assert_eq!(bump("4"), "5");
        assert_eq!(bump("8Gi"), "9Gi");
        assert_eq!(bump("100m"), "101m");
        assert_eq!(bump("9"), "10");
        assert_eq!(bump("alice"), "alicex");
        assert_eq!(tampered_value(&json!(true)), Some(json!(false)));
        assert_eq!(tampered_value(&json!(["a", "b"])), Some(json!(["a"])));
        assert_eq!(tampered_value(&json!(["a"])), Some(json!([])));
        assert_eq!(tampered_value(&json!({})), None);
        assert_eq!(tampered_value(&json!(null)), None);
    }

    #[test]
    fn owned_paths_come_from_the_reconciles_managers_only() {
        let mut obj = json!({"metadata": {"managedFields": [
            {"manager": "mine", "operation": "Apply", "fieldsV1": {
                "f:metadata": {"f:labels": {".": {}, "f:a": {}},
                               "f:ownerReferences": {"k:{\"uid\":\"u\"}": {}}},
                "f:data": {"f:x": {}},
                "f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:name": {}, "f:image": {}}},
                "f:subjects": {}}},
            {"manager": "mine", "operation": "Update", "subresource": "status",
             "fieldsV1": {"f:status": {"f:phase": {}}}},
            {"manager": "kube-controller-manager", "operation": "Update",
             "fieldsV1": {"f:metadata": {"f:annotations": {"f:rev": {}}}}}
        ]}, "data": {"x": "1"}, "subjects": [],
            "containers": [{"name": "side", "image": "b:1"}, {"name": "app", "image": "a:1"}]});
        obj["metadata"]["labels"] = json!({"a": "v"});
        let paths: Vec<String> = owned_paths(&obj)
            .iter()
            .filter_map(|p| resolve(&obj, p))
            .collect();
        assert_eq!(
            paths,
            [
                "/containers",
                "/containers/1/image",
                "/data/x",
                "/metadata/labels/a",
                "/subjects"
            ]
        );
        let image = owned_paths(&obj)
            .into_iter()
            .find(|p| resolve(&obj, p).as_deref() == Some("/containers/1/image"))
            .unwrap();
        assert_eq!(
            patch_for(&obj, &image, json!("a:2")),
            Some(json!({"containers": [{"name": "side", "image": "b:1"},
                                       {"name": "app", "image": "a:2"}]}))
        );
    }

    #[test]
    fn patches_nest_and_merge() {
        let mut p = nest(&["data".into(), "x".into()], json!("2"));
        merge(
            &mut p,
            nest(
                &["metadata".into(), "annotations".into(), "k".into()],
                json!("1"),
            ),
        );
        assert_eq!(
            p,
            json!({"data": {"x": "2"}, "metadata": {"annotations": {"k": "1"}}})
        );
    }
}
