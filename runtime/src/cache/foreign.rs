//! How much of a child is content idem's next apply would not remove: the bytes at fields no
//! field manager of idem's owns, which bound what a child costs the caches.
//!
//! A tenant owner may add to idem's own children (an annotation on a RoleBinding, a key in a
//! ConfigMap's `data`): the server keeps what they add beside idem's fields, up to the object
//! size limit (about 1.5 MB). Such fields belong to the writer that set them by the child's
//! `managedFields`; the convergence check never reads their values. What idem's own entries
//! own (the desired body, however large) is not counted, and neither are fields someone writes
//! under idem's name: the next apply removes those (a field set other than the desired one is
//! judged never applied and applied again).

use std::io::Write;

use serde_json::{Map, Value};

/// The most bytes of a child idem's entries do not own (other writers' fields, their
/// `managedFields` entries, server-set metadata, a `status` the cache keeps) with which the
/// caches keep it whole; above it they keep only a stub and the engine reads the child from
/// the API server when it judges it. Server-set content of a child is a few kilobytes at most
/// (a Deployment's defaults and status); a tenant owner's additions are what exceeds it.
pub(crate) const FOREIGN_BYTES_MAX: usize = 16 * 1024;

/// Whether `obj` (a child as JSON) holds at most [`FOREIGN_BYTES_MAX`] bytes at fields that no
/// main-resource `managedFields` entry of a manager in `ours` owns.
pub(crate) fn within_bound(obj: &Value, ours: impl Fn(&str) -> bool) -> bool {
    // The common case, a child smaller than the bound, costs one count of its text.
    json_len(obj) <= FOREIGN_BYTES_MAX
        || foreign_bytes(obj, ours, FOREIGN_BYTES_MAX) <= FOREIGN_BYTES_MAX
}

/// The bytes of `obj`'s JSON text at fields no main-resource `managedFields` entry of a
/// manager in `ours` owns (a member name counts with its value), counting the other entries
/// whole; the count stops once above `stop`.
fn foreign_bytes(obj: &Value, ours: impl Fn(&str) -> bool, stop: usize) -> usize {
    let Some(top) = obj.as_object() else {
        return json_len(obj);
    };
    let mut owned = Value::Null;
    let mut count = 0;
    let entries = top
        .get("metadata")
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array);
    for e in entries.into_iter().flatten() {
        let mine = e.get("manager").and_then(Value::as_str).is_some_and(&ours)
            && e.get("subresource")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty);
        match e.get("fieldsV1") {
            Some(fields) if mine => crate::compare::unite_fields(&mut owned, fields),
            _ if mine => {}
            _ => count += json_len(e),
        }
    }
    let mut walk = Walk { count, stop };
    let owned = owned.as_object();
    for (k, v) in top {
        walk.add(k.len() + 3);
        match v.as_object() {
            // Its `managedFields` were counted above.
            Some(meta) if k == "metadata" => walk.map(meta, member(owned, k), true),
            _ => walk.value(v, member(owned, k)),
        }
    }
    walk.count
}

/// A count of unowned bytes under way.
struct Walk {
    count: usize,
    stop: usize,
}

impl Walk {
    fn add(&mut self, n: usize) {
        self.count = self.count.saturating_add(n);
    }

    fn done(&self) -> bool {
        self.count > self.stop
    }

    /// Counts `v`, whose owned fields are `fields` (a `fieldsV1` node; `None`: none).
    fn value(&mut self, v: &Value, fields: Option<&Map<String, Value>>) {
        let Some(fields) = fields else {
            self.add(json_len(v));
            return;
        };
        if fields.is_empty() {
            return; // owned whole: a scalar, or an atomic list, map or struct
        }
        match v {
            Value::Object(m) => self.map(m, Some(fields), false),
            Value::Array(items) => self.list(items, fields),
            _ => {}
        }
    }

    /// Counts the members of map `m` (without `managedFields` when `meta`: the entries are
    /// counted apart).
    fn map(&mut self, m: &Map<String, Value>, fields: Option<&Map<String, Value>>, meta: bool) {
        for (k, v) in m {
            if self.done() {
                return;
            }
            if meta && k == "managedFields" {
                continue;
            }
            self.add(k.len() + 3);
            self.value(v, member(fields, k));
        }
    }

    /// Counts the items of a list whose owned items are keyed in `fields` (`k:`, `v:`, `i:`).
    fn list(&mut self, items: &[Value], fields: &Map<String, Value>) {
        let keys: Vec<(Item, &Map<String, Value>)> = fields
            .iter()
            .filter_map(|(k, f)| Some((Item::parse(k)?, f.as_object()?)))
            .collect();
        for (i, item) in items.iter().enumerate() {
            if self.done() {
                return;
            }
            let owned = keys.iter().find(|(key, _)| key.matches(i, item));
            self.add(1);
            self.value(item, owned.map(|(_, f)| *f));
        }
    }
}

/// The owned fields of member `name` of a map whose owned fields are `fields`.
fn member<'a>(
    fields: Option<&'a Map<String, Value>>,
    name: &str,
) -> Option<&'a Map<String, Value>> {
    fields?.get(&format!("f:{name}"))?.as_object()
}

/// A list item's key in a `fieldsV1` set.
enum Item {
    /// `k:{...}`: the item whose members have these values.
    Keyed(Map<String, Value>),
    /// `v:...`: the item of this value (a set).
    Value(Value),
    /// `i:N`: the item at this position (an atomic list's item owned apart: rare).
    Index(usize),
}

