//! The source layer's caches of live children: the controller's reflector stores (one per child
//! kind), the results of the engine's own writes until the stores catch up, and what the API
//! server answered about them; filled by the controller's watches, read by the apply engine.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::ApiResource;
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Serialize;
use serde_json::Value;

use self::own_writes::OwnWrites;
use crate::key::ObjectKey;
use crate::labels::Labels;

mod answers;
mod compact;
mod foreign;
mod judged;
mod own_writes;
mod resume;
mod template;
mod trust;
pub(crate) use answers::Answers;
pub(crate) use compact::{CompactStore, LAST_APPLIED, Seen};
pub(crate) use foreign::{FOREIGN_BYTES_MAX, bytes_beyond};
pub(crate) use own_writes::{InFlight, Origin};
pub(crate) use resume::Resume;
pub(crate) use trust::Trust;

/// More own-write results than this are dropped at once (they only save a redundant apply).
const OVERLAY_CAP: usize = 10_000;

/// How long an own-write result stands in for an object its store does not hold. Longer than
/// a watch takes to deliver our write (the own-write settle timeout); after it, the store's
/// "absent" wins, so a stale result can never keep a deleted child from being created again.
const OVERLAY_TRUST: Duration = own_writes::SETTLE_TIMEOUT;

/// One kind's store, seen as JSON.
trait KindView: Send + Sync {
    /// The object `namespace/name`, as JSON (with `metadata.managedFields`), and whether that
    /// is only a stub of it (see [`CompactStore`]).
    fn get(&self, namespace: Option<&str>, name: &str) -> Option<(Value, bool)>;
    /// Whether the object `namespace/name` is held as a stub only (without building it).
    fn is_stub(&self, namespace: Option<&str>, name: &str) -> bool {
        let _ = (namespace, name);
        false
    }
    /// Replaces a stub of `obj` with `obj` (the engine's own copy); see
    /// [`CompactStore::upgrade`].
    fn upgrade(&self, obj: &Value) {
        let _ = obj;
    }
    /// Relists completed (a stub's content before one is not known to be its content after).
    fn relists(&self) -> u64 {
        0
    }
    /// Metadata of the objects labelled `<labels.owner_uid()>=uid` ([`Labels::owner_uid`] of
    /// the owner's kind), in `namespace` when given.
    fn owned_by(&self, namespace: Option<&str>, labels: Labels, uid: &str) -> Vec<ObjectMeta>;
    /// The `resourceVersion` (as a number) of the object `namespace/name` held, whole or as a
    /// stub; `None` when none is held or its version is not a number.
    fn resource_version(&self, namespace: Option<&str>, name: &str) -> Option<u64>;
    /// Objects stored.
    fn len(&self) -> usize;
    /// Objects stored as stubs only.
    fn stubs(&self) -> usize {
        0
    }
    /// Whether the objects keep their `status` (a kind watched to read it).
    fn keeps_status(&self) -> bool {
        true
    }
}

impl<C> KindView for Store<C>
where
    C: Resource<DynamicType = ()> + Serialize + Clone + Send + Sync + 'static,
{
    fn get(&self, namespace: Option<&str>, name: &str) -> Option<(Value, bool)> {
        let mut r = ObjectRef::<C>::new(name);
        if let Some(ns) = namespace {
            r = r.within(ns);
        }
        let obj = Store::get(self, &r)?;
        let mut v = serde_json::to_value(obj.as_ref()).ok()?;
        // Typed objects serialise without apiVersion/kind.
        v["apiVersion"] = Value::String(C::api_version(&()).into_owned());
        v["kind"] = Value::String(C::kind(&()).into_owned());
        Some((v, false))
    }

    fn owned_by(&self, namespace: Option<&str>, labels: Labels, uid: &str) -> Vec<ObjectMeta> {
        self.state()
            .iter()
            .map(|o| o.meta())
            .filter(|m| namespace.is_none() || m.namespace.as_deref() == namespace)
            .filter(|m| {
                m.labels
                    .as_ref()
                    .and_then(|l| l.get(labels.owner_uid()))
                    .is_some_and(|v| v == uid)
            })
            .cloned()
            .collect()
    }

    fn resource_version(&self, namespace: Option<&str>, name: &str) -> Option<u64> {
        let mut r = ObjectRef::<C>::new(name);
        if let Some(ns) = namespace {
            r = r.within(ns);
        }
        Store::get(self, &r)?
            .meta()
            .resource_version
            .as_deref()?
            .parse()
            .ok()
    }

    fn len(&self) -> usize {
        self.state().len()
    }
}

