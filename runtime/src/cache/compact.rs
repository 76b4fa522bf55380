//! A child kind's cache kept as compact JSON text, without the parts the apply engine never
//! reads.
//!
//! Why text: a typed object (or a `serde_json::Value`) holds every `managedFields` `fieldsV1`
//! map as a B-tree whose nodes are allocated for 11 entries even when they hold one, so a
//! child of a few hundred bytes of JSON costs several KB as an object. The engine reads a
//! child as JSON anyway ([`KindView::get`]), so parsing the text costs no more than
//! converting a typed object did.
//!
//! A store given a [`Trust`] keeps whole only the objects it trusts (idem's children); any
//! other object its watch delivers, whatever its labels claim, is kept as a [`stub`] of a few
//! hundred bytes, whatever its size.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value};

use super::KindView;
use super::trust::Trust;
use crate::key::ObjectKey;
use crate::labels::{Labels, MANAGED_BY_LABEL};

/// The annotation client-side `kubectl apply` keeps a copy of the whole object in
/// (kubectl's `LastAppliedConfigAnnotation`).
pub(crate) const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What of a child the apply engine never reads, removed in place before it is cached:
///
/// - `status`, unless `keep_status` (kinds watched with
///   [`OwnsOptions::reading_status`](crate::controller::OwnsOptions::reading_status)): the
///   engine never applies or compares `status` (it is stripped from every desired body);
/// - the [`LAST_APPLIED`] annotation, unless an `Apply` entry of `managedFields` owns it (then
///   a desired body of someone's set it and the convergence check compares it): it is a
///   second copy of the object, written by client-side `kubectl apply` as an `Update`;
/// - the `time` of each `managedFields` entry: the check and the drift report read the
///   entries' manager, operation, subresource and fields, never when they were written.
pub(crate) fn strip(obj: &mut Value, keep_status: bool) {
    let Some(o) = obj.as_object_mut() else {
        return;
    };
    if !keep_status {
        o.remove("status");
    }
    let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let applied_owns_last_applied = meta
        .get("managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| e.get("operation").and_then(Value::as_str) == Some("Apply"))
        .any(|e| {
            e.pointer("/fieldsV1/f:metadata/f:annotations")
                .and_then(|a| a.get(format!("f:{LAST_APPLIED}")))
                .is_some()
        });
    if !applied_owns_last_applied
        && let Some(Value::Object(annotations)) = meta.get_mut("annotations")
    {
        annotations.remove(LAST_APPLIED);
    }
    if let Some(Value::Array(entries)) = meta.get_mut("managedFields") {
        for entry in entries.iter_mut().filter_map(Value::as_object_mut) {
            entry.remove("time");
        }
    }
}

/// The labels a [`stub`] keeps: those idem selects children by or lists them by —
/// [`MANAGED_BY_LABEL`] and the owner-uid, tenant and shard-bucket labels of every owner kind's
/// [`Labels`] (bounded by the kinds compiled in, never by the object).
fn stub_labels() -> Vec<&'static str> {
    let mut keys = vec![MANAGED_BY_LABEL];
    for l in Labels::known() {
        keys.extend([l.owner_uid(), l.tenant(), l.shard_bucket()]);
    }
    keys
}

/// The owner-uid labels of `obj`, one per owner kind's [`Labels`] it carries.
fn owner_uids(obj: &Value) -> Box<[(Labels, Box<str>)]> {
    let Some(labels) = obj.pointer("/metadata/labels") else {
        return Box::default();
    };
    Labels::known()
        .into_iter()
        .filter_map(|l| Some((l, labels.get(l.owner_uid())?.as_str()?.into())))
        .collect()
}

/// The most of any string a [`stub`] keeps, in bytes (a DNS subdomain's length; label values
/// are at most 63, but an ownerReference's fields are not length-checked by the API server).
const STUB_FIELD_BYTES: usize = 253;

