//! The convergence check: the desired body against our `Apply` entry in `managedFields` and the
//! live values (see the module documentation of [`crate::compare`] for the rule).

use std::fmt;

use serde_json::{Map, Value};

use super::Quantity;
use super::schema::{Seg, defaulted, is_quantity};

/// Why one field of the desired body is not converged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriftKind {
    /// The field manager has no `Apply` entry on the object (never applied, or the entry was
    /// removed): the whole object counts as drifted.
    NeverApplied,
    /// Our `Apply` entry does not own the field: another manager took it (`managers`, from
    /// their `managedFields` entries), or it was removed (`managers` empty).
    NotOwned {
        /// Field managers that own the field now (`manager (operation)`), if any.
        managers: Vec<String>,
    },
    /// Our `Apply` entry owns the field but the live value differs from the desired one.
    Changed,
    /// Our `Apply` entry owns a field the desired body does not have: the next apply removes
    /// it.
    Stale,
    /// No manager owns the field, the object lacks it and its desired value is a zero value
    /// or an empty map or list: a field Go omitted on the wire (an apply would record it and
    /// change nothing) or one another writer removed (an apply would put it back). Only the
    /// server tells which (the engine asks it, or keeps its answer to our create).
    Unrecorded,
}

/// One drifted field: its path in the object and why.
///
/// Paths use JSON field names: `.spec.replicas`, `.metadata.labels.app`, a keyed list item as
/// `.spec.ports[port=80,protocol=TCP]`, a set item as `.spec.finalizers[=x]`, an item by
/// position as `[3]`. The empty path is the whole object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    /// The field's path.
    pub path: String,
    /// Why it drifted.
    pub kind: DriftKind,
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "(object)"
        } else {
            &self.path
        };
        match &self.kind {
            DriftKind::NeverApplied => write!(f, "{path} never applied"),
            DriftKind::NotOwned { managers } if managers.is_empty() => {
                write!(f, "{path} removed")
            }
            DriftKind::NotOwned { managers } => {
                write!(f, "{path} changed by {}", managers.join(", "))
            }
            DriftKind::Changed => write!(f, "{path} changed"),
            DriftKind::Stale => write!(f, "{path} no longer desired"),
            DriftKind::Unrecorded => write!(f, "{path} removed or never stored"),
        }
    }
}

/// Fields the API server strips from every managedFields entry (apimachinery's
/// `stripmeta.go`): never owned, never compared.
const STRIPPED_META: &[&str] = &[
    "name",
    "namespace",
    "creationTimestamp",
    "selfLink",
    "uid",
    "generation",
    "managedFields",
    "resourceVersion",
];

/// The drift of `live` from `desired` for `field_manager`; empty when converged.
///
/// `desired` is the body we apply (`apiVersion`, `kind`, `metadata`, …); `live` is the stored
/// object as JSON, including `metadata.managedFields`.
pub fn check(desired: &Value, live: &Value, field_manager: &str) -> Vec<Drift> {
    let entries = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    check_entries(desired, live, entries, field_manager)
}

/// [`check`] with `entries` as `live`'s `managedFields` (whatever `live` holds there): a
/// judgement of the same values under another ownership record, without a copy of `live`.
pub fn check_entries(
    desired: &Value,
    live: &Value,
    entries: &[Value],
    field_manager: &str,
) -> Vec<Drift> {
    let main = |e: &Value| {
        e.get("subresource")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    };
    let ours = entries.iter().find(|e| {
        main(e)
            && e.get("manager").and_then(Value::as_str) == Some(field_manager)
            && e.get("operation").and_then(Value::as_str) == Some("Apply")
    });
    let Some(ours) = ours else {
        return vec![Drift {
            path: String::new(),
            kind: DriftKind::NeverApplied,
        }];
    };
    let empty = Map::new();
    let owned = ours
        .get("fieldsV1")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    // Every other entry, a subresource's too: `kubectl scale` records `.spec.replicas` in an
    // entry of the `scale` subresource, and that writer, not a removal, took the field.
    let others: Vec<(String, &Map<String, Value>)> = entries
        .iter()
        .filter(|e| !std::ptr::eq(*e, ours))
        .filter_map(|e| Some((entry_name(e), e.get("fieldsV1")?.as_object()?)))
        .collect();
    let mut w = Walker {
        kind: desired
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        others,
        out: Vec::new(),
        path: Vec::new(),
        text: String::new(),
        fkeys: Vec::new(),
    };
    let (Some(d), true) = (desired.as_object(), live.is_object()) else {
        return vec![Drift {
            path: String::new(),
            kind: DriftKind::Changed,
        }];
    };
    // Root: apiVersion and kind are not fields; in metadata the stripped ones are skipped.
    let mut root = d.clone();
    root.remove("apiVersion");
    root.remove("kind");
    if let Some(Value::Object(meta)) = root.get_mut("metadata") {
        for f in STRIPPED_META {
            meta.remove(*f);
        }
        // `metadata` itself is stripped too: only its fields can be owned.
        if meta.is_empty() {
            root.remove("metadata");
        }
    }
    w.granular_object(&root, owned, Some(live));
    w.out
}

