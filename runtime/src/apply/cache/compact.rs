//! A child kind's cache kept as compact JSON text, without the parts the apply engine never
//! reads.
//!
//! Why text: a typed object (or a `serde_json::Value`) holds every `managedFields` `fieldsV1`
//! map as a B-tree whose nodes are allocated for 11 entries even when they hold one, so a
//! child of a few hundred bytes of JSON costs several KB as an object. The engine reads a
//! child as JSON anyway ([`KindView::get`]), so parsing the text costs no more than
//! converting a typed object did.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::KindView;
use crate::apply::OWNER_UID_LABEL;

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

/// `(namespace, name)`.
type Name = (Option<String>, String);

/// One cached child.
struct Entry {
    /// Its [`OWNER_UID_LABEL`], for listing an owner's children without parsing the others.
    owner: Option<Box<str>>,
    /// The stripped object, as JSON text (with `apiVersion` and `kind`).
    json: Box<str>,
}

/// The objects of one child kind, filled from its watch with the semantics of kube-runtime's
/// reflector store: a relist (between `Init` and `InitDone`) replaces the whole content at
/// once when complete, and until then the previous content is served.
pub(crate) struct CompactStore {
    api_version: String,
    kind: String,
    keep_status: bool,
    live: RwLock<HashMap<Name, Entry>>,
    relist: Mutex<Option<HashMap<Name, Entry>>>,
}

/// The object's `(namespace, name)` and its entry; `None` without a name.
fn entry(
    mut obj: Value,
    api_version: &str,
    kind: &str,
    keep_status: bool,
) -> Option<(Name, Entry)> {
    strip(&mut obj, keep_status);
    let meta = obj.get("metadata")?;
    let name = meta.get("name")?.as_str()?.to_owned();
    let namespace = meta
        .get("namespace")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let owner = meta
        .pointer("/labels")
        .and_then(|l| l.get(OWNER_UID_LABEL))
        .and_then(Value::as_str)
        .map(Into::into);
    // Typed objects may serialise without apiVersion/kind.
    obj["apiVersion"] = Value::String(api_version.to_owned());
    obj["kind"] = Value::String(kind.to_owned());
    let json = obj.to_string().into_boxed_str();
    Some(((namespace, name), Entry { owner, json }))
}

impl CompactStore {
    /// An empty store of kind `api_version`/`kind`, keeping `status` when `keep_status`.
    pub(crate) fn new(api_version: &str, kind: &str, keep_status: bool) -> Self {
        Self {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            keep_status,
            live: RwLock::default(),
            relist: Mutex::default(),
        }
    }

    /// `(apiVersion, kind)`.
    pub(crate) fn kind_key(&self) -> super::KindKey {
        (self.api_version.clone(), self.kind.clone())
    }

    fn entry(&self, obj: Value) -> Option<(Name, Entry)> {
        entry(obj, &self.api_version, &self.kind, self.keep_status)
    }

    /// A watch `Apply` event: stores `obj` (as JSON).
    pub(crate) fn apply(&self, obj: Value) {
        if let (Some((name, e)), Ok(mut live)) = (self.entry(obj), self.live.write()) {
            live.insert(name, e);
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
    pub(crate) fn init_apply(&self, obj: Value) {
        let Some((name, e)) = self.entry(obj) else {
            return;
        };
        if let Ok(mut relist) = self.relist.lock() {
            relist.get_or_insert_with(HashMap::new).insert(name, e);
        }
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
    fn get(&self, namespace: Option<&str>, name: &str) -> Option<Value> {
        let live = self.live.read().ok()?;
        let e = live.get(&(namespace.map(str::to_owned), name.to_owned()))?;
        serde_json::from_str(&e.json).ok()
    }

    fn owned_by(&self, namespace: Option<&str>, uid: &str) -> Vec<ObjectMeta> {
        let Ok(live) = self.live.read() else {
            return Vec::new();
        };
        live.iter()
            .filter(|((ns, _), _)| namespace.is_none() || ns.as_deref() == namespace)
            .filter(|(_, e)| e.owner.as_deref() == Some(uid))
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