/// `s`, cut to at most [`STUB_FIELD_BYTES`] bytes (at a character boundary).
fn capped(s: &str) -> Value {
    let mut end = s.len().min(STUB_FIELD_BYTES);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Value::String(s[..end].to_owned())
}

/// What identifies `obj`, and nothing of its content: `apiVersion`, `kind`, and of its
/// metadata `name`, `namespace`, `uid`, `resourceVersion`, `deletionTimestamp`, the labels in
/// [`stub_labels`] and the controller ownerReference (`apiVersion`, `kind`, `name`, `uid`),
/// every string capped at [`STUB_FIELD_BYTES`]. Enough to list it as claiming an owner (the
/// prune reports it, never deletes it: its uid is in no record), to map its events to that
/// owner, and to know that the name is taken; the engine reads the whole object from the API
/// server when it must judge it.
pub(crate) fn stub(obj: &Value, api_version: &str, kind: &str) -> Value {
    let empty = Map::new();
    let meta = obj
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut m = Map::new();
    for field in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "deletionTimestamp",
    ] {
        if let Some(v) = meta.get(field).and_then(Value::as_str) {
            m.insert(field.into(), capped(v));
        }
    }
    if let Some(Value::Object(labels)) = meta.get("labels") {
        let kept: Map<String, Value> = stub_labels()
            .into_iter()
            .filter_map(|k| Some((k.to_owned(), capped(labels.get(k)?.as_str()?))))
            .collect();
        if !kept.is_empty() {
            m.insert("labels".into(), Value::Object(kept));
        }
    }
    let controller = meta
        .get("ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true));
    if let Some(r) = controller {
        let mut kept = Map::new();
        for field in ["apiVersion", "kind", "name", "uid"] {
            kept.insert(
                field.into(),
                capped(r.get(field).and_then(Value::as_str).unwrap_or_default()),
            );
        }
        kept.insert("controller".into(), Value::Bool(true));
        m.insert(
            "ownerReferences".into(),
            Value::Array(vec![Value::Object(kept)]),
        );
    }
    serde_json::json!({"apiVersion": api_version, "kind": kind, "metadata": m})
}

/// `(namespace, name)`.
type Name = (Option<String>, String);

/// One cached child.
struct Entry {
    /// Its owner-uid labels (one per owner kind's [`Labels`] it carries), for listing an
    /// owner's children without parsing the others.
    owner: Box<[(Labels, Box<str>)]>,
    /// The stripped object, or its [`stub`], as JSON text (with `apiVersion` and `kind`).
    json: Box<str>,
    /// Whether `json` is only a [`stub`].
    stub: bool,
}

impl Entry {
    /// The `(uid, resourceVersion)` of a stub (cheap: a stub is small).
    fn stub_identity(&self) -> Option<(Option<String>, Option<u64>)> {
        if !self.stub {
            return None;
        }
        let meta = serde_json::from_str::<MetaOnly>(&self.json).ok()?.metadata;
        Some((
            meta.uid,
            meta.resource_version.and_then(|rv| rv.parse().ok()),
        ))
    }
}

/// The objects of one child kind, filled from its watch with the semantics of kube-runtime's
/// reflector store: a relist (between `Init` and `InitDone`) replaces the whole content at
/// once when complete, and until then the previous content is served.
pub(crate) struct CompactStore {
    api_version: String,
    kind: String,
    keep_status: bool,
    /// Which objects are kept whole; `None`: all of them.
    trust: Option<Arc<Trust>>,
    live: RwLock<HashMap<Name, Entry>>,
    relist: Mutex<Option<HashMap<Name, Entry>>>,
}

/// The object's `(namespace, name)`; `None` without a name.
fn name_of(obj: &Value) -> Option<Name> {
    let meta = obj.get("metadata")?;
    let name = meta.get("name")?.as_str()?.to_owned();
    let namespace = meta
        .get("namespace")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Some((namespace, name))
}