/// The caches of child kinds shared by the controllers (which fill them from their watches)
/// and the [`Applier`](crate::apply::Applier) (which reads children and lists them for pruning from
/// them instead of the API server). Cheap to clone.
///
/// Consistency (client-go's informer-cache rules): a store is registered only once its first
/// list is complete; an object written by the engine is remembered with the server's answer
/// until the store has that `resourceVersion` or a later one, so the engine's own writes are
/// never judged on a stale copy; a write that meets 409 Conflict or 404 Not Found re-reads the
/// object from the API server. A store watched with a label selector does not see objects
/// without that label: the engine's create then meets `AlreadyExists` and reads the object.
///
/// Own writes (controller-runtime's "expectations"): the `resourceVersion` each write of the
/// engine returned is remembered until the child's watch delivers it, and the watch does not
/// enqueue the owner for that event (an event that arrives while a write of the same child is
/// still in flight waits for the write's answer, at most 30 s).
///
/// Memory (for the watches of a controller whose owners keep a record of the children they
/// created, [`Controller::with_child_records`]): only idem's children are kept whole — an
/// object whose uid is in an owner's record, or that the engine created (or judged its own at
/// a desired name) in this process. Any other object the label-selected watches deliver, such
/// as one a tenant owner labelled and referenced as an owner's child, is kept as a stub of a
/// few hundred bytes whatever its size (its identity, the labels idem selects on, its
/// controller ownerReference); the engine reads it from the API server when it must judge it.
///
/// [`Controller::with_child_records`]: crate::controller::Controller::with_child_records
#[derive(Clone, Default)]
pub struct ChildCaches {
    kinds: Arc<RwLock<HashMap<KindKey, Arc<dyn KindView>>>>,
    /// The answers to our writes the stores do not show yet.
    overlay: Arc<Mutex<HashMap<ObjectKey, Written>>>,
    /// Names taken by objects we do not own (seen on a create's AlreadyExists): the caches,
    /// filtered by label, do not hold them, so they are read from the API server rather than
    /// created again.
    foreign: Arc<Mutex<std::collections::HashSet<ObjectKey>>>,
    /// The `resourceVersion`s our writes returned, for the child watches.
    own: Arc<OwnWrites>,
    /// Which children are idem's (kept whole by the stores that ask).
    trust: Arc<Trust>,
    /// Whether a store asks or will ask the trust ([`ChildCaches::will_trust`]): until then
    /// what the engine writes need not be remembered as its own (every store keeps every
    /// object whole).
    trust_asked: Arc<AtomicBool>,
    /// The server's answers for children the convergence check cannot judge alone, shared by
    /// every pass's applier, dropped with the child.
    answers: Answers,
    /// The stubs of idem's children last judged converged (read again only once changed).
    judged: Arc<judged::JudgedStubs>,
    /// The texts the child stores' entries share (an owner's uid and name are in each of its
    /// children, whatever their kind).
    interner: Arc<template::Interner>,
    /// What each child watch leaves for the next run on these caches, by kind.
    resume: Arc<Mutex<HashMap<KindKey, Arc<Resume>>>>,
    /// What each primary watch leaves for the next run on these caches, by kind (a
    /// `Resume<Store<K>>`).
    primaries: Arc<Mutex<HashMap<String, Arc<dyn std::any::Any + Send + Sync>>>>,
}

impl std::fmt::Debug for ChildCaches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds: Vec<(String, String)> = self
            .kinds
            .read()
            .map(|k| k.keys().cloned().collect())
            .unwrap_or_default();
        f.debug_struct("ChildCaches")
            .field("kinds", &kinds)
            .finish()
    }
}

/// `(apiVersion, kind)`.
type KindKey = (String, String);

/// The server's answer to one of our writes, kept until the child's store shows it: as JSON
/// text (a parsed object costs several times its text while a fill's answers wait for their
/// watch events).
struct Written {
    at: Instant,
    resource_version: Option<u64>,
    text: Box<str>,
}

