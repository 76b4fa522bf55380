//! Field-wise differences between two values of the same spec type (the derive's `diff`).

use serde_json::Value;

/// A value as JSON for the derive's fingerprint; `null` when it cannot be serialised.
#[doc(hidden)]
pub fn __to_value<T: serde::Serialize + ?Sized>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Appends to `out` the paths under spec field `name` where `a` and `b` differ: `name` itself
/// for a changed scalar or a value that appeared or vanished, `name.key` inside maps and
/// `name[i]` inside lists. Values compare exactly as JSON (no guessing of meaning: two specs of
/// the same type are compared, not a spec with the server's rendering of it).
#[doc(hidden)]
pub fn __field_diff<T: serde::Serialize + ?Sized>(name: &str, a: &T, b: &T, out: &mut Vec<String>) {
    let (a, b) = (__to_value(a), __to_value(b));
    let mut path = name.to_owned();
    diff(&a, &b, &mut path, out);
}

fn diff(a: &Value, b: &Value, path: &mut String, out: &mut Vec<String>) {
    if a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let len = path.len();
                path.push('.');
                path.push_str(k);
                match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => diff(v, w, path, out),
                    _ => out.push(path.clone()),
                }
                path.truncate(len);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                diff(v, w, path, out);
                path.truncate(len);
            }
        }
        _ => out.push(path.clone()),
    }
}
