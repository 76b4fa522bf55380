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
pub(crate) fn restrict_to_desired(desired: &Value, fields: &Value) -> Value {
    let empty = Map::new();
    let f = fields.as_object().unwrap_or(&empty);
    let mut root = desired.clone();
    if let Some(o) = root.as_object_mut() {
        o.remove("apiVersion");
        o.remove("kind");
        o.remove("status");
    }
    Value::Object(restrict(&root, f))
}

fn restrict_node(d: &Value, f: &Map<String, Value>) -> Map<String, Value> {
    if is_leaf(f) {
        Map::new()
    } else {
        restrict(d, f)
    }
}

fn restrict(d: &Value, f: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    match d {
        Value::Object(dm) => {
            for (k, v) in dm {
                if v.is_null() {
                    continue;
                }
                if let Some(fv) = f.get(&format!("f:{k}")).and_then(Value::as_object) {
                    out.insert(format!("f:{k}"), Value::Object(restrict_node(v, fv)));
                } else if empty_container(v) || zero_scalar(v) {
                    // An empty map or a zero value Go omits on the wire: a create records
                    // nothing for it, an apply records the field itself.
                    out.insert(format!("f:{k}"), json!({}));
                }
            }
        }
        Value::Array(da) => {
            for (fk, fv) in children(f) {
                let Some(fv) = fv.as_object() else { continue };
                let item = if let Some(key) = parse_key(fk) {
                    da.iter().find(|i| item_matches_key(i, &key, true))
                } else if let Some(v) = fk.strip_prefix("v:") {
                    serde_json::from_str::<Value>(v)
                        .ok()
                        .and_then(|v| da.iter().find(|i| **i == v))
                } else if let Some(i) = fk.strip_prefix("i:") {
                    i.parse::<usize>().ok().and_then(|i| da.get(i))
                } else {
                    None
                };
                if let Some(item) = item {
                    let mut node = restrict_node(item, fv);
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