impl Written {
    fn new(obj: &Value) -> Self {
        Self {
            at: Instant::now(),
            resource_version: rv_of(obj),
            text: obj.to_string().into(),
        }
    }

    fn object(&self) -> Option<Value> {
        serde_json::from_str(&self.text).ok()
    }
}

fn kind_key(resource: &ApiResource) -> KindKey {
    (resource.api_version.clone(), resource.kind.clone())
}

/// `resourceVersion` as a number; Kubernetes' are etcd revisions (decimal integers), which is
/// what client-go's cache mutation detector and "newer than" checks rely on too.
fn rv_of(v: &Value) -> Option<u64> {
    v.pointer("/metadata/resourceVersion")?
        .as_str()?
        .parse()
        .ok()
}

impl ChildCaches {
    /// No stores yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves kind `C` from `store` (call once its first list is complete).
    pub fn register<C>(&self, store: Store<C>)
    where
        C: Resource<DynamicType = ()> + Serialize + Clone + Send + Sync + 'static,
    {
        let resource = ApiResource::erase::<C>(&());
        if let Ok(mut kinds) = self.kinds.write() {
            kinds.insert(kind_key(&resource), Arc::new(store));
        }
    }

    /// Serves `store`'s kind from it (call once its first list is complete): what the
    /// controller's child watches register, see [`CompactStore`].
    pub(crate) fn register_compact(&self, store: Arc<CompactStore>) {
        if let Ok(mut kinds) = self.kinds.write() {
            kinds.insert(store.kind_key(), store);
        }
    }

    /// Whether kind `resource` is served from a store.
    pub fn serves(&self, resource: &ApiResource) -> bool {
        self.view(resource).is_some()
    }

    /// Whether kind `resource`'s store keeps the objects' `status`; `None` when the kind is not
    /// served from a store.
    pub(crate) fn keeps_status(&self, resource: &ApiResource) -> Option<bool> {
        Some(self.view(resource)?.keeps_status())
    }

    /// Objects held in all stores.
    pub fn objects(&self) -> usize {
        self.kinds
            .read()
            .map(|k| k.values().map(|v| v.len()).sum())
            .unwrap_or(0)
    }

    /// Objects held in all stores as stubs only: not idem's (whatever they claim), or idem's
    /// holding more that idem does not own than the caches keep whole.
    pub fn stubs(&self) -> usize {
        self.kinds
            .read()
            .map(|k| k.values().map(|v| v.stubs()).sum())
            .unwrap_or(0)
    }

    fn view(&self, resource: &ApiResource) -> Option<Arc<dyn KindView>> {
        self.kinds.read().ok()?.get(&kind_key(resource)).cloned()
    }

    /// The texts every child store of these caches shares.
    pub(crate) fn interner(&self) -> Arc<template::Interner> {
        Arc::clone(&self.interner)
    }

    /// The trust the stores of children of owners with a record ask.
    pub(crate) fn trust(&self) -> Arc<Trust> {
        self.will_trust();
        Arc::clone(&self.trust)
    }

    /// A controller whose stores will ask the trust is built on these caches (before any of
    /// them runs): from now on the engine's writes are remembered as its own. Caches shared
    /// with writers that run before such a controller is built (an `Applier` of their own)
    /// keep no memory of those writes: the children they wrote are read once from the API
    /// server when that controller's stores hold them as stubs, and trusted from then on.
    pub(crate) fn will_trust(&self) {
        self.trust_asked.store(true, Ordering::Release);
    }

