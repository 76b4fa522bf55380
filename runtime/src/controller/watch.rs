//! The watch side of the controller: kube-runtime `watcher` + `reflector` streams of the
//! primary kind and of owned children, turned into queue adds.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use kube::core::ApiResource;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::child_change::{OwnsOptions, child_print_meta, child_print_text};
use super::mapping::{default_tenant, fingerprint, key_of, owners_of};
use super::raw::Raw;
use super::relist::{not_established, not_found, relisting};
use crate::backoff::watch_backoff;
use crate::cache::{ChildCaches, CompactStore, Origin, Resume, Seen};
use crate::key::{ObjectKey, Owners, SharedStrings, TenantKey};
use crate::labels::Labels;
use crate::queue::{Priority, WorkQueue};

/// Maps a primary object to its tenant.
pub(crate) type TenantFn<K> = Arc<dyn Fn(&K) -> TenantKey + Send + Sync>;
/// The change predicate of a primary object: a new value enqueues it (default
/// [`fingerprint`] of its metadata).
pub(crate) type ChangeFn<K> = Arc<dyn Fn(&K) -> u64 + Send + Sync>;
/// Maps a primary object to its tenant's weight.
pub(crate) type WeightFn<K> = Arc<dyn Fn(&K) -> u32 + Send + Sync>;
/// The uids of the children a primary object recorded as created (its status' record).
pub(crate) type RecordFn<K> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

/// What the watch tasks share.
pub(crate) struct Shared<K: Resource<DynamicType = ()> + 'static> {
    pub queue: WorkQueue,
    pub store: Store<K>,
    pub tenant_of: TenantFn<K>,
    /// The names of the labels on `K`'s children.
    pub label_names: Labels,
    pub weight_of: Option<WeightFn<K>>,
    pub change_of: Option<ChangeFn<K>>,
    /// Where child watches publish their stores for the apply engine.
    pub caches: Option<ChildCaches>,
    /// The record of each primary object (with `caches`: the child stores keep only recorded
    /// children, and those the engine wrote, whole).
    pub record_of: Option<RecordFn<K>>,
    /// Why each key was queued, for the reconcile's [`super::Reason`].
    pub reasons: super::reason::Reasons,
    /// The watches of objects blocking an owner's children (ended when the owner is deleted).
    pub blocked: super::BlockedWatches,
    /// The child kinds whose status the reconcile reads (as if owned
    /// [`OwnsOptions::reading_status`]).
    pub reads_status: super::KindSet,
    /// Kinds, namespaces, owners, tenants and owner lists, shared by the keys of every child
    /// watch's children.
    pub strings: std::sync::Mutex<SharedStrings>,
    /// The primary objects the cache keeps ([`super::Controller::shard_cache`]); `None`: all.
    pub keep: Option<super::OwnsFn<K>>,
    /// The child watches' bucket label and this run's buckets
    /// ([`super::Controller::resume`]).
    pub resume: Option<(&'static str, crate::shard::Ranges)>,
    /// Whether the primary watch goes on from the last run's store
    /// ([`super::Controller::resume_primary`]).
    pub resume_primary: bool,
}

impl<K> Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    fn tenant(&self, obj: &K) -> TenantKey {
        let tenant = (self.tenant_of)(obj);
        if let Some(weight_of) = &self.weight_of {
            let weight = weight_of(obj);
            if let Err(e) = self.queue.set_weight(&tenant, weight) {
                tracing::warn!(object = %key_of(obj), error = %e, "ignoring tenant weight");
            }
        }
        tenant
    }

    /// The uid of the cached owner of `owner`, if cached.
    fn owner_uid(&self, owner: &ObjectKey) -> Option<String> {
        let mut r = ObjectRef::<K>::new(&owner.name);
        if let Some(ns) = &owner.namespace {
            r = r.within(ns);
        }
        self.store.get(&r).and_then(|o| o.meta().uid.clone())
    }

    /// The tenant of an owner key: from the cached owner, else from the child's metadata.
    fn owner_tenant(&self, owner: &ObjectKey, child: &kube::api::ObjectMeta) -> TenantKey {
        let mut r = ObjectRef::<K>::new(&owner.name);
        if let Some(ns) = &owner.namespace {
            r = r.within(ns);
        }
        match self.store.get(&r) {
            Some(obj) => self.tenant(&obj),
            None => default_tenant(child, self.label_names),
        }
    }
}