/// Whether `live` is converged to `desired` for `field_manager` ([`check`] is empty).
#[cfg(any(test, feature = "testing"))]
pub fn is_converged(desired: &Value, live: &Value, field_manager: &str) -> bool {
    check(desired, live, field_manager).is_empty()
}

/// A `managedFields` entry as [`DriftKind::NotOwned`] names it: `manager (operation)`, with its
/// subresource when it has one.
pub(crate) fn entry_name(e: &Value) -> String {
    let manager = e.get("manager").and_then(Value::as_str).unwrap_or("?");
    let operation = e.get("operation").and_then(Value::as_str).unwrap_or("?");
    match e.get("subresource").and_then(Value::as_str) {
        Some(sub) if !sub.is_empty() => format!("{manager} ({operation}, {sub})"),
        _ => format!("{manager} ({operation})"),
    }
}

struct Walker<'a> {
    kind: &'a str,
    /// Other managers' field sets (main resource only), named `manager (operation)`.
    others: Vec<(String, &'a Map<String, Value>)>,
    out: Vec<Drift>,
    /// Typed path, for the quantity table.
    path: Vec<Seg>,
    /// Display path.
    text: String,
    /// Path of fieldsV1 keys (`f:spec`, `k:{…}`), to find other owners.
    fkeys: Vec<String>,
}

/// The children of a fieldsV1 node other than the `.` marker.
pub(super) fn children(f: &Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
    f.iter().filter(|(k, _)| k.as_str() != ".")
}

pub(super) fn is_leaf(f: &Map<String, Value>) -> bool {
    children(f).next().is_none()
}