    /// The child `key` of kind `resource`: `None` when the kind is not cached, or the cache
    /// holds only a stub of the object (read it from the API server); `Some(None)` when the
    /// cache says it does not exist.
    pub(crate) fn get(&self, resource: &ApiResource, key: &ObjectKey) -> Option<Option<Value>> {
        let view = self.view(resource)?;
        let (cached, stub) = match view.get(key.namespace.as_deref(), &key.name) {
            Some((v, stub)) => (Some(v), stub),
            None => (None, false),
        };
        let mut overlay = self.overlay.lock().ok()?;
        let Some(ours) = overlay.get(key) else {
            return (!stub).then_some(cached);
        };
        if cached.is_none() && ours.at.elapsed() > OVERLAY_TRUST {
            // The store never showed our write, or showed it and lost the object since (a
            // delete, or a label change that took it out of the watch's selector, racing the
            // write's answer): trust the store, so a missing child is created again (a create
            // that meets AlreadyExists reads the API server).
            overlay.remove(key);
            return Some(None);
        }
        match (&cached, ours.resource_version) {
            (Some(c), Some(mine)) if rv_of(c).is_some_and(|rv| rv >= mine) => {
                overlay.remove(key);
                (!stub).then_some(cached)
            }
            // Unreadable (never: it is our own serialisation), it is not taken for absent.
            _ => ours.object().map(Some),
        }
    }

    /// The uid of the child `key` of kind `resource` when the cache holds a stub of it that a
    /// pass judged converged with the desired body `desired` ([`keyed_fingerprint`]) at the
    /// version the stub shows, and no write of ours to it is pending: a pass desiring the same
    /// body would judge it the same way without reading it. `None` otherwise (read it).
    ///
    /// [`keyed_fingerprint`]: crate::compare::keyed_fingerprint
    pub(crate) fn converged_stub(
        &self,
        resource: &ApiResource,
        key: &ObjectKey,
        desired: crate::compare::Fingerprint,
    ) -> Option<String> {
        let view = self.view(resource)?;
        let (stub, true) = view.get(key.namespace.as_deref(), &key.name)? else {
            return None;
        };
        if self.overlay.lock().ok()?.contains_key(key)
            || stub.pointer("/metadata/deletionTimestamp").is_some()
        {
            return None;
        }
        let uid = stub.pointer("/metadata/uid")?.as_str()?;
        let at = (rv_of(&stub)?, view.relists());
        self.judged
            .still_converged(key, uid, at, desired)
            .then(|| uid.to_owned())
    }

    /// A pass judged `live`, the child `key` of kind `resource`, converged with the desired
    /// body `desired`: remembered when the cache holds it as a stub (see
    /// [`ChildCaches::converged_stub`]).
    pub(crate) fn judged_converged(
        &self,
        resource: &ApiResource,
        key: &ObjectKey,
        live: &Value,
        desired: crate::compare::Fingerprint,
    ) {
        let Some(view) = self.view(resource) else {
            return;
        };
        if !view.is_stub(key.namespace.as_deref(), &key.name) {
            return;
        }
        let uid = live.pointer("/metadata/uid").and_then(Value::as_str);
        if let (Some(uid), Some(rv)) = (uid, rv_of(live)) {
            self.judged
                .converged(key, uid, (rv, view.relists()), desired);
        }
    }

    /// Whether the cache holds only a stub of the child `key` of kind `resource` (its
    /// identity: read the object from the API server before acting on the rest of it).
    pub(crate) fn is_stub(&self, resource: &ApiResource, key: &ObjectKey) -> bool {
        self.view(resource)
            .is_some_and(|view| view.is_stub(key.namespace.as_deref(), &key.name))
    }

    /// The cached object `namespace/name` of kind `K` (with the engine's own latest write):
    /// `None` when kind `K` is not cached, `Some(None)` when the cache says it does not exist.
    /// A kind cached by a controller's child watch has no `status` unless the reconciler names
    /// it in [`Reconciler::children`](crate::reconciler::Reconciler::children) (read it
    /// with [`Pass::children`](crate::reconciler::Pass::children)) or it is owned with
    /// [`OwnsOptions::reading_status`](crate::controller::OwnsOptions::reading_status); see
    /// [`Controller::with_child_caches`](crate::controller::Controller::with_child_caches).
    pub fn lookup<K>(&self, namespace: Option<&str>, name: &str) -> Option<Option<K>>
    where
        K: Resource<DynamicType = ()> + serde::de::DeserializeOwned,
    {
        let key = ObjectKey {
            kind: K::kind(&()).as_ref().into(),
            namespace: namespace.map(Into::into),
            name: name.into(),
        };
        let found = self.get(&ApiResource::erase::<K>(&()), &key)?;
        Some(found.and_then(|v| serde_json::from_value(v).ok()))
    }