/// A boxed watch task plus its readiness: `true` while its cache is synced and its watch
/// established — from the end of each complete list until an error says the watch is not
/// established ([`not_established`]; a Kubernetes watch cache that is not synced is not ready,
/// as client-go's `HasSynced` before the first list).
pub(crate) struct WatchTask {
    pub run: BoxFuture<'static, ()>,
    pub synced: watch::Receiver<bool>,
}

/// Drive the primary watch: keep the store, and enqueue objects whose fingerprint changed
/// (status-only writes do not enqueue).
pub(crate) fn primary<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    shared: Arc<Shared<K>>,
) -> WatchTask
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (tx, synced) = watch::channel(false);
    let run = async move {
        // The store keeps no managedFields of a primary: nothing judges an owner by them, and
        // they are most of a small object's size (the creator's and each status writer's field
        // sets), kept once per primary for as long as it lives. Nor kubectl's
        // last-applied-configuration annotation: a copy of the whole object as its author last
        // applied it (as big as the spec), which only kubectl reads. The status write (the
        // status subresource) changes nothing but the status, so neither is lost on the server.
        // Another replica's objects, when nothing here reads them, are not kept at all.
        let keep = shared.keep.clone();
        // A run after a shard ring change goes on from the store the run before left, when
        // that store holds every object of the kind (nothing is gained: no list at all; see
        // `Controller::resume_primary`).
        let resumable = shared.resume.is_some() && shared.resume_primary && keep.is_none();
        let left = match (&shared.caches, resumable) {
            (Some(caches), true) => caches.take_primary::<K>(),
            _ => None,
        };
        let left = left.and_then(|left| Some((left.version()?, left)));
        let leave = match (&shared.caches, &shared.resume, resumable) {
            (Some(caches), Some((_, now)), true) => {
                let leave = Arc::new(Resume::new(shared.store.clone(), now.clone()));
                caches.leave_primary(Arc::clone(&leave));
                Some(leave)
            }
            _ => None,
        };
        let events = match (left, &leave) {
            (Some((rv, left)), _) => {
                let kept: Vec<K> = left.store.state().iter().map(|o| K::clone(o)).collect();
                tracing::info!(kind = %K::kind(&()), objects = kept.len(), rv,
                    "primary watch going on from the store of the ring before");
                let from = super::resume::From {
                    kept,
                    gained: None,
                    rv,
                };
                super::resume::resuming(api, config, Some(from), leave.clone()).boxed()
            }
            // A run that may go on in the next: a watch that knows its store's version.
            (None, Some(_)) => super::resume::resuming(api, config, None, leave.clone()).boxed(),
            (None, None) => relisting(api, config).boxed(),
        };
        let events = events
            .filter(move |event| {
                let kept = match (&keep, event) {
                    (Some(keep), Ok(Event::Apply(obj) | Event::InitApply(obj))) => keep(obj),
                    _ => true,
                };
                std::future::ready(kept)
            })
            .map_ok(|event| {
                event.modify(|obj| {
                    let meta = obj.meta_mut();
                    meta.managed_fields = None;
                    if let Some(annotations) = meta.annotations.as_mut() {
                        annotations.remove(crate::cache::LAST_APPLIED);
                    }
                })
            });
        let stream = reflector::reflector(writer, watch_backoff(events));
        let mut first_list = true;
        futures::pin_mut!(stream);
        // Keyed by name, valued with the uid: a delete + create under the same name is a
        // change even when the Delete event was lost in a relist.
        let mut seen: HashMap<ObjectKey, (u64, u64)> = HashMap::new();
        let mut listed: HashSet<ObjectKey> = HashSet::new();
        // Adds decided during a list, made once it is complete (`InitDone`): only then has the
        // reflector swapped in the listed objects, and a worker reading the store earlier would
        // find the object of before the list (a deleted-and-recreated object's old version) or
        // none, and drop the key for good.
        let mut after_list: Vec<(ObjectKey, TenantKey, Priority, bool)> = Vec::new();
        // Whether the resource was found not served (404) since the last complete list: said
        // once, in words that name its CustomResourceDefinition.
        let mut not_served = false;
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) if not_found(&e) => {
                    if !not_served {
                        let crd = format!("{}.{}", K::plural(&()), K::group(&()));
                        tracing::error!(
                            kind = %K::kind(&()),
                            %crd,
                            "{} is not served (404): its CustomResourceDefinition {crd} is not \
                             installed, or was deleted; the watch retries until it is back \
                             (install it, e.g. from `crds`)",
                            K::kind(&()),
                        );
                        not_served = true;
                    }
                    tx.send_replace(false);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, kind = %K::kind(&()), "primary watch error");
                    if not_established(&e) {
                        tx.send_replace(false);
                    }
                    continue;
                }
            };
            // The store is complete to each event's version once it has handled it (lists
            // and bookmarks: the watch says so itself, see `resuming`).
            if let (Some(leave), Event::Apply(_) | Event::Delete(_)) = (&leave, &event) {
                leave.complete_to(event_rv(&event));
            }
            if matches!(event, Event::InitDone) {
                not_served = false;
            }
            // Objects of the first list after start are a replay, queued at resync priority
            // so that a user's change made meanwhile is served first (controller-runtime does
            // the same with its initial list).
            let listing = matches!(event, Event::InitApply(_));
            let replay = listing && first_list;
            if let (Some(caches), Some(record_of)) = (&shared.caches, &shared.record_of) {
                match &event {
                    Event::Apply(obj) | Event::InitApply(obj) => {
                        caches.set_record(&key_of(obj), Some(record_of(obj)));
                    }
                    Event::Delete(obj) => caches.set_record(&key_of(obj), None),
                    Event::Init => {}
                    Event::InitDone => caches.retain_records(&K::kind(&()), |k| listed.contains(k)),
                }
            }
            match event {
                Event::Apply(obj) | Event::InitApply(obj) => {
                    let key = key_of(&obj);
                    if listing {
                        listed.insert(key.clone());
                    }
                    let change = match &shared.change_of {
                        Some(change_of) => change_of(&obj),
                        None => fingerprint(obj.meta()),
                    };
                    let uid = obj.meta().uid.as_deref().map(uid_mark).unwrap_or_default();
                    let print = (change ^ uid, spec_mark(obj.meta()) ^ uid);
                    let before = seen.insert(key.clone(), print);
                    if before.map(|b| b.0) != Some(print.0) {
                        let tenant = shared.tenant(&obj);
                        shared.reasons.note(&key, super::Reason::ObjectChanged);
                        let (priority, bypass) = if replay {
                            (Priority::Resync, false)
                        } else {
                            // A changed spec (or a deletion in progress): a failing key
                            // retries now rather than after its backoff.
                            (Priority::Event, before.is_none_or(|b| b.1 != print.1))
                        };
                        if listing {
                            after_list.push((key, tenant, priority, bypass));
                        } else {
                            add(&shared.queue, &key, &tenant, priority, bypass);
                        }
                    }
                }
                Event::Delete(obj) => {
                    let key = key_of(&obj);
                    seen.remove(&key);
                    // Its pending resync or retry would only find it gone; dropping them lets
                    // the queue forget the key, and an idle tenant, now (the queue's *Forgetting*).
                    shared.queue.remove(&key);
                    shared.reasons.forget(&key);
                    shared.blocked.forget_owner(&key);
                }
                Event::Init => {
                    // Objects a list that broke off had decided to queue stay queued: `seen`
                    // already counts that list's versions (one reconcile more, never one less).
                    listed.clear();
                }
                Event::InitDone => {
                    // Objects missing from a relist were deleted while the watch was down.
                    seen.retain(|k, _| listed.contains(k));
                    for (key, tenant, priority, bypass) in after_list.drain(..) {
                        if listed.contains(&key) {
                            add(&shared.queue, &key, &tenant, priority, bypass);
                        }
                    }
                    listed = HashSet::new();
                    first_list = false;
                    tx.send_replace(true);
                }
            }
        }
    };
    WatchTask {
        run: Box::pin(run),
        synced,
    }
}