pub(super) fn empty_container(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// The JSON zero value of a scalar (Go omits these for non-pointer `omitempty` fields).
pub(super) fn zero_scalar(v: &Value) -> bool {
    match v {
        Value::Bool(b) => !b,
        Value::Number(n) => {
            n.as_u64() == Some(0) || n.as_i64() == Some(0) || n.as_f64() == Some(0.0)
        }
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// Whether list `item` matches the key object of a `k:` entry. A key field the item does not
/// set matches any value (the schema may default it, as `protocol: TCP` of ports).
pub(super) fn item_matches_key(item: &Value, key: &Map<String, Value>, partial: bool) -> bool {
    key.iter().all(|(kf, kv)| match item.get(kf) {
        Some(v) => v == kv,
        None => partial,
    })
}

pub(super) fn parse_key(k: &str) -> Option<Map<String, Value>> {
    serde_json::from_str::<Value>(k.strip_prefix("k:")?)
        .ok()?
        .as_object()
        .cloned()
}

fn key_text(key: &Map<String, Value>) -> String {
    let parts: Vec<String> = key
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect();
    format!("[{}]", parts.join(","))
}

impl<'a> Walker<'a> {
    fn push(&mut self, kind: DriftKind) {
        self.out.push(Drift {
            path: self.text.clone(),
            kind,
        });
    }

    fn enter_field(&mut self, name: &str) -> (usize, usize) {
        let mark = (self.text.len(), self.path.len());
        self.text.push('.');
        self.text.push_str(name);
        self.path.push(Seg::Field(name.to_owned()));
        self.fkeys.push(format!("f:{name}"));
        mark
    }

    fn enter_item(&mut self, text: &str, fkey: String) -> (usize, usize) {
        let mark = (self.text.len(), self.path.len());
        self.text.push_str(text);
        self.path.push(Seg::Item);
        self.fkeys.push(fkey);
        mark
    }

    fn leave(&mut self, (t, p): (usize, usize)) {
        self.text.truncate(t);
        self.path.truncate(p);
        self.fkeys.pop();
    }

    /// The other managers' nodes at the current fieldsV1 path.
    fn others_here(&self) -> Vec<(&str, &'a Map<String, Value>)> {
        self.others
            .iter()
            .filter_map(|(name, root)| {
                let mut node: &'a Map<String, Value> = root;
                for k in &self.fkeys {
                    node = node.get(k)?.as_object()?;
                }
                Some((name.as_str(), node))
            })
            .collect()
    }

    /// Managers that own the current path (the node exists in their set).
    fn owners_here(&self) -> Vec<String> {
        self.others_here()
            .into_iter()
            .map(|(n, _)| n.to_owned())
            .collect()
    }

    fn quantity_here(&self) -> bool {
        is_quantity(self.kind, &self.path)
    }

    /// A value we own, given the fieldsV1 node `f` recorded for it.
    fn value(&mut self, d: &Value, f: &Map<String, Value>, l: Option<&Value>) {
        let l = l.filter(|v| !v.is_null());
        match d {
            Value::Object(dm) if !is_leaf(f) => self.granular_object(dm, f, l),
            Value::Array(da) if !is_leaf(f) => self.granular_list(da, f, l),
            _ => match l {
                // Owned yet absent: only a value Go omits on the wire (an empty map or list, a
                // zero scalar of a non-pointer `omitempty` field). A removal by any writer
                // also removes the field from every manager's set, so it cannot hide here.
                None => {
                    if !(empty_container(d) || zero_scalar(d)) {
                        self.push(DriftKind::Changed);
                    }
                }
                Some(l) => {
                    // Stored values are defaulted by the server; compare like with like.
                    let with_defaults = defaulted(self.kind, &self.path, d);
                    if !self.whole_eq(with_defaults.as_ref().unwrap_or(d), l) {
                        self.push(DriftKind::Changed);
                    }
                }
            },
        }
    }

    /// A struct or map whose fields are owned one by one.
    fn granular_object(
        &mut self,
        d: &Map<String, Value>,
        f: &Map<String, Value>,
        l: Option<&Value>,
    ) {
        let lm = l.and_then(Value::as_object);
        for (k, dv) in d {
            if dv.is_null() {
                continue;
            }
            let mark = self.enter_field(k);
            match f.get(&format!("f:{k}")).and_then(Value::as_object) {
                Some(fv) => self.value(dv, fv, lm.and_then(|m| m.get(k))),
                None => self.missing(dv, lm.and_then(|m| m.get(k))),
            }
            self.leave(mark);
        }
        for (fk, _) in children(f) {
            match fk.strip_prefix("f:") {
                Some(name) if d.get(name).is_some_and(|v| !v.is_null()) => {}
                Some(name) => {
                    let mark = self.enter_field(name);
                    self.push(DriftKind::Stale);
                    self.leave(mark);
                }
                // k:/v:/i: under an object: not a shape we applied.
                None => self.push(DriftKind::Stale),
            }
        }
    }

    /// A desired value our entry does not own: reported where another manager owns it whole,
    /// else at each of its fields (a struct or map someone owns field by field).
    fn missing(&mut self, d: &Value, l: Option<&Value>) {
        let l = l.filter(|v| !v.is_null());
        // A node recorded without fields (`{}`) is a value owned whole only where no entry
        // owns fields below it: a map whose keys are owned one by one keeps, in the entry of
        // a writer all of whose keys were removed, the map itself as `{}` (its `.` member).
        let others = self.others_here();
        let whole =
            others.iter().any(|(_, n)| is_leaf(n)) && others.iter().all(|(_, n)| is_leaf(n));
        if let Value::Object(dm) = d
            && !dm.is_empty()
            && !whole
        {
            let lm = l.and_then(Value::as_object);
            for (k, v) in dm {
                if v.is_null() {
                    continue;
                }
                let mark = self.enter_field(k);
                self.missing(v, lm.and_then(|m| m.get(k)));
                self.leave(mark);
            }
            return;
        }
        let managers = self.owners_here();
        if managers.is_empty() && l.is_none() && (empty_container(d) || zero_scalar(d)) {
            self.push(DriftKind::Unrecorded);
        } else {
            self.push(DriftKind::NotOwned { managers });
        }
    }

    /// A list whose items are owned one by one: associative (`k:`), set (`v:`) or by index
    /// (`i:`).
    fn granular_list(&mut self, d: &[Value], f: &Map<String, Value>, l: Option<&Value>) {
        let la: &[Value] = l.and_then(Value::as_array).map_or(&[], Vec::as_slice);
        let mut used: Vec<String> = Vec::new();
        for (i, item) in d.iter().enumerate() {
            if item.is_null() {
                continue;
            }
            let keyed: Vec<(&String, Map<String, Value>, &Value)> = children(f)
                .filter_map(|(fk, fv)| Some((fk, parse_key(fk)?, fv)))
                .collect();
            let mut candidates: Vec<&(&String, Map<String, Value>, &Value)> = keyed
                .iter()
                .filter(|(_, key, _)| item_matches_key(item, key, false))
                .collect();
            if candidates.is_empty() {
                candidates = keyed
                    .iter()
                    .filter(|(_, key, _)| item_matches_key(item, key, true))
                    .collect();
            }
            let set_key = format!("v:{item}");
            let index_key = format!("i:{i}");
            // (fieldsV1 key, display, our node, live items matching)
            let found: Option<(String, String, &Value, Vec<&Value>)> =
                if let [(fk, key, fv)] = candidates.as_slice() {
                    let live: Vec<&Value> = la
                        .iter()
                        .filter(|li| item_matches_key(li, key, false))
                        .collect();
                    Some(((*fk).clone(), key_text(key), *fv, live))
                } else if let Some(fv) = f.get(&set_key) {
                    let live: Vec<&Value> = la.iter().filter(|li| *li == item).collect();
                    let shown = item
                        .as_str()
                        .map_or_else(|| item.to_string(), str::to_owned);
                    Some((set_key.clone(), format!("[={shown}]"), fv, live))
                } else {
                    f.get(&index_key).map(|fv| {
                        (
                            index_key.clone(),
                            format!("[{i}]"),
                            fv,
                            la.get(i).into_iter().collect(),
                        )
                    })
                };
            let Some((fkey, text, node, live)) = found else {
                // Not ours (any more): find who holds an item like it.
                let managers = self.owners_of_item(item);
                let shown = match item {
                    Value::Object(_) => format!("[{i}]"),
                    other => format!("[={other}]"),
                };
                let mark = self.enter_item(&shown, String::new());
                self.push(DriftKind::NotOwned { managers });
                self.leave(mark);
                continue;
            };
            used.push(fkey.clone());
            let mark = self.enter_item(&text, fkey);
            match (live.as_slice(), node.as_object()) {
                ([one], Some(node)) => self.value(item, node, Some(one)),
                // Missing, or duplicated by someone: either way not what we applied.
                _ => self.push(DriftKind::Changed),
            }
            self.leave(mark);
        }
        for (fk, _) in children(f) {
            if used.contains(fk) {
                continue;
            }
            let text = match parse_key(fk) {
                Some(key) => key_text(&key),
                None => format!("[{}]", fk.get(2..).unwrap_or_default()),
            };
            let mark = self.enter_item(&text, fk.clone());
            self.push(DriftKind::Stale);
            self.leave(mark);
        }
    }

    /// Managers whose set at the current (list) path has an entry for `item`.
    fn owners_of_item(&self, item: &Value) -> Vec<String> {
        let set_key = format!("v:{item}");
        self.others_here()
            .into_iter()
            .filter(|(_, node)| {
                node.contains_key(&set_key)
                    || children(node).any(|(k, _)| {
                        parse_key(k).is_some_and(|key| item_matches_key(item, &key, true))
                    })
            })
            .map(|(n, _)| n.to_owned())
            .collect()
    }

    /// Equality of a value we own as a whole (an atomic list, map or struct, or a scalar), by
    /// meaning only where the schema says so (quantities). Map keys and list items present in
    /// the live value but owned by another manager are theirs and are skipped (a granular map
    /// or list we applied empty); in a true atomic value no other manager can own a part.
    fn whole_eq(&mut self, d: &Value, l: &Value) -> bool {
        match (d, l) {
            (Value::Object(dm), Value::Object(lm)) => {
                let others = self.others_here();
                let theirs = |k: &str| {
                    let fk = format!("f:{k}");
                    others.iter().any(|(_, n)| n.contains_key(&fk))
                };
                if lm.keys().any(|k| !dm.contains_key(k) && !theirs(k)) {
                    return false;
                }
                dm.iter().all(|(k, dv)| {
                    let mark = self.enter_field(k);
                    let eq = match lm.get(k) {
                        Some(lv) => self.whole_eq(dv, lv),
                        None => dv.is_null(),
                    };
                    self.leave(mark);
                    eq
                })
            }
            (Value::Array(da), Value::Array(la)) => {
                let others = self.others_here();
                let theirs = |li: &Value| {
                    others.iter().any(|(_, n)| {
                        n.contains_key(&format!("v:{li}"))
                            || children(n).any(|(k, _)| {
                                parse_key(k).is_some_and(|key| item_matches_key(li, &key, false))
                            })
                    })
                };
                let la: Vec<&Value> = if others.is_empty() {
                    la.iter().collect()
                } else {
                    la.iter().filter(|li| !theirs(li)).collect()
                };
                da.len() == la.len()
                    && da.iter().zip(la).all(|(dv, lv)| {
                        let mark = self.enter_item("[]", String::new());
                        let eq = self.whole_eq(dv, lv);
                        self.leave(mark);
                        eq
                    })
            }
            _ => self.scalar_eq(d, l),
        }
    }

    fn scalar_eq(&self, d: &Value, l: &Value) -> bool {
        if d == l {
            return true;
        }
        if !self.quantity_here() {
            return false;
        }
        let text = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        match (text(d), text(l)) {
            (Some(a), Some(b)) => {
                matches!((Quantity::parse(&a), Quantity::parse(&b)), (Some(x), Some(y)) if x == y)
            }
            _ => false,
        }
    }
}
