//! The end state the checks compare: the primary object (with its status) and its children,
//! without what the API server or other controllers change on their own.

use std::collections::BTreeMap;

use serde_json::Value;

/// Metadata the API server sets on every write (or once): never part of an end state.
const VOLATILE_METADATA: [&str; 6] = [
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
];

/// At most this many differences are listed per comparison (the rest are counted).
const MAX_DIFFS: usize = 20;

/// A snapshot of one instance: its primary object and its children, each stripped of
/// the metadata the API server sets on every write (uid, resourceVersion, creationTimestamp,
/// generation, managedFields, selfLink); children also without `status` (other controllers
/// write it: quota usage, namespace phase, …), the primary with it.
#[derive(Clone, Debug, PartialEq)]
pub struct EndState {
    /// The primary object.
    pub primary: Value,
    /// Each child by `apiVersion kind namespace/name`.
    pub children: BTreeMap<String, Value>,
}

impl EndState {
    /// Builds an end state from the live objects (as the API server returns them).
    ///
    /// A child's uid quoted elsewhere (say, in the primary's record of the children it created)
    /// becomes `{uid of <child's key>}`: it differs between instances as the uid itself does,
    /// while which child it names is kept.
    pub(crate) fn new(mut primary: Value, children: Vec<Value>) -> Self {
        let uids: BTreeMap<String, String> = children
            .iter()
            .filter_map(|c| {
                let uid = c.pointer("/metadata/uid")?.as_str()?;
                Some((uid.to_owned(), format!("{{uid of {}}}", key(c))))
            })
            .collect();
        strip(&mut primary, false);
        name_uids(&mut primary, &uids);
        let children = children
            .into_iter()
            .map(|mut c| {
                strip(&mut c, true);
                name_uids(&mut c, &uids);
                (key(&c), c)
            })
            .collect();
        Self { primary, children }
    }

    /// Whether a child is being deleted (has a `deletionTimestamp`).
    pub fn terminating(&self) -> bool {
        (self.children.values()).any(|c| c.pointer("/metadata/deletionTimestamp").is_some())
    }

    /// The same end state with the instance's name and uid replaced by `{name}` / `{uid}`
    /// and every timestamp by `{time}`, so that instances made at different times under
    /// different names compare equal when they converged alike.
    pub fn anonymized(&self, name: &str, uid: &str) -> Self {
        let fix = |v: &Value| anonymize(v, name, uid);
        Self {
            primary: fix(&self.primary),
            children: self
                .children
                .iter()
                .map(|(k, v)| (replace(k, name, uid), fix(v)))
                .collect(),
        }
    }

    /// The differences from `expected` to `self`, one line each (`JSON pointer: expected →
    /// actual`), the first few listed (the rest counted); empty when equal.
    pub fn diff(&self, expected: &Self) -> Vec<String> {
        let mut out = Vec::new();
        diff_values("primary", &expected.primary, &self.primary, &mut out);
        for (k, v) in &expected.children {
            match self.children.get(k) {
                None => out.push(format!("missing child {k}")),
                Some(actual) => diff_values(&format!("child {k}"), v, actual, &mut out),
            }
        }
        for k in self.children.keys() {
            if !expected.children.contains_key(k) {
                out.push(format!("extra child {k} (a duplicate or an orphan)"));
            }
        }
        if out.len() > MAX_DIFFS {
            let more = out.len() - MAX_DIFFS;
            out.truncate(MAX_DIFFS);
            out.push(format!("… and {more} more differences"));
        }
        out
    }
}

/// `apiVersion kind namespace/name` of an object.
pub(crate) fn key(obj: &Value) -> String {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or("");
    let ns = s("/metadata/namespace");
    let name = s("/metadata/name");
    let at = if ns.is_empty() {
        name.to_owned()
    } else {
        format!("{ns}/{name}")
    };
    format!("{} {} {at}", s("/apiVersion"), s("/kind"))
}