/// What a namespace's change of tenant does: queues every primary object in it, past its
/// backoff (its tenant, an input of its reconcile, changed: an object that failed for want of
/// one retries now), each under the tenant it now has.
///
/// It reads the primary cache once per change: namespaces change tenant when their label or
/// trust changes, not at the pace of their objects.
pub(crate) fn namespace_changed<K>(shared: Arc<Shared<K>>) -> impl Fn(&str) + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    move |namespace: &str| {
        for obj in shared.store.state() {
            if obj.meta().namespace.as_deref() == Some(namespace) {
                let key = key_of(&*obj);
                shared.reasons.note(&key, super::Reason::NamespaceChanged);
                add(
                    &shared.queue,
                    &key,
                    &shared.tenant(&obj),
                    Priority::Event,
                    true,
                );
            }
        }
    }
}

/// Queues `key`, past its backoff when `bypass`.
fn add(queue: &WorkQueue, key: &ObjectKey, tenant: &TenantKey, priority: Priority, bypass: bool) {
    if bypass {
        queue.add_bypassing_backoff(key, tenant, priority);
    } else {
        queue.add(key, tenant, priority);
    }
}

/// Drive a child watch: enqueue the owner of every child that changed in a way its reconcile
/// cares about ([`child_print_text`] under `options`, so a relist of unchanged children, status
/// churn and other controllers' metadata enqueue nothing), except for the events of the apply
/// engine's own writes (with [`ChildCaches`]: controller-runtime's "expectations"); and the
/// owners of children that vanished between two lists (a delete missed while the watch was
/// down: client-go's `DeletedFinalStateUnknown`). With [`ChildCaches`], the watch also keeps
/// a store of the children ([`CompactStore`]: compact JSON without what the engine never reads,
/// `status` kept only with [`OwnsOptions::reads_status`]) and publishes it once the first list
/// is complete.
pub(crate) fn child<K, C>(
    api: Api<C>,
    config: watcher::Config,
    options: OwnsOptions,
    shared: Arc<Shared<K>>,
) -> WatchTask
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    K::Scope: 'static,
    C: Resource<DynamicType = ()>,
{
    let (api, resource) = super::raw::raw_api(api);
    raw_child(api, resource, config, options, shared)
}

