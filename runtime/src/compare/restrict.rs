//! Field sets an apply would record: a `fieldsV1` tree cut down to the fields of a desired
//! body (structured-merge-diff's `ToFieldSet`), for judging a create's `Update` entry.

use serde_json::{Map, Value, json};

use super::fields::{children, empty_container, is_leaf, item_matches_key, parse_key, zero_scalar};

/// The part of the field set `fields` (a `fieldsV1` tree) that an apply of `desired` would
/// record: the fields `desired` has, with the `.` marker only on list items that have fields
/// of their own (structured-merge-diff's `ToFieldSet`: struct fields are recorded through
/// their leaves, list items as members themselves). Used to turn the `Update` entry of a
/// create into the `Apply` entry the same body would have produced, without the server-set
/// defaults an `Update` entry also records.
///
/// A zero value or empty map or list of `desired` that `fields` lacks is one a create does not
/// record and an apply does. With `live` (the object now), it is counted only where `live`
/// holds the field: absent there, it is either a field Go omitted on the wire or a map key
/// another writer removed, which only the API server's schema tells apart, so it is left out
/// (and the convergence check leaves it to the server). Without `live`, it is counted.
pub(crate) fn restrict_to_desired(desired: &Value, fields: &Value, live: Option<&Value>) -> Value {
    let empty = Map::new();
    let f = fields.as_object().unwrap_or(&empty);
    let mut root = desired.clone();
    if let Some(o) = root.as_object_mut() {
        o.remove("apiVersion");
        o.remove("kind");
        o.remove("status");
    }
    let at = match live {
        Some(l) => At::Live(Some(l)),
        None => At::Anywhere,
    };
    Value::Object(restrict(&root, f, at))
}

/// Where a value of the desired body stands in the live object.
#[derive(Clone, Copy)]
enum At<'a> {
    /// No live object to look at: every field counts as held.
    Anywhere,
    /// The live value at the same path, if any.
    Live(Option<&'a Value>),
}

impl<'a> At<'a> {
    fn field(self, name: &str) -> Self {
        match self {
            At::Anywhere => At::Anywhere,
            At::Live(l) => At::Live(l.and_then(|l| l.get(name))),
        }
    }

    fn item(self, find: impl Fn(&'a [Value]) -> Option<&'a Value>) -> Self {
        match self {
            At::Anywhere => At::Anywhere,
            At::Live(l) => At::Live(l.and_then(Value::as_array).and_then(|a| find(a))),
        }
    }

    fn held(self) -> bool {
        match self {
            At::Anywhere => true,
            At::Live(l) => l.is_some_and(|l| !l.is_null()),
        }
    }
}

/// The item of `items` that the `fieldsV1` key `fk` names: by its key fields (`k:{…}`; with
/// `partial`, a key field the item leaves out matches), its value (`v:…`) or its position
/// (`i:n`).
fn find_item<'a>(items: &'a [Value], fk: &str, partial: bool) -> Option<&'a Value> {
    if let Some(key) = parse_key(fk) {
        items.iter().find(|i| item_matches_key(i, &key, partial))
    } else if let Some(v) = fk
        .strip_prefix("v:")
        .and_then(|v| serde_json::from_str::<Value>(v).ok())
    {
        items.iter().find(|i| **i == v)
    } else {
        fk.strip_prefix("i:")
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| items.get(i))
    }
}

fn restrict_node(d: &Value, f: &Map<String, Value>, at: At<'_>) -> Map<String, Value> {
    if is_leaf(f) {
        Map::new()
    } else {
        restrict(d, f, at)
    }
}

fn restrict(d: &Value, f: &Map<String, Value>, at: At<'_>) -> Map<String, Value> {
    let mut out = Map::new();
    match d {
        Value::Object(dm) => {
            for (k, v) in dm {
                if v.is_null() {
                    continue;
                }
                let at = at.field(k);
                if let Some(fv) = f.get(&format!("f:{k}")).and_then(Value::as_object) {
                    let node = restrict_node(v, fv, at);
                    // A map or struct with fields of its own that none of its desired fields
                    // is on record in (they were all removed, and another manager's remain):
                    // an apply records its fields, never the node alone, which would read as
                    // owning the whole value (an atomic one).
                    if node.is_empty()
                        && !is_leaf(fv)
                        && v.as_object().is_some_and(|o| !o.is_empty())
                    {
                        continue;
                    }
                    out.insert(format!("f:{k}"), Value::Object(node));
                } else if (empty_container(v) || zero_scalar(v)) && at.held() {
                    // An empty map or a zero value the create did not record (an empty struct
                    // has no leaves to record) and an apply does.
                    out.insert(format!("f:{k}"), json!({}));
                }
            }
        }
        Value::Array(da) => {
            for (fk, fv) in children(f) {
                let Some(fv) = fv.as_object() else { continue };
                // The desired item matches a key it leaves out (the schema may default it);
                // the live one, holding the defaults, matches the whole key.
                let item = find_item(da, fk, true);
                let at = at.item(|la| find_item(la, fk, false));
                if let Some(item) = item {
                    let mut node = restrict_node(item, fv, at);
                    if !node.is_empty() {
                        node.insert(".".into(), json!({}));
                    }
                    out.insert(fk.clone(), Value::Object(node));
                }
            }
        }
        _ => {}
    }
    out
}
