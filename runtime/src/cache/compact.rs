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

use std::sync::{Arc, Mutex, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value};

use self::objects::{Objects, owner_uids};
use super::KindView;
use super::template::{Interner, Templated};
use super::trust::Trust;
use crate::key::{ObjectKey, Owners};
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

/// The most of any string a [`stub`] keeps, in bytes (a DNS subdomain's length; label values
/// are at most 63, but an ownerReference's fields are not length-checked by the API server).
const STUB_FIELD_BYTES: usize = 253;

/// The most finalizers a [`stub`] of an object being deleted keeps: that one holds it, and
/// whose, is what the prune reports (a tenant owner may add any number).
const STUB_FINALIZERS: usize = 4;

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
/// [`stub_labels`] and `bucket_label`, the controller ownerReference (`apiVersion`, `kind`,
/// `name`, `uid`) and, of an object being deleted, the first [`STUB_FINALIZERS`] finalizers
/// (what holds it), every string capped at [`STUB_FIELD_BYTES`]. Enough to list it as claiming an owner (the prune
/// reports it, never deletes it: its uid is in no record; a recorded one whose deletion
/// finalizers hold keeps its owner waiting), to map its events to that owner, and to know that
/// the name is taken; the engine reads the whole object from the API server when it must
/// judge it.
pub(crate) fn stub(
    obj: &Value,
    api_version: &str,
    kind: &str,
    bucket_label: Option<&'static str>,
) -> Value {
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
    if meta.contains_key("deletionTimestamp")
        && let Some(Value::Array(finalizers)) = meta.get("finalizers")
    {
        let kept: Vec<Value> = (finalizers.iter().filter_map(Value::as_str))
            .take(STUB_FINALIZERS)
            .map(capped)
            .collect();
        if !kept.is_empty() {
            m.insert("finalizers".into(), Value::Array(kept));
        }
    }
    if let Some(Value::Object(labels)) = meta.get("labels") {
        let kept: Map<String, Value> = (stub_labels().into_iter().chain(bucket_label))
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

/// `namespace/name`, or `name` for a cluster-scoped object (neither may hold a `/`).
type Name = Box<str>;

fn key(namespace: Option<&str>, name: &str) -> Name {
    match namespace {
        Some(ns) => format!("{ns}/{name}").into(),
        None => name.into(),
    }
}

/// `(namespace, name)` of a [`key`].
fn split(key: &str) -> (Option<&str>, &str) {
    match key.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, key),
    }
}

/// What the child watch judged of an object when it stored it: the hash of what its owners'
/// reconciles care about, and the owners (with their tenants) it maps to.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) print: u64,
    pub(crate) owners: Owners,
}

impl Default for Seen {
    /// No judgement: print 0, no owners (one shared empty list, not one per object).
    fn default() -> Self {
        static NO_OWNERS: std::sync::LazyLock<Owners> = std::sync::LazyLock::new(Owners::default);
        Self {
            print: 0,
            owners: Owners::clone(&NO_OWNERS),
        }
    }
}

/// One cached child: its text as a template shared with the children made alike, and what is
/// its own (see [`super::template`]); about 250 bytes however large the object.
struct Entry {
    /// The stripped object, or its [`stub`], without `apiVersion`, `kind`, name, namespace,
    /// and the uid and resourceVersion when they are kept below.
    text: Templated,
    /// The uid, when it is a UUID in canonical form other than the nil one (else zeros: it
    /// stays in the text).
    uid: [u8; 16],
    /// The resourceVersion, when it is a decimal number in `1..2^63` (else 0: in the text),
    /// and in the top bit, whether `text` is only a [`stub`].
    rv_stub: u64,
    /// What the child watch judged of it.
    seen: Seen,
}

/// The bit of [`Entry::rv_stub`] that says the entry is a stub.
const STUB_BIT: u64 = 1 << 63;

/// `uid` as 16 bytes, when it is a lower-case UUID that prints back the same.
fn compact_uid(uid: &str) -> Option<[u8; 16]> {
    let b = uid.as_bytes();
    if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
        return None;
    }
    let hex: Vec<u8> = b.iter().copied().filter(|&c| c != b'-').collect();
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    (out != [0; 16]).then_some(out)
}

