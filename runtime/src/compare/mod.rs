//! Desired-state comparison by meaning: is every field we apply already equal in the live object?
//!
//! The rules, and where they come from:
//! - **Only what we apply counts.** Fields present in the live object but absent from the
//!   desired one (server defaults such as a Deployment's `strategy`, fields owned by other field
//!   managers, `status`) are never drift. This mirrors server-side apply, where an apply only
//!   sets the fields in its body.
//! - **Quantities compare by value** (`resource.Quantity`, apimachinery): under the quantity
//!   maps (`limits`, `requests`, `hard`, `default`, `defaultRequest`, `min`, `max`,
//!   `maxLimitRequestRatio`, `capacity`, `allocatable`, `overhead`) and the fields `storage`
//!   and `sizeLimit`, "1000m" equals "1" and "1Gi" equals "1024Mi"; a number equals the
//!   quantity string with the same value.
//! - **int-or-string** (`intstr.IntOrString`): the number `8080` and the string `"8080"` mean
//!   the same port; a named port only equals the same name.
//! - **Empty equals absent** where Go's `omitempty` drops the value on the wire (API
//!   conventions: optional fields are `omitempty`): `null`, `""`, `false`, `0`, `{}` and `[]`
//!   in the desired object equal a missing field.
//! - **Lists** are matched like server-side apply's associative lists when every desired
//!   element is an object carrying one of the usual merge keys (`uid`, `name`, `containerPort`,
//!   `port`, `key`, `mountPath`, `devicePath`, `ip`): each desired element must be applied
//!   inside the live element with the same key. Other lists are atomic: same length, and each
//!   element applied in the live element at the same position.

mod fingerprint;
mod quantity;

pub use fingerprint::{Fingerprint, fingerprint};
pub use quantity::Quantity;

use serde_json::Value;

/// Map keys whose values are quantities (resource lists in the core/v1 API).
const QUANTITY_MAPS: &[&str] = &[
    "limits",
    "requests",
    "hard",
    "used",
    "default",
    "defaultRequest",
    "min",
    "max",
    "maxLimitRequestRatio",
    "capacity",
    "allocatable",
    "overhead",
];

/// Fields that hold a single quantity.
const QUANTITY_FIELDS: &[&str] = &["storage", "sizeLimit"];

/// Merge keys tried, in order, to match list elements (server-side apply `listMapKeys`).
const MERGE_KEYS: &[&str] = &[
    "uid",
    "name",
    "containerPort",
    "port",
    "key",
    "mountPath",
    "devicePath",
    "ip",
];

/// Whether every field of `desired` is already applied in `live` (see the module rules).
pub fn is_applied(desired: &Value, live: Option<&Value>) -> bool {
    let mut out = Vec::new();
    walk(desired, live, &mut String::new(), false, &mut out, true);
    out.is_empty()
}

/// The JSON paths (`.spec.replicas`, `.spec.ports[name=http].port`) of desired fields that are
/// not applied in `live`; empty when converged.
pub fn drift(desired: &Value, live: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(
        desired,
        Some(live),
        &mut String::new(),
        false,
        &mut out,
        false,
    );
    out
}

/// Whether two values of the same field mean the same thing; `quantity` says whether the field
/// holds a `resource.Quantity`.
pub fn same_meaning(a: &Value, b: &Value, quantity: bool) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter().all(|(k, v)| {
                    // Entries of a quantity map are quantities too.
                    let q = quantity || QUANTITY_MAPS.contains(&k.as_str()) || quantity_field(k);
                    y.get(k).is_some_and(|w| same_meaning(v, w, q))
                })
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| same_meaning(v, w, false))
        }
        _ => scalar_eq(a, b, quantity),
    }
}