/// Replaces every string equal to a key of `uids` by its value.
fn name_uids(v: &mut Value, uids: &BTreeMap<String, String>) {
    match v {
        Value::String(s) => {
            if let Some(named) = uids.get(s.as_str()) {
                *s = named.clone();
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| name_uids(i, uids)),
        Value::Object(map) => map.values_mut().for_each(|i| name_uids(i, uids)),
        _ => {}
    }
}

fn strip(obj: &mut Value, drop_status: bool) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in VOLATILE_METADATA {
            meta.remove(k);
        }
        if meta.contains_key("deletionTimestamp") {
            meta.insert("deletionTimestamp".into(), Value::String("{set}".into()));
        }
    }
    if drop_status && let Some(map) = obj.as_object_mut() {
        map.remove("status");
    }
}

fn replace(s: &str, name: &str, uid: &str) -> String {
    let s = if uid.is_empty() {
        s.to_owned()
    } else {
        s.replace(uid, "{uid}")
    };
    if name.is_empty() {
        s
    } else {
        s.replace(name, "{name}")
    }
}

fn anonymize(v: &Value, name: &str, uid: &str) -> Value {
    match v {
        Value::String(s) => Value::String(replace(s, name, uid)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|i| anonymize(i, name, uid)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if is_time_key(k) && v.is_string() {
                        Value::String("{time}".into())
                    } else if is_bucket_label(k) && v.is_string() {
                        Value::String("{bucket}".into())
                    } else {
                        anonymize(v, name, uid)
                    };
                    (replace(k, name, uid), v)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Whether `k` is one of idem's sharding labels, whose values are hashes of the owner's uid
/// (the runtime's `<prefix>/shard-bucket`, under any owner kind's prefix) or of a namespace's
/// name (the operator's tenant Namespaces): they differ between instances as their uids and
/// names do, and are anonymised as `{bucket}`.
fn is_bucket_label(k: &str) -> bool {
    k.ends_with("/shard-bucket") || k == "tenancy.idem.dev/namespace-bucket"
}

/// `lastTransitionTime`, `lastUpdateTime`, `creationTimestamp`, …: Kubernetes' naming of
/// timestamp fields (API conventions: "…Time" / "…Timestamp").
fn is_time_key(k: &str) -> bool {
    k.ends_with("Time") || k.ends_with("Timestamp")
}

fn pointer_escape(k: &str) -> String {
    k.replace('~', "~0").replace('/', "~1")
}

/// A value in a difference: at most 300 characters, cut with `…`.
fn shown(v: &Value) -> String {
    super::report::clip(&v.to_string(), 300)
}

/// Appends `what/pointer: expected → actual` lines for every difference.
pub(crate) fn diff_values(what: &str, expected: &Value, actual: &Value, out: &mut Vec<String>) {
    fn walk(what: &str, path: &str, e: &Value, a: &Value, out: &mut Vec<String>) {
        match (e, a) {
            (Value::Object(em), Value::Object(am)) => {
                for (k, ev) in em {
                    let p = format!("{path}/{}", pointer_escape(k));
                    match am.get(k) {
                        Some(av) => walk(what, &p, ev, av, out),
                        None => out.push(format!("{what} {p}: {} → (absent)", shown(ev))),
                    }
                }
                for (k, av) in am {
                    if !em.contains_key(k) {
                        let p = format!("{path}/{}", pointer_escape(k));
                        out.push(format!("{what} {p}: (absent) → {}", shown(av)));
                    }
                }
            }
            (Value::Array(ea), Value::Array(aa)) if ea.len() == aa.len() => {
                for (i, (ev, av)) in ea.iter().zip(aa).enumerate() {
                    walk(what, &format!("{path}/{i}"), ev, av, out);
                }
            }
            _ if e != a => out.push(format!("{what} {path}: {} → {}", shown(e), shown(a))),
            _ => {}
        }
    }
    walk(what, "", expected, actual, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A child of the primary object `w-1` (uid `u-1`).
    fn child(name: &str, data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "ns", "uid": "x", "resourceVersion": "7",
                            "ownerReferences": [{"uid": "u-1", "name": "w-1"}]},
               "data": data, "status": {"ignored": true}})
    }

    #[test]
    fn a_childs_uid_quoted_in_the_primary_names_the_child() {
        let state = |uid: &str| {
            EndState::new(
                json!({"metadata": {"name": "w-1", "uid": "u-1"},
                       "status": {"created": [{"name": "w-1-a", "uid": uid}]}}),
                vec![
                    child("w-1-a", json!({"v": "1"}))
                        .to_string()
                        .replace("\"x\"", &format!("\"{uid}\""))
                        .parse()
                        .unwrap(),
                ],
            )
            .anonymized("w-1", "u-1")
        };
        let a = state("c-1");
        assert_eq!(a.diff(&state("c-2")), Vec::<String>::new());
        assert_eq!(
            a.primary["status"]["created"][0]["uid"],
            "{uid of v1 ConfigMap ns/{name}-a}"
        );
        let missing = EndState::new(
            json!({"metadata": {"name": "w-1", "uid": "u-1"}, "status": {"created": []}}),
            vec![child("w-1-a", json!({"v": "1"}))],
        )
        .anonymized("w-1", "u-1");
        assert_eq!(
            missing.diff(&a).len(),
            1,
            "a record without the child differs"
        );
    }

    #[test]
    fn bucket_labels_are_anonymised_and_other_labels_kept() {
        let labels = |bucket: &str| {
            json!({"metadata": {"labels": {"tenancy.idem.dev/shard-bucket": bucket,
                                           "tenancy.idem.dev/namespace-bucket": bucket,
                                           "tier": bucket}}})
        };
        let a = anonymize(&labels("17"), "w-1", "u-1");
        assert_eq!(
            a,
            json!({"metadata": {"labels": {"tenancy.idem.dev/shard-bucket": "{bucket}",
                                           "tenancy.idem.dev/namespace-bucket": "{bucket}",
                                           "tier": "17"}}})
        );
        assert_ne!(a, anonymize(&labels("226"), "w-1", "u-1"), "tier differs");
    }

    #[test]
    fn instances_alike_compare_equal_and_differences_are_named() {
        let primary = |name: &str, uid: &str, t: &str| {
            json!({"metadata": {"name": name, "uid": uid},
                   "status": {"conditions": [{"type": "Ready", "lastTransitionTime": t}]}})
        };
        let a = EndState::new(
            primary("w-1", "u-1", "2026-01-01T00:00:00Z"),
            vec![child("w-1-a", json!({"v": "1"}))],
        )
        .anonymized("w-1", "u-1");
        let b = EndState::new(
            primary("w-2", "u-2", "2026-01-01T00:00:05Z"),
            vec![
                child("w-2-a", json!({"v": "1"}))
                    .to_string()
                    .replace("u-1", "u-2")
                    .replace("w-1", "w-2")
                    .parse()
                    .unwrap(),
            ],
        )
        .anonymized("w-2", "u-2");
        assert_eq!(a.diff(&a), Vec::<String>::new());
        assert_eq!(b.diff(&a), Vec::<String>::new());

        let c = EndState::new(
            primary("w-3", "u-3", "2026-01-01T00:00:00Z"),
            vec![
                child("w-3-a", json!({"v": "2"})),
                child("w-3-zz", json!({})),
            ],
        )
        .anonymized("w-3", "u-3");
        let diffs = c.diff(&a);
        assert!(
            diffs.iter().any(|d| d.contains("/data/v: \"1\" → \"2\"")),
            "{diffs:?}"
        );
        assert!(
            diffs
                .iter()
                .any(|d| d.contains("/metadata/ownerReferences/0/uid")),
            "an ownerReference to another object is a difference: {diffs:?}"
        );
        assert!(
            diffs
                .iter()
                .any(|d| d.starts_with("extra child v1 ConfigMap ns/{name}-zz")),
            "{diffs:?}"
        );
    }

    #[test]
    fn volatile_metadata_and_child_status_are_not_compared() {
        let s = EndState::new(
            json!({"metadata": {"uid": "1"}}),
            vec![child("a", json!({}))],
        );
        let c = &s.children["v1 ConfigMap ns/a"];
        assert!(c.get("status").is_none());
        assert!(c.pointer("/metadata/resourceVersion").is_none());
        assert!(s.primary.pointer("/metadata/uid").is_none());
    }
}