fn uid_text(uid: &[u8; 16]) -> String {
    let hex: String = uid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// `rv` as a number, when it prints back the same and is above 0.
fn compact_rv(rv: &str) -> Option<u64> {
    rv.parse::<u64>()
        .ok()
        .filter(|n| *n > 0 && *n < STUB_BIT && n.to_string() == rv)
}

/// The values of an object that differ between children made alike, replaced in its template:
/// the owner-uid labels of every owner kind first (an owner's children are listed by them),
/// then its owners' uids and names, its tenant and shard labels, its fingerprints and its
/// creation time.
fn own_values<'a>(meta: &'a Map<String, Value>, known: &[Labels]) -> Vec<&'a str> {
    let labels = meta.get("labels");
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let mut out: Vec<&str> = known.iter().filter_map(|l| label(l.owner_uid())).collect();
    for r in meta
        .get("ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.extend(["uid", "name"].iter().filter_map(|f| r.get(*f)?.as_str()));
    }
    for l in known {
        out.extend(label(l.tenant()));
        out.extend(label(l.shard_bucket()));
        out.extend(annotation(meta, *l));
    }
    out.extend(meta.get("creationTimestamp").and_then(Value::as_str));
    out
}

/// The fingerprint annotation of owner kind `labels` in `meta`.
fn annotation(meta: &Map<String, Value>, labels: Labels) -> Option<&str> {
    meta.get("annotations")?.get(labels.fingerprint())?.as_str()
}

impl Entry {
    /// The entry of `obj` (stripped, or a stub) at `key`, its texts interned in `interner`, as
    /// the child watch judged it (`seen`).
    fn new(mut obj: Value, key: &str, stub: bool, interner: &Interner, seen: Seen) -> Self {
        let (namespace, name) = split(key);
        let (mut uid, mut rv) = (None, 0);
        if let Some(o) = obj.as_object_mut() {
            o.remove("apiVersion");
            o.remove("kind");
        }
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("name");
            meta.remove("namespace");
            uid = meta
                .get("uid")
                .and_then(Value::as_str)
                .and_then(compact_uid);
            if uid.is_some() {
                meta.remove("uid");
            }
            rv = meta
                .get("resourceVersion")
                .and_then(Value::as_str)
                .and_then(compact_rv)
                .unwrap_or(0);
            if rv > 0 {
                meta.remove("resourceVersion");
            }
        }
        let json = obj.to_string();
        let empty = Map::new();
        let meta = obj
            .get("metadata")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        // One look at the interned label sets per object (they are behind a global lock).
        let known = Labels::known();
        let print = known.iter().find_map(|l| annotation(meta, *l));
        let text = Templated::new(
            &json,
            name,
            namespace,
            own_values(meta, &known),
            print,
            interner,
        );
        Self {
            text,
            uid: uid.unwrap_or_default(),
            rv_stub: rv | if stub { STUB_BIT } else { 0 },
            seen,
        }
    }

    fn stub(&self) -> bool {
        self.rv_stub & STUB_BIT != 0
    }

    fn rv(&self) -> u64 {
        self.rv_stub & !STUB_BIT
    }

    fn uid(&self) -> Option<String> {
        (self.uid != [0; 16]).then(|| uid_text(&self.uid))
    }

    /// The object back, as JSON, with `apiVersion` and `kind`.
    fn object(&self, key: &str, api_version: &str, kind: &str) -> Option<Value> {
        let (namespace, name) = split(key);
        let mut obj: Value = serde_json::from_str(&self.text.text(name, namespace)).ok()?;
        let o = obj.as_object_mut()?;
        o.insert("apiVersion".into(), api_version.into());
        o.insert("kind".into(), kind.into());
        let meta = o
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()))
            .as_object_mut()?;
        meta.insert("name".into(), name.into());
        if let Some(ns) = namespace {
            meta.insert("namespace".into(), ns.into());
        }
        if let Some(uid) = self.uid() {
            meta.insert("uid".into(), uid.into());
        }
        if self.rv() > 0 {
            meta.insert("resourceVersion".into(), self.rv().to_string().into());
        }
        Some(obj)
    }

    /// The `(uid, resourceVersion)` of a stub.
    fn stub_identity(&self, key: &str) -> Option<(Option<String>, Option<u64>)> {
        if !self.stub() {
            return None;
        }
        if let (Some(uid), true) = (self.uid(), self.rv() > 0) {
            return Some((Some(uid), Some(self.rv())));
        }
        let obj = self.object(key, "", "")?;
        let meta = obj.get("metadata")?;
        Some((
            meta.get("uid").and_then(Value::as_str).map(str::to_owned),
            super::rv_of(&obj),
        ))
    }

    /// Whether the object may be labelled `<labels.owner_uid()>=uid` (exactly when `uid` is a
    /// value JSON writes as it is, as a uid the API server made always is; else maybe).
    fn may_be_owned_by(&self, uid: &str) -> bool {
        self.text.has_value(uid) || uid.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\')
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
    /// The texts and values the entries share (with the other stores of the same caches).
    interner: Arc<Interner>,
    /// A label a [`stub`] keeps besides [`stub_labels`]: the bucket label its watch selects
    /// by, which a shard ring change judges every kept object by.
    bucket_label: Option<&'static str>,
    live: RwLock<Objects>,
    relist: Mutex<Option<Objects>>,
    /// Relists completed: what a pass judged of a stub before one may not hold after it.
    relists: std::sync::atomic::AtomicU64,
}

