//! How much of a child is content idem's next apply would not remove: the bytes at fields no
//! field manager of idem's owns, which bound what a child costs the caches.
//!
//! A tenant owner may add to idem's own children (an annotation on a RoleBinding, a key in a
//! ConfigMap's `data`): the server keeps what they add beside idem's fields, up to the object
//! size limit (about 1.5 MB). Such fields belong to the writer that set them by the child's
//! `managedFields`; the convergence check never reads their values. What idem's own entries
//! own (the desired body, however large) is not counted, and neither are fields someone writes
//! under idem's name in the entry the convergence check judges (idem's `Apply` entry, or the
//! `Update` entry of its create while it never applied): a field set other than the desired
//! one is judged never applied, and the next apply removes them (a create's entry, which also
//! records the server's defaults, is judged so once it holds more than [`FOREIGN_BYTES_MAX`]
//! bytes beyond the desired body: [`bytes_beyond`]). Two things idem's entries hold do count:
//! a map or list an entry owns whole (an atomic value, or a granular map claimed whole, which
//! the caches cannot tell apart without the schema), by its size; and paths of an entry that
//! lead to nothing in the object, or list keys naming an item another key of the entry names
//! (anyone may rewrite `managedFields`), by their text. `status`
//! is not counted (written through the status subresource, by controllers, not by the
//! tenant's owners); the entries of a subresource count by their size.

use std::io::Write;

use serde_json::{Map, Value};

/// The most bytes of a child idem's entries do not own (other writers' fields and their
/// `managedFields` entries, server-set metadata and defaults) with which the caches keep it
/// whole; above it they keep only a stub and the engine reads the child from the API server
/// when it judges it. Server-set content of a child is a few kilobytes at most (a Deployment's
/// defaults); a tenant owner's additions are what exceeds it.
pub(crate) const FOREIGN_BYTES_MAX: usize = 16 * 1024;

/// Whether `obj` (a child as JSON) holds at most [`FOREIGN_BYTES_MAX`] bytes at fields that
/// idem's field managers (those `ours` accepts) do not own.
pub(crate) fn within_bound(obj: &Value, ours: impl Fn(&str) -> bool) -> bool {
    // The common case, a child smaller than the bound, costs one count of its text.
    json_len(obj) <= FOREIGN_BYTES_MAX
        || foreign_bytes(obj, ours, FOREIGN_BYTES_MAX) <= FOREIGN_BYTES_MAX
}

/// The bytes of `obj`'s JSON text (without `status`) at fields idem's main-resource
/// `managedFields` entries do not own: its `Apply` entries once it has one, else its `Update`
/// entries (a child created and never applied to). Every other main-resource entry counts
/// whole; so do a map or list idem owns whole (a struct idem created empty, into which someone
/// wrote, counts), and the paths of idem's entries that lead to nothing. The count stops once
/// above `stop`.
fn foreign_bytes(obj: &Value, ours: impl Fn(&str) -> bool, stop: usize) -> usize {
    let Some(top) = obj.as_object() else {
        return json_len(obj);
    };
    let mut walk = Walk { count: 0, stop };
    let all = top
        .get("metadata")
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    let main = |e: &&Value| {
        e.get("subresource")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    };
    // An entry of a subresource (status) owns nothing counted below, but is kept in the
    // cached text: its size counts.
    for e in all.clone().filter(|e| !main(e)) {
        walk.add(json_len(e));
    }
    let entries: Vec<&Value> = all.filter(main).collect();
    let field = |e: &Value, f: &str| e.get(f).and_then(Value::as_str).map(str::to_owned);
    let idem = |e: &Value| field(e, "manager").is_some_and(|m| ours(&m));
    let apply = |e: &Value| field(e, "operation").as_deref() == Some("Apply");
    let applied = entries.iter().any(|e| idem(e) && apply(e));
    let (mut owned, mut theirs) = (Value::Null, Value::Null);
    for e in entries {
        let fields = e.get("fieldsV1").unwrap_or(&Value::Null);
        if idem(e)
            && let Some(f) = fields.as_object()
        {
            // Paths to nothing cost nothing below, yet stay in the cached text.
            walk.dangling(obj, f);
        }
        if idem(e) && (!applied || apply(e)) {
            crate::compare::unite_fields(&mut owned, fields);
        } else {
            if !idem(e) {
                // idem's create entry beside its Apply entry lists idem's own fields, mostly:
                // the values at fields it alone lists count, not its size.
                walk.add(json_len(e));
            }
            crate::compare::unite_fields(&mut theirs, fields);
        }
    }
    let (owned, theirs) = (owned.as_object(), theirs.as_object());
    for (k, v) in top {
        match (k.as_str(), v.as_object()) {
            ("status", _) => {}
            ("metadata", Some(meta)) => {
                walk.add(k.len() + 3);
                walk.map(meta, member(owned, k), member(theirs, k), "managedFields");
            }
            _ => walk.member(k, v, member(owned, k), member(theirs, k)),
        }
    }
    walk.count
}