/// [`child`] of the kind `resource`, one body for every child kind.
fn raw_child<K>(
    api: Api<Raw>,
    resource: ApiResource,
    config: watcher::Config,
    options: OwnsOptions,
    shared: Arc<Shared<K>>,
) -> WatchTask
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    K::Scope: 'static,
{
    let (tx, synced) = watch::channel(false);
    let options = OwnsOptions {
        reads_status: options.reads_status
            || shared
                .reads_status
                .has_kind(&resource.api_version, &resource.kind),
    };
    let run = async move {
        // The store this kind's watch of the run before left on the same caches (a shard ring
        // change), when it was complete to a known version: kept, see `resume`.
        if let Some(caches) = &shared.caches {
            // Caches kept from a run before (a shard ring change, see `Start::caches`) serve
            // this kind from the API server until this watch's store is complete (registered
            // at `InitDone`), not from the last run's store.
            caches.unregister(&resource.api_version, &resource.kind);
        }
        let left = match (&shared.caches, &shared.resume) {
            (Some(caches), Some(_)) => caches.take_resume(&resource.api_version, &resource.kind),
            _ => None,
        };
        let left = left.and_then(|left| Some((left.version()?, left)));
        // The children, compact and stripped of what the engine never reads (see
        // `CompactStore`), published in the caches once first listed.
        let store = match &left {
            Some((_, left)) => Some(Arc::clone(&left.store)),
            None => shared.caches.as_ref().map(|caches| {
                let store = CompactStore::new(
                    &resource.api_version,
                    &resource.kind,
                    options.reads_status,
                    shared.record_of.as_ref().map(|_| caches.trust()),
                )
                .with_interner(caches.interner());
                Arc::new(match &shared.resume {
                    Some((label, _)) => store.with_bucket_label(label),
                    None => store,
                })
            }),
        };
        // What this watch leaves for the next run on these caches.
        let leave = match (&shared.caches, &shared.resume, &store) {
            (Some(caches), Some((_, now)), Some(store)) => {
                let leave = Arc::new(Resume::new(Arc::clone(store), now.clone()));
                caches.leave(Arc::clone(&leave));
                Some(leave)
            }
            _ => None,
        };
        // Decoded as metadata plus text: the content of an object that is not ours is never
        // decoded (see `Raw`).
        let (stream, mut carrying) = match (left, &shared.resume, &shared.caches) {
            (Some((rv, left)), Some((label, now)), Some(caches)) => {
                // The children of buckets another replica holds now are gone from this one's
                // view, with what the caches kept of them.
                let dropped =
                    (left.store).retain_labelled(label, |v| super::resume::in_share(now, v));
                for (namespace, name, uid) in dropped {
                    let key = ObjectKey {
                        kind: resource.kind.as_str().into(),
                        namespace: namespace.map(Into::into),
                        name: name.into(),
                    };
                    caches.forget(&key);
                    if let Some(uid) = uid {
                        caches.deleted(&key, &uid);
                    }
                }
                let gained = super::resume::gained(label, &left.buckets, now);
                tracing::info!(kind = %resource.kind, gained = gained.is_some(), rv,
                    "child watch going on from the store of the ring before");
                let from = super::resume::From {
                    kept: Vec::new(),
                    gained,
                    rv,
                };
                let stream = super::resume::resuming(api, config, Some(from), leave.clone());
                (stream.boxed(), true)
            }
            // A run that may go on in the next: a watch that knows its store's version.
            _ if leave.is_some() => {
                let stream = super::resume::resuming(api, config, None, leave.clone());
                (stream.boxed(), false)
            }
            _ => (relisting(api, config).boxed(), false),
        };
        let stream = watch_backoff(stream);
        let mut first_list = true;
        let mut registered = false;
        futures::pin_mut!(stream);
        // What the watch judged of each child (its `child_print_text` and the owners it mapped
        // to): kept with the child in the store when there is one, else here, with the
        // children of the list under way (to find those that vanished).
        let mut versions: HashMap<ObjectKey, Seen> = HashMap::new();
        let mut listed: HashSet<ObjectKey> = HashSet::new();
        // Owners to queue once a list is complete, when the child store holds the listed
        // children: a reconcile started earlier would judge them by the store of before the
        // list (see `primary`); `true`: a child of theirs vanished (a repair, see `queue`).
        let mut after_list: Vec<(ObjectKey, TenantKey, Priority, bool)> = Vec::new();
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!(error = %e, kind = %resource.kind, "child watch error");
                    if not_established(&e) {
                        tx.send_replace(false);
                    }
                    continue;
                }
            };
            // The store is complete to each event's version once it has handled it (lists
            // and bookmarks: the watch says so itself, see `resuming`).
            if let (Some(leave), Event::Apply(_) | Event::Delete(_)) = (&leave, &event) {
                leave.complete_to(event_rv(&event));
            }
            let (obj, deleted, initial) = match event {
                Event::Apply(obj) => (obj, false, false),
                Event::InitApply(obj) => (obj, false, true),
                Event::Delete(obj) => (obj, true, false),
                Event::Init => {
                    // A list of the whole share: the store is replaced, as on any relist.
                    carrying = false;
                    // Owners a list that broke off had decided to queue stay queued: without a
                    // store, the judgement of their children already counts that list's
                    // versions, so the next list would not decide it again (one reconcile
                    // more, never one less). With a store, the broken list is thrown away and
                    // the next one judges every child against the same live state again, so
                    // its decisions are dropped too: kept, each broken list would add them
                    // once more.
                    listed.clear();
                    if let Some(store) = &store {
                        store.init();
                        after_list.clear();
                    }
                    continue;
                }
                Event::InitDone => {
                    // Children missing from the list were deleted while the watch was down.
                    let mut vanished: Vec<(ObjectKey, Option<String>, Owners)> = Vec::new();
                    match &store {
                        Some(store) => {
                            vanished.extend(store.init_done().into_iter().map(|gone| {
                                let key = ObjectKey {
                                    kind: resource.kind.as_str().into(),
                                    namespace: gone.namespace.map(Into::into),
                                    name: gone.name.into(),
                                };
                                (key, gone.uid, gone.owners)
                            }));
                        }
                        None => versions.retain(|k, seen| {
                            let keep = listed.contains(k);
                            if !keep {
                                vanished.push((k.clone(), None, std::mem::take(&mut seen.owners)));
                            }
                            keep
                        }),
                    }
                    listed = HashSet::new();
                    for (child, uid, owners) in vanished {
                        tracing::debug!(%child, "child vanished while the watch was down");
                        if let Some(caches) = &shared.caches {
                            caches.forget(&child);
                            if let Some(uid) = uid {
                                caches.deleted(&child, &uid);
                            }
                        }
                        after_list.extend(owners.iter().map(|(owner, tenant)| {
                            (owner.clone(), tenant.clone(), Priority::Event, true)
                        }));
                    }
                    if let (Some(caches), Some(store), false) = (&shared.caches, &store, registered)
                    {
                        caches.register_compact(Arc::clone(store));
                        registered = true;
                    }
                    for (owner, tenant, priority, repair) in after_list.drain(..) {
                        shared.reasons.note(&owner, super::Reason::ChildChanged);
                        child_changed(&shared.queue, &owner, &tenant, priority, repair);
                    }
                    first_list = false;
                    carrying = false;
                    tx.send_replace(true);
                    continue;
                }
            };
            let replay = !deleted && first_list;
            // The children a resumed watch lists go into the store it kept, not a new one.
            let into_relist = initial && !carrying;
            let (key, mut owners) = {
                let mut strings = shared
                    .strings
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let owners: Vec<(ObjectKey, TenantKey)> =
                    owners_of::<K>(obj.meta(), shared.label_names, |o| shared.owner_uid(o))
                        .into_iter()
                        .map(|owner| {
                            let tenant = shared.owner_tenant(&owner, obj.meta());
                            (strings.key(&owner, true), strings.tenant(&tenant))
                        })
                        .collect();
                let key = match obj.meta().namespace.as_deref() {
                    Some(ns) => ObjectKey::namespaced(&resource.kind, ns, &obj.name_any()),
                    None => ObjectKey::cluster(&resource.kind, &obj.name_any()),
                };
                (strings.key(&key, false), strings.owners(&owners))
            };
            if owners.is_empty() {
                // A child that mapped to owners before and maps to none now (someone removed
                // its ownerReference and labels): its former owners look at it (an owner that
                // created it repairs it, see `Owner::recorded`).
                let before = match &store {
                    Some(store) => store
                        .seen(key.namespace.as_deref(), &key.name)
                        .map(|seen| seen.owners),
                    None => versions.get(&key).map(|seen| seen.owners.clone()),
                };
                if let Some(before) = before {
                    owners = before;
                }
            }
            let mut origin = Origin::Other;
            let changed = if deleted {
                match &store {
                    Some(store) => store.delete(key.namespace.as_deref(), &key.name),
                    None => {
                        versions.remove(&key);
                    }
                }
                // The engine's memory of its own write of this child is stale now.
                if let Some(caches) = &shared.caches {
                    caches.forget(&key);
                    if let Some(uid) = obj.uid() {
                        caches.deleted(&key, &uid);
                    }
                }
                true
            } else {
                if initial && store.is_none() {
                    listed.insert(key.clone());
                }
                let managers = shared
                    .caches
                    .as_ref()
                    .map(ChildCaches::managers)
                    .unwrap_or_default();
                // One of idem's children, kept whole, is decoded once and judged by its
                // metadata as decoded there. Of any other object (the store keeps a stub) only
                // the metadata is converted: its content, however large, is never copied.
                let parsed: Option<serde_json::Value> = (store.as_ref())
                    .filter(|store| store.keeps_whole_meta(obj.meta()))
                    .and_then(|_| serde_json::from_str(obj.text()).ok());
                let converted = (parsed.is_none())
                    .then(|| serde_json::to_value(obj.meta()).unwrap_or_default());
                let meta = (parsed.as_ref())
                    .and_then(|parsed| parsed.get("metadata"))
                    .or(converted.as_ref())
                    .unwrap_or(&serde_json::Value::Null);
                let print = match &store {
                    Some(store) if parsed.is_none() && !store.keeps_whole(meta) => {
                        child_print_meta(meta, &managers)
                    }
                    _ => child_print_text(obj.text(), meta, &managers, options),
                };
                let seen = Seen {
                    print,
                    owners: owners.clone(),
                };
                let before = match &store {
                    Some(store) => {
                        let before = match parsed {
                            Some(parsed) => store.put_parsed(parsed, into_relist, seen),
                            None => {
                                let meta = converted.unwrap_or_default();
                                let text = || serde_json::from_str(obj.text()).ok();
                                store.put(&meta, text, into_relist, seen)
                            }
                        };
                        if let (Some(caches), Some(rv), false) =
                            (&shared.caches, obj.resource_version(), into_relist)
                        {
                            caches.stored(&key, &rv);
                        }
                        before
                    }
                    None => versions.insert(key.clone(), seen),
                };
                if let (Some(caches), Some(rv)) = (&shared.caches, obj.resource_version()) {
                    origin = caches.observe(&key, &rv);
                }
                // A child whose owners changed (its controller ownerReference moved to another
                // object, say): its former owners look at it too, as when it loses them all
                // (one of them created it, and repairs it: `Owner::recorded`).
                let moved = before
                    .as_ref()
                    .is_some_and(|b| !b.owners.is_empty() && b.owners[..] != owners[..]);
                if let (true, Some(b)) = (moved, &before) {
                    let mut all: Vec<(ObjectKey, TenantKey)> = owners.to_vec();
                    all.extend(b.owners.iter().filter(|o| !owners.contains(o)).cloned());
                    owners = shared
                        .strings
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .owners(&all);
                }
                moved || before.map(|seen| seen.print) != Some(print)
            };
            if !changed || origin == Origin::Ours || owners.is_empty() {
                continue;
            }
            tracing::trace!(child = %key, ?origin, deleted, "child change reconciles its owners");
            let priority = if replay {
                Priority::Resync // the first list after start: a replay
            } else {
                Priority::Event
            };
            if initial {
                // Decided now, queued at `InitDone` (an own write still pending may make this
                // one reconcile more, never one less).
                after_list.extend(
                    owners
                        .iter()
                        .map(|(owner, tenant)| (owner.clone(), tenant.clone(), priority, false)),
                );
                continue;
            }
            match (origin, &shared.caches, obj.resource_version()) {
                (Origin::Pending, Some(caches), Some(rv)) => {
                    // A write of ours to this child is in flight: this may be its event,
                    // delivered before the writer got its answer. Decide once it has.
                    let (caches, queue) = (caches.clone(), shared.queue.clone());
                    let reasons = shared.reasons.clone();
                    tokio::spawn(async move {
                        if caches.settle(&key, &rv).await != Origin::Ours {
                            for (owner, tenant) in owners.iter() {
                                reasons.note(owner, super::Reason::ChildChanged);
                                queue.add(owner, tenant, priority);
                            }
                        }
                    });
                }
                _ => {
                    for (owner, tenant) in owners.iter() {
                        shared.reasons.note(owner, super::Reason::ChildChanged);
                        child_changed(&shared.queue, owner, tenant, priority, deleted);
                    }
                }
            }
        }
    };
    WatchTask {
        run: Box::pin(run),
        synced,
    }
}