    /// Metadata of the children labelled as `uid`'s (an owner of a kind with `labels`);
    /// `None` when the kind is not cached.
    pub(crate) fn owned_by(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        labels: Labels,
        uid: &str,
    ) -> Option<Vec<ObjectMeta>> {
        Some(self.view(resource)?.owned_by(namespace, labels, uid))
    }

    /// Remembers the server's answer to our write of `key`: that object is ours (kept whole),
    /// and it stands in for the store's copy until the store shows that version.
    ///
    /// A watch often delivers the write before its answer arrives: the store then already shows
    /// that version (or a later one), which [`ChildCaches::stored`] saw before the answer was
    /// here to drop, and the answer is not kept (kept, it would stay until the child is next
    /// read: a whole object per child written, for as long as the fleet is converged). The
    /// store is looked at under the overlay's lock, which `stored` takes after the store has
    /// the event: either this sees the version, or `stored` sees the answer.
    pub(crate) fn wrote(&self, key: &ObjectKey, obj: &Value) {
        self.judged.forget(key);
        let rv = rv_of(obj);
        if let Some(rv) = rv {
            self.own.wrote(key, rv);
        }
        self.ours(key, obj);
        let view = self.view_of(obj);
        if let Ok(mut overlay) = self.overlay.lock() {
            let shown = rv.is_some_and(|mine| {
                view.and_then(|v| v.resource_version(key.namespace.as_deref(), &key.name))
                    .is_some_and(|stored| stored >= mine)
            });
            if shown {
                overlay.remove(key);
                return;
            }
            if overlay.len() >= OVERLAY_CAP {
                overlay.clear();
            }
            overlay.insert(key.clone(), Written::new(obj));
        }
    }

    /// The store of `obj`'s kind (its `apiVersion` and `kind`), if one serves it.
    fn view_of(&self, obj: &Value) -> Option<Arc<dyn KindView>> {
        let field = |f: &str| obj.get(f).and_then(Value::as_str).map(str::to_owned);
        let kind_key = (field("apiVersion")?, field("kind")?);
        self.kinds.read().ok()?.get(&kind_key).cloned()
    }

    /// `obj` at `key` is one of idem's children (the engine wrote it, or read it and judged it
    /// its own at a desired name): it is trusted from now on, and a stub of it in its store is
    /// replaced with `obj`.
    pub(crate) fn ours(&self, key: &ObjectKey, obj: &Value) {
        let Some(uid) = obj.pointer("/metadata/uid").and_then(Value::as_str) else {
            return;
        };
        // Trusted first: a watch event of it that is being stored now is then kept whole, or
        // its stub is replaced below (see `CompactStore::upgrade`). Already trusted (by a
        // record that came after its watch event), a stub of it is replaced all the same.
        if self.trust_asked.load(Ordering::Acquire) && !self.trust.is_ours(key, uid) {
            self.trust.own(key, uid);
        }
        if let Some(view) = self.view_of(obj) {
            view.upgrade(obj);
        }
    }

    /// The object `uid` at `key` was deleted (its watch's Delete event).
    pub(crate) fn deleted(&self, key: &ObjectKey, uid: &str) {
        self.trust.deleted(key, uid);
        self.answers.deleted(key, uid);
        self.judged.forget(key);
    }

    /// The server's answers, shared by the appliers that read from these caches.
    pub(crate) fn answers(&self) -> &Answers {
        &self.answers
    }

    /// Owner `owner`'s record of the children it created now holds `uids` (`None`: the owner is
    /// gone); see [`Controller::with_child_records`](crate::controller::Controller::with_child_records).
    pub(crate) fn set_record(&self, owner: &ObjectKey, uids: Option<Vec<String>>) {
        match uids {
            Some(uids) => self.trust.set_record(owner, uids),
            None => self.trust.drop_record(owner),
        }
    }

    /// Keeps the records of the owners of kind `kind` for which `listed` holds, and of every
    /// other kind (after a relist of `kind`).
    pub(crate) fn retain_records(&self, kind: &str, listed: impl Fn(&ObjectKey) -> bool) {
        self.trust
            .retain_records(|owner| &*owner.kind != kind || listed(owner));
    }