/// The bytes of `obj`'s JSON text at the fields of set `owned` (a `fieldsV1` set) that set
/// `judged` does not hold, at the members `owned` holds whole (`{}`) what `obj` has there
/// beyond the `desired` body, and the text of `owned`'s paths to nothing in `obj`, counted
/// until above `stop`: what an entry of idem's owns beyond what the convergence check judges
/// of it.
///
/// Of idem's create entry, the first are the server's defaults (a few hundred bytes) and
/// whatever was written under idem's name since (see [`crate::apply::as_applied`]). The second
/// are what was written into a map or list an entry claims whole: an atomic value holds what
/// idem desired (anything else is drift), but an entry rewritten to claim a granular map whole
/// (`"f:data": {}`) hides what others wrote in it from the check, which sees only its own
/// keys, and from the caches' count ([`within_bound`]).
pub(crate) fn bytes_beyond(
    obj: &Value,
    owned: &Value,
    judged: &Value,
    desired: &Value,
    stop: usize,
) -> usize {
    let mut walk = Walk { count: 0, stop };
    if let Some(owned) = owned.as_object() {
        walk.beyond(obj, Some(desired), owned, judged.as_object());
    }
    walk.count
}

/// A count of unowned bytes under way.
struct Walk {
    count: usize,
    stop: usize,
}

/// A `fieldsV1` node: the fields owned at and below a value.
type Fields<'a> = Option<&'a Map<String, Value>>;

impl Walk {
    fn add(&mut self, n: usize) {
        self.count = self.count.saturating_add(n);
    }

    fn done(&self) -> bool {
        self.count > self.stop
    }

    /// Counts member `k` of a map, `v`, whose fields idem owns are `ours` and others list
    /// `theirs`: whole (with its name) when idem owns nothing at or below it.
    fn member(&mut self, k: &str, v: &Value, ours: Fields, theirs: Fields) {
        match ours {
            None => self.add(k.len() + 3 + json_len(v)),
            Some(ours) => self.value(v, ours, theirs),
        }
    }

    /// Counts `v`, at or below which idem owns `ours`.
    fn value(&mut self, v: &Value, ours: &Map<String, Value>, theirs: Fields) {
        if ours.is_empty() {
            // Owned whole: a scalar costs nothing, a map or list its size. Without the schema
            // an atomic value idem desires cannot be told from a granular map its entry claims
            // whole (an empty map it desired, or an entry rewritten so), into which others
            // wrote what no entry lists: counted, the former costs a read when judged, which
            // is the safe side.
            if matches!(v, Value::Object(_) | Value::Array(_)) {
                self.add(json_len(v));
            }
            return;
        }
        match v {
            Value::Object(m) => self.map(m, Some(ours), theirs, ""),
            Value::Array(items) => self.list(items, ours, theirs),
            _ => {}
        }
    }