/// Queues the owner of a changed child; a deleted child is a repair that ends the owner's
/// backoff wait, at most every 10 s (the queue's *Backoff holds*): a failing owner's missing
/// children (its quota, say) come back at once, not minutes later at its next retry.
fn child_changed(
    queue: &WorkQueue,
    owner: &ObjectKey,
    tenant: &TenantKey,
    priority: Priority,
    deleted: bool,
) {
    if deleted {
        queue.add_repairing(owner, tenant, priority);
    } else {
        queue.add(owner, tenant, priority);
    }
}

/// The resourceVersion of the object of `event`, as a number (Kubernetes' are etcd revisions).
fn event_rv<K: Resource>(event: &Event<K>) -> Option<u64> {
    match event {
        Event::Apply(obj) | Event::InitApply(obj) | Event::Delete(obj) => {
            obj.meta().resource_version.as_deref()?.parse().ok()
        }
        Event::Init | Event::InitDone => None,
    }
}

/// A hash of an object's uid, mixed into the change marks.
fn uid_mark(uid: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    uid.hash(&mut h);
    h.finish()
}

/// What makes a change of a primary object a change of its spec, which ends a backoff wait
/// (the queue's *Backoff holds*): `metadata.generation` (the resourceVersion for kinds without one) and
/// whether it is being deleted.
fn spec_mark(meta: &kube::api::ObjectMeta) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    match meta.generation {
        Some(g) => g.hash(&mut h),
        None => meta.resource_version.hash(&mut h),
    }
    meta.deletion_timestamp.is_some().hash(&mut h);
    h.finish()
}

/// Drive an external trigger stream: enqueue each key (at event priority) whose object is in
/// the primary cache, with its tenant. Synced from the start (it has nothing to list).
pub(crate) fn external<K>(
    keys: impl futures::Stream<Item = ObjectKey> + Send + 'static,
    shared: Arc<Shared<K>>,
) -> WatchTask
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    K::Scope: 'static,
{
    let (_, synced) = watch::channel(true);
    let run = async move {
        futures::pin_mut!(keys);
        while let Some(key) = keys.next().await {
            let mut r = ObjectRef::<K>::new(&key.name);
            if let Some(ns) = &key.namespace {
                r = r.within(ns);
            }
            if let Some(obj) = shared.store.get(&r) {
                let tenant = shared.tenant(&obj);
                shared.reasons.note(&key, super::Reason::ChildChanged);
                shared.queue.add(&key, &tenant, Priority::Event);
            }
        }
        // The stream ended: nothing more to trigger; stay pending like the other watches.
        futures::future::pending::<()>().await;
    };
    WatchTask {
        run: Box::pin(run),
        synced,
    }
}