fn quantity_field(key: &str) -> bool {
    QUANTITY_FIELDS.contains(&key)
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

fn scalar_eq(a: &Value, b: &Value, quantity: bool) -> bool {
    if a == b {
        return true;
    }
    match (a, b) {
        (Value::Number(n), Value::String(s)) | (Value::String(s), Value::Number(n)) => {
            if quantity {
                quantity_eq(&n.to_string(), s)
            } else {
                // int-or-string: 8080 and "8080" are the same port.
                n.as_i64().is_some_and(|i| s.parse::<i64>() == Ok(i))
            }
        }
        (Value::String(x), Value::String(y)) if quantity => quantity_eq(x, y),
        (Value::Number(x), Value::Number(y)) => x.as_f64().is_some() && x.as_f64() == y.as_f64(),
        _ => false,
    }
}

fn quantity_eq(a: &str, b: &str) -> bool {
    matches!((Quantity::parse(a), Quantity::parse(b)), (Some(x), Some(y)) if x == y)
}

fn walk(
    desired: &Value,
    live: Option<&Value>,
    path: &mut String,
    quantity: bool,
    out: &mut Vec<String>,
    stop_at_first: bool,
) {
    if stop_at_first && !out.is_empty() {
        return;
    }
    let live = live.filter(|v| !v.is_null());
    match (desired, live) {
        (d, None) => {
            if !is_empty(d) {
                out.push(path.clone());
            }
        }
        (Value::Object(d), Some(Value::Object(l))) => {
            for (k, v) in d {
                let len = path.len();
                path.push('.');
                path.push_str(k);
                let q = QUANTITY_MAPS.contains(&k.as_str()) || quantity_field(k);
                walk_field(v, l.get(k), path, q, quantity, out, stop_at_first);
                path.truncate(len);
            }
        }
        (Value::Array(d), Some(Value::Array(l))) => walk_list(d, l, path, out, stop_at_first),
        (d, Some(l)) => {
            if !scalar_eq(d, l, quantity) {
                out.push(path.clone());
            }
        }
    }
}

/// A field of an object: `in_map` is true when the field is an entry of a quantity map, so its
/// value is a quantity.
fn walk_field(
    v: &Value,
    l: Option<&Value>,
    path: &mut String,
    key_is_quantity: bool,
    in_quantity_map: bool,
    out: &mut Vec<String>,
    stop_at_first: bool,
) {
    // Inside a quantity map every value is a quantity; a quantity field is one itself.
    let quantity = in_quantity_map || (key_is_quantity && !v.is_object());
    if key_is_quantity && v.is_object() {
        // Entering a quantity map: its entries are quantities.
        if let (Value::Object(d), Some(Value::Object(lm))) = (v, l.filter(|x| !x.is_null())) {
            for (k, dv) in d {
                let len = path.len();
                path.push('.');
                path.push_str(k);
                walk(dv, lm.get(k), path, true, out, stop_at_first);
                path.truncate(len);
            }
            return;
        }
    }
    walk(v, l, path, quantity, out, stop_at_first);
}

fn merge_key(items: &[Value]) -> Option<&'static str> {
    if items.is_empty() {
        return None;
    }
    MERGE_KEYS.iter().copied().find(|key| {
        items
            .iter()
            .all(|i| i.as_object().is_some_and(|o| o.contains_key(*key)))
    })
}

fn walk_list(
    desired: &[Value],
    live: &[Value],
    path: &mut String,
    out: &mut Vec<String>,
    stop_at_first: bool,
) {
    if let Some(key) = merge_key(desired) {
        for d in desired {
            let id = &d[key];
            let found = live.iter().find(|l| {
                l.get(key).is_some_and(|lv| scalar_eq(id, lv, false)) && protocol_matches(d, l)
            });
            let len = path.len();
            let id_text = id.as_str().map_or_else(|| id.to_string(), str::to_owned);
            path.push_str(&format!("[{key}={id_text}]"));
            walk(d, found, path, false, out, stop_at_first);
            path.truncate(len);
        }
        return;
    }
    if desired.len() != live.len() {
        out.push(path.clone());
        return;
    }
    for (i, (d, l)) in desired.iter().zip(live).enumerate() {
        let len = path.len();
        path.push_str(&format!("[{i}]"));
        walk(d, Some(l), path, false, out, stop_at_first);
        path.truncate(len);
    }
}

/// Ports are keyed by number and protocol; a desired element without a protocol matches the
/// server's default (`TCP`).
fn protocol_matches(d: &Value, l: &Value) -> bool {
    match (d.get("protocol"), l.get("protocol")) {
        (Some(dp), Some(lp)) => dp == lp,
        (Some(dp), None) => dp == "TCP",
        _ => true,
    }
}

#[cfg(test)]
mod tests;

/// A value as JSON for the derive's fingerprint; `null` when it cannot be serialised.
#[doc(hidden)]
pub fn __to_value<T: serde::Serialize + ?Sized>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Appends to `out` the paths under spec field `name` where `a` and `b` differ by meaning
/// (the derive's `diff`): `name` itself for a changed scalar, `name.key` / `name[i]` /
/// `name[name=x]` for changes inside maps and lists.
#[doc(hidden)]
pub fn __field_diff<T: serde::Serialize + ?Sized>(name: &str, a: &T, b: &T, out: &mut Vec<String>) {
    let (a, b) = (__to_value(a), __to_value(b));
    if same_meaning(&a, &b, false) {
        return;
    }
    let mut paths = drift(&a, &b);
    for p in drift(&b, &a) {
        if !paths.contains(&p) {
            paths.push(p);
        }
    }
    if paths.is_empty() {
        // Equal as "applied" both ways but not the same (e.g. `{}` against `null`): the
        // field as a whole differs.
        paths.push(String::new());
    }
    out.extend(paths.into_iter().map(|p| format!("{name}{p}")));
}