    /// Counts the members of map `m` (but member `skip`).
    fn map(&mut self, m: &Map<String, Value>, ours: Fields, theirs: Fields, skip: &str) {
        for (k, v) in m {
            if self.done() {
                return;
            }
            if k != skip {
                self.member(k, v, member(ours, k), member(theirs, k));
            }
        }
    }

    /// Counts the items of a list whose items idem owns are keyed in `ours` (`k:`, `v:`, `i:`;
    /// each key owns the first item it matches, as the server keeps one item per key).
    fn list(&mut self, items: &[Value], ours: &Map<String, Value>, theirs: Fields) {
        let mut keys: Vec<(Item, &Map<String, Value>, bool)> = keyed(Some(ours))
            .map(|(item, f)| (item, f, false))
            .collect();
        let their_keys: Vec<(Item, &Map<String, Value>)> = keyed(theirs).collect();
        for (i, item) in items.iter().enumerate() {
            if self.done() {
                return;
            }
            let owned = keys
                .iter_mut()
                .find(|(key, _, used)| !*used && key.matches(i, item));
            match owned {
                Some((_, f, used)) => {
                    *used = true;
                    let f = *f;
                    let t = their_keys
                        .iter()
                        .find(|(key, _)| key.matches(i, item))
                        .map(|(_, t)| *t);
                    self.value(item, f, t);
                }
                None => self.add(1 + json_len(item)),
            }
        }
    }

    /// Counts the paths of `fields` (an entry's `fieldsV1` set) that lead to nothing in `v`:
    /// a member it lacks, anything below a scalar, or a list key whose item an earlier key of
    /// the same entry names (the server keeps one entry's set as written, and one key per item
    /// is all an apply records).
    fn dangling(&mut self, v: &Value, fields: &Map<String, Value>) {
        let mut named: Vec<usize> = Vec::new();
        for (k, below) in fields {
            if self.done() {
                return;
            }
            if k == "." {
                continue;
            }
            let found = match k.strip_prefix("f:") {
                Some(name) => v.as_object().and_then(|m| m.get(name)),
                None => Item::parse(k)
                    .and_then(|item| item.position(v))
                    .filter(|i| !named.contains(i))
                    .and_then(|i| {
                        named.push(i);
                        v.as_array()?.get(i)
                    }),
            };
            match (found, below.as_object()) {
                (None, _) => self.add(k.len() + 3 + json_len(below)),
                (Some(value), Some(below)) if !below.is_empty() => self.dangling(value, below),
                _ => {}
            }
        }
    }

    /// Counts the values in `v` at the fields of `owned` that `judged` does not hold, below a
    /// member `owned` holds whole what `v` has beyond `desired` (the desired value at the same
    /// place), and the text of `owned`'s paths to nothing.
    fn beyond(
        &mut self,
        v: &Value,
        desired: Option<&Value>,
        owned: &Map<String, Value>,
        judged: Fields,
    ) {
        if owned.is_empty() {
            // An empty map or list desired is recorded whole by the apply itself: applying it
            // again changes nothing, and what others wrote inside counts in the caches.
            let empty = |d: &Value| match d {
                Value::Object(m) => m.is_empty(),
                Value::Array(a) => a.is_empty(),
                _ => false,
            };
            if matches!(v, Value::Object(_) | Value::Array(_)) && !desired.is_some_and(empty) {
                self.add(json_len(v).saturating_sub(desired.map_or(0, json_len)));
            }
            return;
        }
        for (k, below) in owned {
            if self.done() {
                return;
            }
            let Some(below) = below.as_object().filter(|_| k != ".") else {
                continue;
            };
            let judged_below = judged.and_then(|j| j.get(k)).and_then(Value::as_object);
            let at = |walk: &mut Self, extra: usize, value: &Value, desired: Option<&Value>| {
                match judged_below {
                    None => walk.add(extra + json_len(value)),
                    Some(j) => walk.beyond(value, desired, below, Some(j)),
                }
            };
            let found = match k.strip_prefix("f:") {
                Some(name) => v
                    .get(name)
                    .map(|value| (value, name.len() + 3, desired.and_then(|d| d.get(name)))),
                None => Item::parse(k)
                    .and_then(|item| Some((item.find(Some(v))?, 1, item.find(desired)))),
            };
            match found {
                Some((value, extra, desired)) => at(self, extra, value, desired),
                // A path to nothing (written into `managedFields`): its text.
                None => self.add(k.len() + 3 + json_len(below)),
            }
        }
    }
}