/// The object's key; `None` without a name.
fn name_of(obj: &Value) -> Option<Name> {
    let meta = obj.get("metadata")?;
    let name = meta.get("name")?.as_str()?;
    Some(key(meta.get("namespace").and_then(Value::as_str), name))
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
            interner: Arc::default(),
            bucket_label: None,
            live: RwLock::default(),
            relist: Mutex::default(),
            relists: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The store, sharing the texts of its entries with every store that shares `interner`
    /// (the stores of one set of caches: kinds whose children carry the same owners' values).
    #[must_use]
    pub(crate) fn with_interner(mut self, interner: Arc<Interner>) -> Self {
        self.interner = interner;
        self
    }

    /// The store, keeping label `label` in its stubs too: the bucket label its watch selects
    /// by ([`CompactStore::retain_labelled`] reads it).
    #[must_use]
    pub(crate) fn with_bucket_label(mut self, label: &'static str) -> Self {
        self.bucket_label = Some(label);
        self
    }

    /// `(apiVersion, kind)`.
    pub(crate) fn kind_key(&self) -> super::KindKey {
        (self.api_version.clone(), self.kind.clone())
    }

    /// Whether the object with metadata `meta` is kept whole.
    pub(crate) fn keeps_whole(&self, meta: &Value) -> bool {
        self.whole(meta)
    }

    /// As [`CompactStore::keeps_whole`], from the metadata as the watch decoded it.
    pub(crate) fn keeps_whole_meta(&self, meta: &kube::api::ObjectMeta) -> bool {
        self.trusted(
            meta.name.as_deref(),
            meta.namespace.as_deref(),
            meta.uid.as_deref(),
        )
    }

    fn whole(&self, meta: &Value) -> bool {
        let field = |f: &str| meta.get(f).and_then(Value::as_str);
        self.trusted(field("name"), field("namespace"), field("uid"))
    }

    fn trusted(&self, name: Option<&str>, namespace: Option<&str>, uid: Option<&str>) -> bool {
        let Some(trust) = &self.trust else {
            return true;
        };
        let (Some(name), Some(uid)) = (name, uid) else {
            return false;
        };
        let key = ObjectKey {
            kind: self.kind.as_str().into(),
            namespace: namespace.map(Into::into),
            name: name.into(),
        };
        trust.is_ours(&key, uid)
    }

    /// The entry of `obj`: stripped when `whole` and, in a store given a [`Trust`], within its
    /// bound of bytes no idem field manager owns ([`Trust::within_bound`]: a tenant owner's
    /// additions to one of idem's children); else its [`stub`]. With its owner uids.
    fn entry(&self, mut obj: Value, whole: bool, seen: Seen) -> Option<(Name, Entry, Vec<String>)> {
        let name = name_of(&obj)?;
        let mut whole = whole;
        if whole {
            strip(&mut obj, self.keep_status);
            whole = self.trust.as_ref().is_none_or(|t| t.within_bound(&obj));
        }
        if !whole {
            obj = stub(&obj, &self.api_version, &self.kind, self.bucket_label);
        }
        let owners = owner_uids(&obj);
        let e = Entry::new(obj, &name, !whole, &self.interner, seen);
        Some((name, e, owners))
    }

    /// Stores the object with metadata `meta`, in the relist under way when `initial`: whole
    /// (as `whole` makes it; a large object is built only then) when trusted, else its
    /// [`stub`], with what the child watch judged of it (`seen`). Returns what the watch had
    /// judged of the object stored at that name before (in the relist under way, else in the
    /// content it replaces). A stub is stored under the map's lock after a last look at the
    /// trust: the engine marks the objects it writes as trusted before it upgrades their stubs
    /// under that lock ([`CompactStore::upgrade`]), so a stub never replaces the engine's
    /// answer for good.
    pub(crate) fn put(
        &self,
        meta: &Value,
        whole: impl FnOnce() -> Option<Value>,
        initial: bool,
        seen: Seen,
    ) -> Option<Seen> {
        let stub_entry = |seen| self.entry(serde_json::json!({ "metadata": meta }), false, seen);
        if initial {
            let mut relist = self.relist.lock().ok()?;
            let listed = relist.get_or_insert_with(Objects::default);
            let e = if self.whole(meta) {
                whole().and_then(|v| self.entry(v, true, seen))
            } else {
                stub_entry(seen)
            };
            let (name, e, owners) = e?;
            let before = listed.insert(name.clone(), e, &owners, &self.interner);
            drop(relist);
            self.judged_before(before, &name)
        } else if self.whole(meta) {
            // Built outside the lock (a whole object may be large).
            let built = whole().and_then(|v| self.entry(v, true, seen))?;
            self.store(built, false)
        } else {
            let mut live = self.live.write().ok()?;
            let e = if self.whole(meta) {
                whole().and_then(|v| self.entry(v, true, seen))
            } else {
                stub_entry(seen)
            };
            let (name, e, owners) = e?;
            live.insert(name, e, &owners, &self.interner)
                .map(|e| e.seen)
        }
    }

    /// As [`CompactStore::put`] for an object the watch has decoded whole (`obj`, JSON): the
    /// object itself is stored, without a second decode of its text; its stub when it is not
    /// (or no longer) trusted.
    pub(crate) fn put_parsed(&self, obj: Value, initial: bool, seen: Seen) -> Option<Seen> {
        if !obj.get("metadata").is_some_and(|meta| self.whole(meta)) {
            let meta = obj.get("metadata").cloned().unwrap_or_default();
            return self.put(&meta, || None, initial, seen);
        }
        let built = self.entry(obj, true, seen)?;
        self.store(built, initial)
    }

    /// Stores an entry built outside the locks in the relist under way (`initial`) or the
    /// content; returns what was judged of the object at its name before (see `put`).
    fn store(&self, (name, e, owners): (Name, Entry, Vec<String>), initial: bool) -> Option<Seen> {
        if initial {
            let mut relist = self.relist.lock().ok()?;
            let listed = relist.get_or_insert_with(Objects::default);
            let before = listed.insert(name.clone(), e, &owners, &self.interner);
            drop(relist);
            self.judged_before(before, &name)
        } else {
            let mut live = self.live.write().ok()?;
            live.insert(name, e, &owners, &self.interner)
                .map(|e| e.seen)
        }
    }

    /// What was judged of the object at `name` before a relist stored an entry there: of the
    /// entry it replaced in the relist (`before`), else of the content's.
    fn judged_before(&self, before: Option<Entry>, name: &Name) -> Option<Seen> {
        before.map(|e| e.seen).or_else(|| {
            let live = self.live.read().ok()?;
            Some(live.get(name)?.seen.clone())
        })
    }

    /// What the child watch last judged of the object `namespace/name` (in the relist under
    /// way, else in the content).
    pub(crate) fn seen(&self, namespace: Option<&str>, name: &str) -> Option<Seen> {
        let k = key(namespace, name);
        let listed = self
            .relist
            .lock()
            .ok()
            .and_then(|r| Some(r.as_ref()?.get(&k)?.seen.clone()));
        listed.or_else(|| Some(self.live.read().ok()?.get(&k)?.seen.clone()))
    }

    /// A watch `Apply` event: stores `obj` (as JSON).
    #[cfg(test)]
    pub(crate) fn apply(&self, obj: Value) {
        let meta = obj.get("metadata").cloned().unwrap_or_default();
        self.put(&meta, || Some(obj), false, Seen::default());
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
            e.stub_identity(&name).is_some_and(|(stub_uid, stub_rv)| {
                stub_uid.as_deref() == uid && uid.is_some() && stub_rv <= rv
            })
        };
        // Built outside the locks (a child may be large); `None` beyond the bound (it stays a
        // stub).
        let build = || {
            self.entry(obj.clone(), true, Seen::default())
                .filter(|(_, e, _)| !e.stub())
                .map(|(_, e, owners)| (e, owners))
        };
        let stubbed = |map: &Objects| map.get(&name).is_some_and(|e| e.stub());
        let in_live = self.live.read().is_ok_and(|live| stubbed(&live));
        let in_relist = self
            .relist
            .lock()
            .is_ok_and(|r| r.as_ref().is_some_and(stubbed));
        if !in_live && !in_relist {
            return; // the common case: nothing to replace, no write lock taken
        }
        let Some(built) = build() else {
            return;
        };
        let mut built = Some(built);
        // The relist's lock first and held across both, in the order `init_done` takes them:
        // a relist that ends meanwhile cannot swap in its stub between the two updates. The
        // watch's judgement of the stub stays with the object that replaces it.
        let Ok(mut relist) = self.relist.lock() else {
            return;
        };
        if let Ok(mut live) = self.live.write()
            && let Some(seen) = live
                .get(&name)
                .filter(|e| replaces(e))
                .map(|e| e.seen.clone())
            && let Some((mut e, owners)) = built.take()
        {
            e.seen = seen;
            live.insert(name.clone(), e, &owners, &self.interner);
        }
        if let Some(listed) = relist.as_mut()
            && let Some(seen) = listed
                .get(&name)
                .filter(|e| replaces(e))
                .map(|e| e.seen.clone())
            && let Some((mut e, owners)) = built.take().or_else(build)
        {
            e.seen = seen;
            listed.insert(name, e, &owners, &self.interner);
        }
    }

    /// A watch `Delete` event.
    pub(crate) fn delete(&self, namespace: Option<&str>, name: &str) {
        if let Ok(mut live) = self.live.write() {
            live.remove(&key(namespace, name));
        }
    }

    /// Drops the objects whose `label` holds a value `keep` refuses (`None`: no such label), and
    /// a relist under way; returns their keys `(namespace, name)` with their uids. For a store
    /// kept from a watch that selected other buckets.
    pub(crate) fn retain_labelled(
        &self,
        label: &str,
        keep: impl Fn(Option<&str>) -> bool,
    ) -> Vec<(Option<String>, String, Option<String>)> {
        if let Ok(mut relist) = self.relist.lock() {
            *relist = None;
        }
        let Ok(mut live) = self.live.write() else {
            return Vec::new();
        };
        let dropped: Vec<(Name, Option<String>)> = live
            .iter()
            .filter_map(|(name, e)| {
                let obj = e.object(name, "", "")?;
                let value = obj
                    .pointer("/metadata/labels")
                    .and_then(|l| l.get(label))
                    .and_then(Value::as_str);
                let uid = obj.pointer("/metadata/uid").and_then(Value::as_str);
                (!keep(value)).then(|| (name.clone(), uid.map(str::to_owned)))
            })
            .collect();
        dropped
            .into_iter()
            .map(|(name, uid)| {
                live.remove(&name);
                let (namespace, short) = split(&name);
                (namespace.map(str::to_owned), short.to_owned(), uid)
            })
            .collect()
    }

    /// A watch `Init` event: a relist starts.
    pub(crate) fn init(&self) {
        if let Ok(mut relist) = self.relist.lock() {
            *relist = Some(Objects::default());
        }
    }

    /// A watch `InitApply` event: `obj` is part of the relist.
    #[cfg(test)]
    pub(crate) fn init_apply(&self, obj: Value) {
        let meta = obj.get("metadata").cloned().unwrap_or_default();
        self.put(&meta, || Some(obj), true, Seen::default());
    }

    /// A watch `InitDone` event: the relist replaces the content. Returns the objects it no
    /// longer holds, with the owners the watch last mapped each to. The relist stays locked
    /// until it is the content, and an engine's [`CompactStore::upgrade`] holds the same lock
    /// across its updates of both, so it lands in both or in the content after the swap (an
    /// upgrade never adds or removes an object, so what vanished is found under the read
    /// lock: readers wait only for the swap).
    pub(crate) fn init_done(&self) -> Vec<Vanished> {
        let Ok(mut relist) = self.relist.lock() else {
            return Vec::new();
        };
        let Some(listed) = relist.take() else {
            return Vec::new();
        };
        let vanished = self.live.read().map_or_else(
            |_| Vec::new(),
            |live| {
                live.iter()
                    .filter(|(name, _)| listed.get(name).is_none())
                    .map(|(name, e)| {
                        let (namespace, short) = split(name);
                        Vanished {
                            namespace: namespace.map(str::to_owned),
                            name: short.to_owned(),
                            uid: e.uid().or_else(|| {
                                let obj = e.object(name, "", "")?;
                                Some(obj.pointer("/metadata/uid")?.as_str()?.to_owned())
                            }),
                            owners: e.seen.owners.clone(),
                        }
                    })
                    .collect()
            },
        );
        if let Ok(mut live) = self.live.write() {
            *live = listed;
        }
        self.relists
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        drop(relist);
        vanished
    }
}