/// The object's `(namespace, name)` and its entry (whole, or its [`stub`]); `None` without a
/// name.
fn entry(
    mut obj: Value,
    api_version: &str,
    kind: &str,
    keep_status: bool,
    whole: bool,
) -> Option<(Name, Entry)> {
    let name = name_of(&obj)?;
    if whole {
        strip(&mut obj, keep_status);
        // Typed objects may serialise without apiVersion/kind.
        obj["apiVersion"] = Value::String(api_version.to_owned());
        obj["kind"] = Value::String(kind.to_owned());
    } else {
        obj = stub(&obj, api_version, kind);
    }
    let owner = owner_uids(&obj);
    let json = obj.to_string().into_boxed_str();
    Some((
        name,
        Entry {
            owner,
            json,
            stub: !whole,
        },
    ))
}

impl CompactStore {
    /// An empty store of kind `api_version`/`kind`, keeping `status` when `keep_status`, and
    /// keeping whole only the objects `trust` trusts (all when `None`).
    pub(crate) fn new(
        api_version: &str,
        kind: &str,
        keep_status: bool,
        trust: Option<Arc<Trust>>,
    ) -> Self {
        Self {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            keep_status,
            trust,
            live: RwLock::default(),
            relist: Mutex::default(),
        }
    }

    /// `(apiVersion, kind)`.
    pub(crate) fn kind_key(&self) -> super::KindKey {
        (self.api_version.clone(), self.kind.clone())
    }

    /// Whether the object with metadata `meta` is kept whole.
    pub(crate) fn keeps_whole(&self, meta: &Value) -> bool {
        self.whole(meta)
    }

    fn whole(&self, meta: &Value) -> bool {
        let Some(trust) = &self.trust else {
            return true;
        };
        let (Some(name), Some(uid)) = (
            meta.get("name").and_then(Value::as_str),
            meta.get("uid").and_then(Value::as_str),
        ) else {
            return false;
        };
        let key = ObjectKey {
            kind: self.kind.as_str().into(),
            namespace: meta
                .get("namespace")
                .and_then(Value::as_str)
                .map(Into::into),
            name: name.into(),
        };
        trust.is_ours(&key, uid)
    }

    fn entry(&self, obj: Value, whole: bool) -> Option<(Name, Entry)> {
        entry(obj, &self.api_version, &self.kind, self.keep_status, whole)
    }

    /// Stores the object with metadata `meta`, in the relist under way when `initial`: whole
    /// (as `whole` makes it; a large object is built only then) when trusted, else its
    /// [`stub`]. A stub is stored under the map's lock after a last look at the trust: the
    /// engine marks the objects it writes as trusted before it upgrades their stubs under that
    /// lock ([`CompactStore::upgrade`]), so a stub never replaces the engine's answer for good.
    pub(crate) fn put(&self, meta: &Value, whole: impl FnOnce() -> Option<Value>, initial: bool) {
        let stub_entry = || self.entry(serde_json::json!({ "metadata": meta }), false);
        if initial {
            let Ok(mut relist) = self.relist.lock() else {
                return;
            };
            let listed = relist.get_or_insert_with(HashMap::new);
            let e = if self.whole(meta) {
                whole().and_then(|v| self.entry(v, true))
            } else {
                stub_entry()
            };
            if let Some((name, e)) = e {
                listed.insert(name, e);
            }
        } else if self.whole(meta) {
            // Built outside the lock (a whole object may be large).
            if let Some((name, e)) = whole().and_then(|v| self.entry(v, true))
                && let Ok(mut live) = self.live.write()
            {
                live.insert(name, e);
            }
        } else if let Ok(mut live) = self.live.write() {
            let e = if self.whole(meta) {
                whole().and_then(|v| self.entry(v, true))
            } else {
                stub_entry()
            };
            if let Some((name, e)) = e {
                live.insert(name, e);
            }
        }
    }

    /// A watch `Apply` event: stores `obj` (as JSON).
    #[cfg(test)]
    pub(crate) fn apply(&self, obj: Value) {
        let meta = obj.get("metadata").cloned().unwrap_or_default();
        self.put(&meta, || Some(obj), false);
    }

