//! Read-repair against another field manager: for every field the reconcile set on every
//! child (its entries in `metadata.managedFields`, KEP-555), another field manager changes it
//! with a JSON merge patch and, in the same write, sets a field of its own (an annotation);
//! reconciling again must restore the field and leave the other manager's field alone.

use std::time::Instant;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
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
    'children: for (ar, child) in h.children(instance).await? {
        let value = serde_json::to_value(&child).map_err(|e| Error::Setup(e.to_string()))?;
        let child_key = key(&value);
        for path in owned_paths(&value) {
            let pointer = to_pointer(&path);
            let Some(new) = value.pointer(&pointer).and_then(tampered_value) else {
                continue;
            };
            let mark = (tampered + 1).to_string();
            let mut patch = nest(&path, new.clone());
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
                    if let Some(original) = value.pointer(&pointer) {
                        let undo = nest(&path, original.clone());
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
    if tampered == 0 {
        r.fail(format!(
            "no field of any child could be tampered with (refused: {refused:?}): nothing proves \
             read-repair"
        ));
    }
    Ok(())
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

/// Every field path the reconcile owns on the object itself (not a subresource), from the
/// `fieldsV1` of its managers' `managedFields` entries: map keys down to leaves; a list
/// (items keyed `k:`/`v:`/`i:`) counts as one field.
pub(crate) fn owned_paths(obj: &Value) -> Vec<Vec<String>> {
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
        !SKIPPED
            .iter()
            .any(|s| p.len() >= s.len() && p.iter().zip(s.iter()).all(|(a, b)| a == b))
    });
    out.sort();
    out.dedup();
    out
}

fn leaves(node: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let Some(map) = node.as_object() else { return };
    let inner: Vec<(&String, &Value)> = map.iter().filter(|(k, _)| *k != ".").collect();
    if inner.is_empty() || inner.iter().any(|(k, _)| !k.starts_with("f:")) {
        if !path.is_empty() {
            out.push(path.clone());
        }
        return;
    }
    for (k, v) in inner {
        path.push(k[2..].to_owned());
        leaves(v, path, out);
        path.pop();
    }
}

fn to_pointer(path: &[String]) -> String {
    path.iter()
        .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
        .collect()
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
/// list without its last item (or with its only item changed). `None` for null and `{}`.
pub(crate) fn tampered_value(v: &Value) -> Option<Value> {
    Some(match v {
        Value::String(s) => Value::String(bump(s)),
        Value::Bool(b) => Value::Bool(!b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Value::from(i.wrapping_add(1)),
            None => Value::from(n.as_f64()? + 1.0),
        },
        Value::Array(items) if items.len() >= 2 => Value::Array(items[..items.len() - 1].to_vec()),
        Value::Array(items) if items.len() == 1 => Value::Array(vec![tampered_value(&items[0])?]),
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
        assert_eq!(tampered_value(&json!(["a"])), Some(json!(["ax"])));
        assert_eq!(tampered_value(&json!({})), None);
        assert_eq!(tampered_value(&json!(null)), None);
    }

    #[test]
    fn owned_paths_come_from_the_reconciles_managers_only() {
        let obj = json!({"metadata": {"managedFields": [
            {"manager": "mine", "operation": "Apply", "fieldsV1": {
                "f:metadata": {"f:labels": {".": {}, "f:a": {}},
                               "f:ownerReferences": {"k:{\"uid\":\"u\"}": {}}},
                "f:data": {"f:x": {}},
                "f:subjects": {}}},
            {"manager": "mine", "operation": "Update", "subresource": "status",
             "fieldsV1": {"f:status": {"f:phase": {}}}},
            {"manager": "kube-controller-manager", "operation": "Update",
             "fieldsV1": {"f:metadata": {"f:annotations": {"f:rev": {}}}}}
        ]}});
        let paths: Vec<String> = owned_paths(&obj).iter().map(|p| to_pointer(p)).collect();
        assert_eq!(paths, ["/data/x", "/metadata/labels/a", "/subjects"]);
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