/// An object a relist no longer holds (deleted while the watch was down).
pub(crate) struct Vanished {
    pub(crate) namespace: Option<String>,
    pub(crate) name: String,
    pub(crate) uid: Option<String>,
    /// The owners the watch last mapped it to.
    pub(crate) owners: Owners,
}

impl KindView for CompactStore {
    fn get(&self, namespace: Option<&str>, name: &str) -> Option<(Value, bool)> {
        let live = self.live.read().ok()?;
        let k = key(namespace, name);
        let e = live.get(&k)?;
        Some((e.object(&k, &self.api_version, &self.kind)?, e.stub()))
    }

    fn is_stub(&self, namespace: Option<&str>, name: &str) -> bool {
        self.live
            .read()
            .ok()
            .and_then(|live| Some(live.get(&key(namespace, name))?.stub()))
            .unwrap_or(false)
    }

    fn upgrade(&self, obj: &Value) {
        CompactStore::upgrade(self, obj);
    }

    fn relists(&self) -> u64 {
        self.relists.load(std::sync::atomic::Ordering::Acquire)
    }

    fn keeps_status(&self) -> bool {
        self.keep_status
    }

    fn owned_by(&self, namespace: Option<&str>, labels: Labels, uid: &str) -> Vec<ObjectMeta> {
        let Ok(live) = self.live.read() else {
            return Vec::new();
        };
        // Only the entries that may carry the owner's uid, not the kind's whole cache.
        live.owned(uid)
            .filter(|(k, _)| namespace.is_none() || split(k).0 == namespace)
            .filter(|(_, e)| e.may_be_owned_by(uid))
            .filter_map(|(k, e)| e.object(k, &self.api_version, &self.kind))
            .filter(|obj| {
                obj.pointer("/metadata/labels")
                    .and_then(|l| l.get(labels.owner_uid()))
                    .and_then(Value::as_str)
                    == Some(uid)
            })
            .filter_map(|mut obj| serde_json::from_value::<ObjectMeta>(obj["metadata"].take()).ok())
            .collect()
    }

    fn resource_version(&self, namespace: Option<&str>, name: &str) -> Option<u64> {
        let live = self.live.read().ok()?;
        let k = key(namespace, name);
        let e = live.get(&k)?;
        match e.rv() {
            0 => super::rv_of(&e.object(&k, &self.api_version, &self.kind)?),
            rv => Some(rv),
        }
    }

    fn len(&self) -> usize {
        self.live.read().map(|l| l.len()).unwrap_or(0)
    }

    fn stubs(&self) -> usize {
        (self.live.read())
            .map(|l| l.iter().filter(|(_, e)| e.stub()).count())
            .unwrap_or(0)
    }
}

mod objects;
#[cfg(test)]
mod tests;