    /// The engine's own copy of `obj` (the answer to its write, or what it read and judged its
    /// own): replaces a stub of the same object (uid) at that name that is not newer, so the
    /// engine reads its child from the cache again.
    pub(crate) fn upgrade(&self, obj: &Value) {
        let Some(name) = name_of(obj) else {
            return;
        };
        let uid = obj.pointer("/metadata/uid").and_then(Value::as_str);
        let rv = super::rv_of(obj);
        let replaces = |e: &Entry| {
            e.stub_identity().is_some_and(|(stub_uid, stub_rv)| {
                stub_uid.as_deref() == uid && uid.is_some() && stub_rv <= rv
            })
        };
        let whole = || self.entry(obj.clone(), true).map(|(_, e)| e);
        let stubbed = |map: &HashMap<Name, Entry>| map.get(&name).is_some_and(|e| e.stub);
        let in_live = self.live.read().is_ok_and(|live| stubbed(&live));
        let in_relist = self
            .relist
            .lock()
            .is_ok_and(|r| r.as_ref().is_some_and(stubbed));
        if !in_live && !in_relist {
            return; // the common case: nothing to replace, no write lock taken
        }
        if let Ok(mut live) = self.live.write()
            && live.get(&name).is_some_and(replaces)
            && let Some(e) = whole()
        {
            live.insert(name.clone(), e);
        }
        if let Ok(mut relist) = self.relist.lock()
            && let Some(listed) = relist.as_mut()
            && listed.get(&name).is_some_and(replaces)
            && let Some(e) = whole()
        {
            listed.insert(name, e);
        }
    }

    /// A watch `Delete` event.
    pub(crate) fn delete(&self, namespace: Option<&str>, name: &str) {
        if let Ok(mut live) = self.live.write() {
            live.remove(&(namespace.map(str::to_owned), name.to_owned()));
        }
    }

    /// A watch `Init` event: a relist starts.
    pub(crate) fn init(&self) {
        if let Ok(mut relist) = self.relist.lock() {
            *relist = Some(HashMap::new());
        }
    }

    /// A watch `InitApply` event: `obj` is part of the relist.
    #[cfg(test)]
    pub(crate) fn init_apply(&self, obj: Value) {
        let meta = obj.get("metadata").cloned().unwrap_or_default();
        self.put(&meta, || Some(obj), true);
    }

    /// A watch `InitDone` event: the relist replaces the content.
    pub(crate) fn init_done(&self) {
        let listed = self.relist.lock().ok().and_then(|mut r| r.take());
        if let (Some(listed), Ok(mut live)) = (listed, self.live.write()) {
            *live = listed;
        }
    }
}

/// `{"metadata": …}`, parsed from a cached object without the rest.
#[derive(serde::Deserialize)]
struct MetaOnly {
    metadata: ObjectMeta,
}

impl KindView for CompactStore {
    fn get(&self, namespace: Option<&str>, name: &str) -> Option<(Value, bool)> {
        let live = self.live.read().ok()?;
        let e = live.get(&(namespace.map(str::to_owned), name.to_owned()))?;
        Some((serde_json::from_str(&e.json).ok()?, e.stub))
    }

    fn upgrade(&self, obj: &Value) {
        CompactStore::upgrade(self, obj);
    }

    fn keeps_status(&self) -> bool {
        self.keep_status
    }

    fn owned_by(&self, namespace: Option<&str>, labels: Labels, uid: &str) -> Vec<ObjectMeta> {
        let Ok(live) = self.live.read() else {
            return Vec::new();
        };
        live.iter()
            .filter(|((ns, _), _)| namespace.is_none() || ns.as_deref() == namespace)
            .filter(|(_, e)| e.owner.iter().any(|(l, v)| *l == labels && **v == *uid))
            .filter_map(|(_, e)| serde_json::from_str::<MetaOnly>(&e.json).ok())
            .map(|m| m.metadata)
            .collect()
    }

    fn len(&self) -> usize {
        self.live.read().map(|l| l.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;