/// The owned fields of member `name` of a map whose owned fields are `fields`.
fn member<'a>(fields: Fields<'a>, name: &str) -> Fields<'a> {
    fields?.get(&format!("f:{name}"))?.as_object()
}

/// The list item keys of `fields`, with the fields below each.
fn keyed(fields: Fields<'_>) -> impl Iterator<Item = (Item, &Map<String, Value>)> {
    fields
        .into_iter()
        .flatten()
        .filter_map(|(k, f)| Some((Item::parse(k)?, f.as_object()?)))
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

    /// The first item of `list` this key names.
    fn find<'v>(&self, list: Option<&'v Value>) -> Option<&'v Value> {
        let list = list?;
        list.as_array()?.get(self.position(list)?)
    }

    /// The position in `list` of the first item this key names.
    fn position(&self, list: &Value) -> Option<usize> {
        (list.as_array()?.iter().enumerate()).position(|(i, value)| self.matches(i, value))
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
fn json_len(v: &(impl serde::Serialize + ?Sized)) -> usize {
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
    fn idems_own_scalar_fields_cost_nothing_however_large() {
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
    fn what_the_judged_entry_under_idems_name_holds_is_not_counted_and_the_rest_is() {
        // Beside idem's Apply entry, an Update entry under its name is not judged (the next
        // apply would not remove its fields): what it alone lists counts. In the Apply entry
        // it would be judged.
        let obj = config_map(10, &[("pad", 100_000)], IDEM);
        assert!(!within_bound(&obj, ours));
        let mut applied = obj.clone();
        applied["metadata"]["managedFields"][1]["operation"] = json!("Apply");
        assert!(within_bound(&applied, ours));
        // Never applied (created by POST): its create's Update entry is the judged one.
        let mut created = obj.clone();
        created["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .remove(0);
        assert!(within_bound(&created, ours));
    }

    #[test]
    fn idems_create_entry_beside_its_apply_entry_costs_nothing_for_what_both_list() {
        // A large field set (1,000 keys) that both idem's create entry and its Apply entry
        // list: the Update entry's size does not count.
        let keys: Map<String, Value> = (0..1_000)
            .map(|i| (format!("f:key-{i:04}"), json!({})))
            .collect();
        let data: Map<String, Value> = (0..1_000)
            .map(|i| (format!("key-{i:04}"), json!("v")))
            .collect();
        let entry = |op: &str| json!({"manager": IDEM, "operation": op, "fieldsV1": {"f:data": keys.clone()}});
        let obj = json!({
            "metadata": {"managedFields": [entry("Update"), entry("Apply")]},
            "data": data,
        });
        assert!(bytes(&obj) < 100, "{}", bytes(&obj));
    }

    #[test]
    fn status_is_not_counted() {
        let mut obj = config_map(10, &[], "kubectl");
        let base = bytes(&obj);
        obj["status"] = json!({"used": "u".repeat(50_000)});
        obj["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .push(
                json!({"manager": "kube-controller-manager", "operation": "Update",
                         "subresource": "status",
                         "fieldsV1": {"f:status": {"f:used": {}}}}),
            );
        // The status entry counts by its size, the status itself not at all.
        let entry_len = json_len(
            obj["metadata"]["managedFields"]
                .as_array()
                .unwrap()
                .last()
                .unwrap(),
        );
        assert_eq!(bytes(&obj), base + entry_len);
    }

    #[test]
    fn subresource_entries_count_by_their_size() {
        let mut obj = config_map(10, &[], "kubectl");
        let key = "k".repeat(14_000);
        for i in 0..3 {
            obj["metadata"]["managedFields"]
                .as_array_mut()
                .unwrap()
                .push(json!({"manager": format!("m{i}"), "operation": "Apply",
                             "subresource": "status",
                             "fieldsV1": {format!("f:{key}"): {}}}));
        }
        assert!(!within_bound(&obj, ours));
    }

    #[test]
    fn what_others_write_inside_a_struct_idem_made_empty_counts() {
        // A create's entry owns `securityContext: {}` as a leaf; someone writes into it.
        let obj = |groups: usize| {
            json!({
                "metadata": {"managedFields": [
                    {"manager": IDEM, "operation": "Update", "fieldsV1": {
                        "f:spec": {"f:securityContext": {}, "f:image": {}}}},
                    {"manager": "kubectl-patch", "operation": "Update", "fieldsV1": {
                        "f:spec": {"f:securityContext": {"f:supplementalGroups": {}}}}},
                ]},
                "spec": {"image": "x".repeat(30_000),
                         "securityContext": {"supplementalGroups": vec![12_345; groups]}},
            })
        };
        assert!(bytes(&obj(0)) < 1_000, "{}", bytes(&obj(0)));
        assert!(bytes(&obj(10_000)) > 60_000, "{}", bytes(&obj(10_000)));
        assert!(within_bound(&obj(0), ours));
        assert!(!within_bound(&obj(10_000), ours));
    }

    #[test]
    fn a_key_owns_one_item() {
        let obj = |copies: usize| {
            json!({
                "metadata": {"managedFields": [
                    {"manager": IDEM, "operation": "Apply", "fieldsV1": {
                        "f:env": {"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}}}},
                ]},
                "env": vec![json!({"name": "A", "value": "v".repeat(10_000)}); copies],
            })
        };
        assert!(bytes(&obj(1)) < 1_000);
        assert!(bytes(&obj(3)) > 20_000);
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
    fn bytes_beyond_count_what_one_set_owns_and_the_other_does_not_hold() {
        let obj = json!({
            "data": {"a": "x", "pad": "p".repeat(1_000)},
            "spec": {"containers": [{"name": "app", "image": "i", "args": ["q".repeat(500)]}],
                     "securityContext": {"runAsUser": 1}},
        });
        let owned = json!({
            "f:data": {".": {}, "f:a": {}, "f:pad": {}},
            "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {
                ".": {}, "f:name": {}, "f:image": {}, "f:args": {}}},
                "f:securityContext": {"f:runAsUser": {}}},
        });
        let judged = json!({
            "f:data": {"f:a": {}},
            "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {"f:name": {}, "f:image": {}}},
                       "f:securityContext": {}},
        });
        let n = bytes_beyond(&obj, &owned, &judged, &obj, usize::MAX);
        // `pad` (1,000), `args` (500) and `runAsUser` below a struct judged whole.
        assert!((1_500..1_600).contains(&n), "{n}");
        assert_eq!(bytes_beyond(&obj, &owned, &owned, &obj, usize::MAX), 0);
        assert!(bytes_beyond(&obj, &owned, &judged, &obj, 100) < 1_100);
    }

    #[test]
    fn a_granular_map_claimed_whole_counts_what_it_holds_beyond_the_desired_value() {
        let obj = json!({"data": {"a": "x", "pad": "p".repeat(1_000)}, "args": ["q", "r"]});
        let desired = json!({"data": {"a": "x"}, "args": ["q", "r"]});
        let whole = json!({"f:data": {}, "f:args": {}});
        let n = bytes_beyond(&obj, &whole, &whole, &desired, usize::MAX);
        assert!((1_000..1_020).contains(&n), "{n}");
        // An atomic value as desired, and a granular map owned key by key: nothing.
        assert_eq!(
            bytes_beyond(&desired, &whole, &whole, &desired, usize::MAX),
            0
        );
        let keys = json!({"f:data": {".": {}, "f:a": {}}});
        assert_eq!(bytes_beyond(&obj, &keys, &keys, &desired, usize::MAX), 0);
        // Paths to nothing count by their text, wherever they are.
        let junk: Map<String, Value> = (0..100)
            .map(|i| (format!("f:j{i:03}"), json!({})))
            .collect();
        let dangling = json!({"f:data": {"f:a": {}, "f:gone": {}}, "f:metadata": junk});
        let n = bytes_beyond(&obj, &dangling, &keys, &desired, usize::MAX);
        assert!((1_100..1_400).contains(&n), "{n}");
    }

    #[test]
    fn a_map_idem_owns_whole_counts_what_no_entry_lists() {
        // An empty `data` desired is recorded whole; a key written there whose writer's entry
        // is gone is listed by nobody.
        let obj = json!({
            "metadata": {"managedFields": [
                {"manager": IDEM, "operation": "Apply", "fieldsV1": {"f:data": {}}},
            ]},
            "data": {"pad": "p".repeat(20_000)},
        });
        assert!(bytes(&obj) > 20_000, "{}", bytes(&obj));
        assert!(!within_bound(&obj, ours));
    }

    #[test]
    fn list_keys_of_one_entry_naming_one_item_count_but_the_first() {
        let keys = |n: usize| {
            let mut m = Map::new();
            m.insert(
                "k:{\"name\":\"app\"}".into(),
                json!({".": {}, "f:name": {}}),
            );
            for i in 0..n {
                let key = json!({"name": "app", "image": "i", "pad": "p".repeat(i)});
                m.insert(format!("k:{key}"), json!({".": {}}));
            }
            json!({
                "metadata": {"managedFields": [
                    {"manager": IDEM, "operation": "Apply", "fieldsV1": {"f:containers": m}},
                ]},
                "containers": [{"name": "app", "image": "i"}],
            })
        };
        // A key with members the item lacks names nothing; one that matches names it again.
        assert!(bytes(&keys(0)) < 100, "{}", bytes(&keys(0)));
        let mut dup = keys(0);
        let list = &mut dup["metadata"]["managedFields"][0]["fieldsV1"]["f:containers"];
        for extra in [
            "k:{\"image\":\"i\",\"name\":\"app\"}",
            "k:{\"image\":\"i\"}",
        ] {
            list[extra] = json!({".": {}, "f:pad": {"f:x": "y".repeat(9_000)}});
        }
        assert!(bytes(&dup) > 18_000, "{}", bytes(&dup));
    }

    #[test]
    fn paths_of_idems_entries_that_lead_to_nothing_count() {
        let junk: Map<String, Value> = (0..2_000)
            .map(|i| (format!("f:j{i:05}"), json!({})))
            .collect();
        let with = |fields: Value| {
            json!({
                "metadata": {"labels": {"a": "b"}, "managedFields": [
                    {"manager": IDEM, "operation": "Apply", "fieldsV1": fields},
                ]},
                "data": {"config": "x"},
            })
        };
        let base = bytes(&with(json!({"f:data": {"f:config": {}}})));
        assert!(base < 200, "{base}");
        // Labels the object does not have, and paths below a scalar.
        let absent = with(json!({"f:metadata": {"f:labels": junk.clone()}}));
        let below = with(json!({"f:data": {"f:config": junk}}));
        for obj in [absent, below] {
            assert!(bytes(&obj) > base + 2_000 * 8, "{}", bytes(&obj));
        }
    }

    #[test]
    fn the_count_stops_past_its_bound() {
        let obj = config_map(10, &[("a", 40_000), ("b", 40_000)], "kubectl");
        assert!(foreign_bytes(&obj, ours, 1_000) < 80_000);
    }
}