    /// Marks `key` as taken by an object we do not own (`true`) or not (`false`).
    pub(crate) fn set_foreign(&self, key: &ObjectKey, foreign: bool) {
        if let Ok(mut set) = self.foreign.lock() {
            if foreign {
                if set.len() >= OVERLAY_CAP {
                    set.clear();
                }
                set.insert(key.clone());
            } else {
                set.remove(key);
            }
        }
    }

    /// Whether `key` was last seen taken by an object we do not own.
    pub(crate) fn is_foreign(&self, key: &ObjectKey) -> bool {
        self.foreign.lock().is_ok_and(|s| s.contains(key))
    }

    /// Marks a write of `key` as in flight until the guard is dropped (after
    /// [`ChildCaches::wrote`] on success).
    pub(crate) fn begin_write(&self, key: &ObjectKey) -> InFlight {
        self.own.begin(key)
    }

    /// Whether the watch event of `key` at `resource_version` is one of our writes.
    pub(crate) fn observe(&self, key: &ObjectKey, resource_version: &str) -> Origin {
        match resource_version.parse() {
            Ok(rv) => self.own.observe(key, rv),
            Err(_) => Origin::Other,
        }
    }

    /// The store now shows `key` at `resource_version` (a watch event applied outside a
    /// relist): an own-write result no newer than that is dropped, so the results of a flood
    /// of writes are not kept until the next read of each child.
    pub(crate) fn stored(&self, key: &ObjectKey, resource_version: &str) {
        let Ok(rv) = resource_version.parse::<u64>() else {
            return;
        };
        if let Ok(mut overlay) = self.overlay.lock()
            && overlay
                .get(key)
                .is_some_and(|ours| ours.resource_version.is_some_and(|mine| mine <= rv))
        {
            overlay.remove(key);
        }
    }

    /// As [`ChildCaches::observe`], once no write of `key` is in flight any more.
    pub(crate) async fn settle(&self, key: &ObjectKey, resource_version: &str) -> Origin {
        match resource_version.parse() {
            Ok(rv) => self.own.settle(key, rv).await,
            Err(_) => Origin::Other,
        }
    }

    /// Remembers that the engine writes children as field manager `manager`.
    pub(crate) fn note_manager(&self, manager: &str) {
        self.trust.note_manager(manager);
    }

    /// The field managers the engine writes children as (noted by a
    /// [`Driver`](crate::reconciler::Driver) before its controller starts, else at the engine's
    /// first reconcile).
    pub(crate) fn managers(&self) -> std::collections::BTreeSet<String> {
        self.trust.managers()
    }

    /// Serves kind `(api_version, kind)` from the API server again (until its watch registers
    /// its store anew): what a watch resuming from an earlier run's store does until its
    /// share is complete.
    pub(crate) fn unregister(&self, api_version: &str, kind: &str) {
        if let Ok(mut kinds) = self.kinds.write() {
            kinds.remove(&(api_version.to_owned(), kind.to_owned()));
        }
    }

    /// Leaves `resume` for the next watch of its store's kind on these caches.
    pub(crate) fn leave(&self, resume: Arc<Resume>) {
        if let Ok(mut all) = self.resume.lock() {
            all.insert(resume.store.kind_key(), resume);
        }
    }

    /// What the last watch of kind `(api_version, kind)` on these caches left, taken.
    pub(crate) fn take_resume(&self, api_version: &str, kind: &str) -> Option<Arc<Resume>> {
        let mut all = self.resume.lock().ok()?;
        all.remove(&(api_version.to_owned(), kind.to_owned()))
    }