impl Item {
    fn parse(key: &str) -> Option<Self> {
        if let Some(k) = key.strip_prefix("k:") {
            return serde_json::from_str(k).ok().map(Self::Keyed);
        }
        if let Some(v) = key.strip_prefix("v:") {
            return serde_json::from_str(v).ok().map(Self::Value);
        }
        key.strip_prefix("i:")?.parse().ok().map(Self::Index)
    }

    fn matches(&self, position: usize, item: &Value) -> bool {
        match self {
            Self::Keyed(key) => key.iter().all(|(k, v)| item.get(k) == Some(v)),
            Self::Value(v) => v == item,
            Self::Index(i) => *i == position,
        }
    }
}

/// The length of `v`'s compact JSON text, counted without building it.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const IDEM: &str = "idem-operator";

    fn ours(m: &str) -> bool {
        m == IDEM
    }

    fn bytes(obj: &Value) -> usize {
        foreign_bytes(obj, ours, usize::MAX)
    }

    /// A ConfigMap idem applied `data.config` of, with `extra` added by `writer`.
    fn config_map(ours_len: usize, extra: &[(&str, usize)], writer: &str) -> Value {
        let mut data = json!({"config": "x".repeat(ours_len)});
        let mut theirs = Map::new();
        for (k, n) in extra {
            data[*k] = json!("y".repeat(*n));
            theirs.insert(format!("f:{k}"), json!({}));
        }
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": "app-config", "namespace": "t-a", "uid": "u", "resourceVersion": "7",
                "managedFields": [
                    {"manager": IDEM, "operation": "Apply", "apiVersion": "v1",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:config": {}}}},
                    {"manager": writer, "operation": "Update", "apiVersion": "v1",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:data": Value::Object(theirs)}},
                ],
            },
            "data": data,
        })
    }

    #[test]
    fn idems_own_fields_cost_nothing_however_large() {
        let small = bytes(&config_map(10, &[], "kubectl"));
        let large = bytes(&config_map(900_000, &[], "kubectl"));
        assert_eq!(small, large);
        assert!(small < 1024, "{small}");
        assert!(within_bound(&config_map(900_000, &[], "kubectl"), ours));
    }

    #[test]
    fn another_writers_key_counts_with_its_value() {
        let base = bytes(&config_map(10, &[], "kubectl"));
        let padded = bytes(&config_map(10, &[("pad", 100_000)], "kubectl"));
        assert!(padded >= base + 100_000, "{base} → {padded}");
        assert!(!within_bound(
            &config_map(10, &[("pad", 100_000)], "kubectl"),
            ours
        ));
        assert!(within_bound(
            &config_map(10, &[("pad", 1_000)], "kubectl"),
            ours
        ));
    }

    #[test]
    fn a_field_written_under_idems_name_is_not_counted() {
        // The next apply removes it (see the module's doc); a status entry under idem's name is
        // not idem's (idem never writes a child's status).
        let obj = config_map(10, &[("pad", 100_000)], IDEM);
        assert!(within_bound(&obj, ours));
        let mut status = obj.clone();
        status["metadata"]["managedFields"][1]["subresource"] = json!("status");
        assert!(!within_bound(&status, ours));
    }

    #[test]
    fn a_value_no_entry_owns_counts() {
        // A server default, or a field whose owner's entry was removed: nobody's.
        let mut obj = config_map(10, &[], "kubectl");
        obj["binaryData"] = json!({"b": "z".repeat(50_000)});
        assert!(bytes(&obj) > 50_000);
    }

    #[test]
    fn list_items_are_owned_by_their_key() {
        let obj = json!({
            "metadata": {"managedFields": [
                {"manager": IDEM, "operation": "Apply", "fieldsV1": {
                    "f:spec": {"f:containers": {
                        "k:{\"name\":\"app\"}": {".": {}, "f:name": {}, "f:image": {}},
                    }, "f:finalizers": {"v:\"a\"": {}}, "f:atomic": {"i:0": {}}},
                }},
            ]},
            "spec": {
                "containers": [
                    {"name": "app", "image": "x".repeat(40_000)},
                    {"name": "sidecar", "image": "s".repeat(5_000)},
                ],
                "finalizers": ["a", "b".repeat(3_000)],
                "atomic": ["c".repeat(2_000), "d".repeat(7_000)],
            },
        });
        let n = bytes(&obj);
        assert!((15_000..16_000).contains(&n), "{n}");
        // An owned item's members idem does not own count.
        let mut more = obj.clone();
        more["spec"]["containers"][0]["args"] = json!(["q".repeat(20_000)]);
        assert!(bytes(&more) >= n + 20_000);
    }

    #[test]
    fn other_managers_entries_count_whole() {
        let mut obj = config_map(10, &[], "kubectl");
        let base = bytes(&obj);
        let fields: Map<String, Value> = (0..2_000)
            .map(|i| (format!("f:k{i:05}"), json!({})))
            .collect();
        obj["metadata"]["managedFields"][1]["fieldsV1"] = json!({"f:data": fields});
        assert!(bytes(&obj) > base + 2_000 * 10);
    }

    #[test]
    fn the_count_stops_past_its_bound() {
        let obj = config_map(10, &[("a", 40_000), ("b", 40_000)], "kubectl");
        assert!(foreign_bytes(&obj, ours, 1_000) < 80_000);
    }
}