    /// Leaves `resume` (a primary watch's store of kind `K`) for the next watch of `K` on these
    /// caches.
    pub(crate) fn leave_primary<K>(&self, resume: Arc<Resume<Store<K>>>)
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        if let Ok(mut all) = self.primaries.lock() {
            all.insert(K::kind(&()).into_owned(), resume);
        }
    }

    /// What the last primary watch of kind `K` on these caches left, taken.
    pub(crate) fn take_primary<K>(&self) -> Option<Arc<Resume<Store<K>>>>
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        let left = self.primaries.lock().ok()?.remove(&*K::kind(&()))?;
        left.downcast::<Resume<Store<K>>>().ok()
    }

    /// Forgets our write of `key` (deleted: by us, or seen deleted by the watch).
    pub(crate) fn forget(&self, key: &ObjectKey) {
        self.own.forget(key);
        if let Ok(mut overlay) = self.overlay.lock() {
            overlay.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;
    use serde_json::json;

    use super::*;

    fn key() -> ObjectKey {
        ObjectKey {
            kind: "ConfigMap".into(),
            namespace: Some("ns".into()),
            name: "cm".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_own_write_the_store_does_not_hold_stands_in_only_until_the_watch_had_time() {
        let (store, _writer) = reflector::store::<ConfigMap>();
        let caches = ChildCaches::new();
        caches.register(store);
        let resource = ApiResource::erase::<ConfigMap>(&());
        let ours = json!({"metadata": {"name": "cm", "namespace": "ns", "resourceVersion": "7"}});
        caches.wrote(&key(), &ours);
        // Just written, not yet delivered by the watch: our answer is the freshest view.
        assert_eq!(caches.get(&resource, &key()), Some(Some(ours)));
        // The store still says absent long after any watch would have delivered the write
        // (the child was deleted, or left the label selector, racing our answer): absent wins.
        tokio::time::advance(OVERLAY_TRUST + Duration::from_secs(1)).await;
        assert_eq!(caches.get(&resource, &key()), Some(None));
        assert_eq!(caches.get(&resource, &key()), Some(None));
    }

    #[test]
    fn a_stub_is_read_from_the_api_server_until_the_engine_judged_the_object_its_own() {
        let caches = ChildCaches::new();
        let store = Arc::new(CompactStore::new(
            "v1",
            "ConfigMap",
            false,
            Some(caches.trust()),
        ));
        caches.register_compact(Arc::clone(&store));
        let resource = ApiResource::erase::<ConfigMap>(&());
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
            "data": {"k": "v"}});
        // Seen before any record held it (e.g. created by a pass that crashed before its
        // status write): a stub, which the engine must read from the API server.
        store.apply(obj.clone());
        assert_eq!(caches.get(&resource, &key()), None);
        // Recorded since, and judged the owner's own at a desired name after a GET: whole.
        caches.set_record(&ObjectKey::cluster("Tenant", "t"), Some(vec!["u1".into()]));
        caches.ours(&key(), &obj);
        assert_eq!(caches.get(&resource, &key()), Some(Some(obj)));
    }

    #[test]
    fn an_own_write_result_the_store_already_shows_is_not_kept() {
        let caches = ChildCaches::new();
        let store = Arc::new(CompactStore::new("v1", "ConfigMap", false, None));
        caches.register_compact(Arc::clone(&store));
        let resource = ApiResource::erase::<ConfigMap>(&());
        let obj = |rv: &str| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "cm", "namespace": "ns", "uid": "u1", "resourceVersion": rv},
                "data": {"k": "v"}})
        };
        // The watch delivered version 8 (ours, or a later change) before the answer to our
        // write of version 7 arrived: `stored` found nothing to drop then.
        store.apply(obj("8"));
        caches.stored(&key(), "8");
        caches.wrote(&key(), &obj("7"));
        assert!(caches.overlay.lock().unwrap().is_empty());
        caches.wrote(&key(), &obj("8"));
        assert!(caches.overlay.lock().unwrap().is_empty());
        assert_eq!(caches.get(&resource, &key()), Some(Some(obj("8"))));
        // An answer newer than the store still stands in for it until the watch catches up.
        caches.wrote(&key(), &obj("9"));
        assert_eq!(caches.get(&resource, &key()), Some(Some(obj("9"))));
        store.apply(obj("9"));
        caches.stored(&key(), "9");
        assert!(caches.overlay.lock().unwrap().is_empty());
    }

    #[test]
    fn an_own_write_result_is_dropped_once_the_store_shows_that_version() {
        let caches = ChildCaches::new();
        let ours = |rv: &str| json!({"metadata": {"name": "cm", "resourceVersion": rv}});
        caches.wrote(&key(), &ours("7"));
        caches.stored(&key(), "6"); // an older event: our result is still the freshest
        assert_eq!(caches.overlay.lock().unwrap().len(), 1);
        caches.stored(&key(), "7");
        assert!(caches.overlay.lock().unwrap().is_empty());
    }
}
