//! The controller loop: watch a primary kind and its owned children with kube-runtime's
//! `watcher` + `reflector`, feed keys to the per-tenant fair queue, and run the reconcile
//! with the cache's latest object on a fixed pool of workers.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use idem_runtime::controller::{Action, Attempt, Controller};
//! # use k8s_openapi::api::core::v1::{ConfigMap, Secret};
//! # use kube::{Api, runtime::watcher};
//! # async fn reconcile(_: Arc<ConfigMap>, _: Arc<()>, _: Attempt) -> Result<Action, kube::Error> {
//! #     Ok(Action::await_change())
//! # }
//! # async fn run(client: kube::Client) -> Result<(), idem_runtime::controller::ControllerError> {
//! let report = Controller::new(Api::<ConfigMap>::all(client.clone()), watcher::Config::default())
//!     .owns(Api::<Secret>::all(client), watcher::Config::default())
//!     .weight_of(|_cm| 1)
//!     .run(reconcile, Arc::new(()), tokio::signal::ctrl_c().map(|_| ()))
//!     .await?;
//! # Ok(()) }
//! # use futures::FutureExt;
//! ```
//!
//! Differences from kube-runtime's `Controller`: keys are scheduled fairly per tenant (see
//! [`crate::queue`]), failures back off per key and reset on success ([`crate::backoff`]), the
//! reconcile receives an [`Attempt`] with the consecutive-failure count, status-only changes of
//! the primary do not enqueue it (see `mapping::fingerprint`), nor do a child's status
//! churn, other controllers' metadata or the apply engine's own writes enqueue its owner
//! ([`OwnsOptions`]; controller-runtime's "expectations"), every object is resynced
//! periodically at [`Priority::Resync`](crate::queue::Priority::Resync), and shutdown is
//! graceful with a report.

mod action;
pub mod blocked;
mod child_change;
mod derived;
mod idle;
mod kinds;
pub(crate) mod mapping;
mod namespaces;
mod raw;
mod reason;
mod relist;
mod resume;
mod watch;
mod worker;

use std::fmt::{Debug, Display};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::reflector;
use kube::runtime::watcher;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinSet;

pub use self::action::{Action, Attempt};
pub use self::blocked::BlockedWatches;
pub use self::child_change::OwnsOptions;
pub use self::derived::{UNRESOLVED_TENANT, change_fingerprint};
pub(crate) use self::kinds::{KindSet, same};
pub use self::namespaces::NamespaceTenants;
pub use self::reason::Reason;
use self::reason::Reasons;
pub(crate) use self::relist::relisting;
use self::watch::{ChangeFn, RecordFn, Shared, TenantFn, WatchTask, WeightFn};
use self::worker::Worker;
use crate::backoff::{Backoff, BackoffConfig, BackoffError};
use crate::key::TenantKey;
use crate::labels::Labels;
use crate::metrics::Metrics;
use crate::queue::{QueueConfig, QueueError, ShutdownReport, WorkQueue};

/// Keeps `out` equal to the conjunction of `inputs` (e.g. several controllers' synced signals,
/// [`Controller::with_synced_signal`]) until the task is dropped or every input's sender is
/// gone; an input whose sender is gone counts with its last value; `true` for no inputs.
pub async fn all_ready(
    mut inputs: Vec<tokio::sync::watch::Receiver<bool>>,
    out: tokio::sync::watch::Sender<bool>,
) {
    loop {
        // Every input marked seen (no short cut), so `changed` below waits for a new value.
        let values: Vec<bool> = inputs
            .iter_mut()
            .map(|rx| *rx.borrow_and_update())
            .collect();
        let all = values.iter().all(|v| *v);
        out.send_if_modified(|v| std::mem::replace(v, all) != all);
        let open: Vec<_> = inputs
            .iter_mut()
            .filter(|rx| rx.has_changed().is_ok())
            .map(|rx| Box::pin(rx.changed()))
            .collect();
        if open.is_empty() {
            return;
        }
        // A sender gone meanwhile ends its `changed` with an error: look again.
        let _ = futures::future::select_all(open).await;
    }
}

/// Errors that stop a controller from starting.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The queue limits derived from [`ControllerConfig`] are invalid.
    #[error("invalid queue configuration: {0}")]
    Queue(#[from] QueueError),
    /// The backoff configuration is invalid.
    #[error("invalid backoff configuration: {0}")]
    Backoff(#[from] BackoffError),
    /// `resync_jitter` was negative or not finite.
    #[error("resync jitter {0} must be a finite number ≥ 0")]
    ResyncJitter(f64),
    /// The reconciler declares a child kind the controller does not watch.
    #[error(
        "Reconciler::children declares {kind}, which the controller does not own: build the \
         controller with Controller::for_reconciler::<YourReconciler>(client), which owns \
         every declared kind"
    )]
    KindNotOwned {
        /// The kind.
        kind: String,
    },
}

/// Tunables of a [`Controller`].
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerConfig {
    /// Name in logs and in the metrics' `controller`/`name` labels. Default: the primary kind
    /// in lower case.
    pub name: Option<String>,
    /// Concurrent reconciles (workers, the queue's global cap). Default 4.
    pub workers: usize,
    /// Keys of one tenant reconciled at once, if capped. Default `None`: fair shares apply
    /// only under contention and a tenant alone may use every worker but the `idle_reserve`
    /// (see [`crate::queue`]).
    pub per_tenant_cap: Option<usize>,
    /// Workers kept for tenants with no reconcile running, so a tenant's lone change starts at
    /// once while others' backlogs hold every other worker
    /// ([`QueueConfig::idle_reserve`]; at most a quarter of `workers`, none below 4).
    /// Default 1; 0: a tenant alone may use every worker.
    pub idle_reserve: usize,
    /// Anti-entropy resync period of each object, counted from its last successful reconcile;
    /// zero disables resync. Default 10 h (controller-runtime's default `SyncPeriod`).
    pub resync_period: Duration,
    /// Each resync delay is `resync_period × (1 + u)`, `u` uniform in `[0, resync_jitter]`, so
    /// resyncs of objects created together spread out. Default 0.1 (as controller-runtime's
    /// informer resync jitter of up to +10%).
    pub resync_jitter: f64,
    /// Aging bound of resync work behind event work. Default 60 s.
    pub resync_max_wait: Duration,
    /// Per-key retry backoff after errors.
    pub backoff: BackoffConfig,
    /// How long shutdown waits for running reconciles. Default 30 s (controller-runtime's
    /// default graceful shutdown timeout).
    pub shutdown_grace: Duration,
    /// Once the queue has had nothing ready and nothing in flight for this long after work was
    /// finished, the controller asks the allocator to give its free pages back to the
    /// operating system (glibc's `malloc_trim`, counted by `idem_memory_releases_total`), so
    /// the resident memory follows the present work, not the busiest moment: once per burst,
    /// once the process's other releasing controllers are drained too (or after 30 s), at most
    /// once per 10 s in the process. `None`: this controller never asks and holds no other
    /// back (another may still ask while it works). Default 1 s. No effect where the C library
    /// is not glibc.
    pub release_memory_when_idle: Option<Duration>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            name: None,
            workers: 4,
            per_tenant_cap: None,
            idle_reserve: 1,
            resync_period: Duration::from_secs(10 * 3600),
            resync_jitter: 0.1,
            resync_max_wait: Duration::from_secs(60),
            backoff: BackoffConfig::default(),
            shutdown_grace: Duration::from_secs(30),
            release_memory_when_idle: Some(Duration::from_secs(1)),
        }
    }
}

/// Whether this replica reconciles an object ([`Controller::shard`]).
pub type OwnsFn<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;

/// Looks a tenant's weight up by its key.
type TenantWeightFn = Arc<dyn Fn(&TenantKey) -> Option<u32> + Send + Sync>;

type ChildFactory<K> = Box<dyn FnOnce(Arc<Shared<K>>) -> WatchTask + Send>;

/// A controller for primary kind `K`; build it, then [`Controller::run`] it.
pub struct Controller<K: Resource<DynamicType = ()> + Clone + 'static> {
    api: Api<K>,
    watcher_config: watcher::Config,
    children: Vec<ChildFactory<K>>,
    tenant_of: TenantFn<K>,
    weight_of: Option<WeightFn<K>>,
    change_of: Option<ChangeFn<K>>,
    tenant_weight: Option<TenantWeightFn>,
    config: ControllerConfig,
    metrics: Option<Metrics>,
    synced: Option<tokio::sync::watch::Sender<bool>>,
    /// Signals the workers also wait for ([`Controller::workers_after`]).
    workers_after: Vec<tokio::sync::watch::Receiver<bool>>,
    /// Told whether the primary watch alone is synced ([`Controller::with_primary_synced_signal`]).
    primary_synced: Option<tokio::sync::watch::Sender<bool>>,
    store: reflector::Store<K>,
    writer: reflector::store::Writer<K>,
    caches: Option<crate::cache::ChildCaches>,
    record_of: Option<RecordFn<K>>,
    shard: Option<OwnsFn<K>>,
    keep: Option<OwnsFn<K>>,
    /// The shard-bucket label the child watches select by, and this run's buckets.
    resume: Option<(&'static str, crate::shard::Ranges)>,
    /// Whether the primary watch goes on from the last run's store too.
    resume_primary: bool,
    blocked: BlockedWatches,
    blocked_triggers: blocked::Triggers,
    /// The namespace tenants a `namespace_label` rule reads, and how to watch them.
    namespaces: Option<(NamespaceTenants, watcher::Config)>,
    /// The child kinds owned (watched), by `(apiVersion, kind)`.
    owned: Vec<(String, String)>,
    /// The child kinds whose status the reconcile reads (their watches keep it).
    reads_status: KindSet,
    /// The names of the labels idem stamps on the children of `K` (see
    /// [`Controller::label_names`]).
    label_names: Labels,
}

impl<K> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::Scope: 'static,
{
    /// Watch objects of `api` selected by `watcher_config`. The tenant of an object defaults to
    /// `mapping::default_tenant`; every tenant has weight 1 until [`Controller::weight_of`].
    /// The children's labels are read under idem's operator's names ([`Labels::operator`])
    /// until [`Controller::label_names`]; [`Controller::for_derived`] takes the kind's own.
    pub fn new(api: Api<K>, watcher_config: watcher::Config) -> Self {
        let (store, writer) = reflector::store::<K>();
        let (blocked, blocked_triggers) = BlockedWatches::new();
        Self {
            api,
            watcher_config,
            children: Vec::new(),
            tenant_of: Arc::new(|obj: &K| mapping::default_tenant(obj.meta(), Labels::operator())),
            weight_of: None,
            change_of: None,
            tenant_weight: None,
            config: ControllerConfig::default(),
            metrics: None,
            synced: None,
            workers_after: Vec::new(),
            primary_synced: None,
            store,
            writer,
            caches: None,
            record_of: None,
            shard: None,
            keep: None,
            resume: None,
            resume_primary: false,
            blocked,
            blocked_triggers,
            namespaces: None,
            owned: Vec::new(),
            reads_status: KindSet::default(),
            label_names: Labels::operator(),
        }
    }

    /// The names of the labels idem stamps on the children of `K` (those of the [`Owner`]s
    /// made of its objects, [`Owner::label_names`]): the child-to-owner mapping reads the
    /// owner-uid and tenant labels under them. [`Controller::for_derived`] sets
    /// [`Labels::of`] `K`.
    ///
    /// [`Owner`]: crate::apply::Owner
    /// [`Owner::label_names`]: crate::apply::Owner::label_names
    #[must_use]
    pub fn label_names(mut self, labels: Labels) -> Self {
        self.label_names = labels;
        self
    }

    /// A read handle on the tenants of namespaces this controller will watch once it runs,
    /// for a kind whose derive says `tenant = namespace_label("...")` (see
    /// [`Controller::for_derived`]); `None` for other kinds.
    pub fn namespace_tenants(&self) -> Option<NamespaceTenants> {
        self.namespaces.as_ref().map(|(n, _)| n.clone())
    }

    /// The watches of objects that block its owners' children ([`blocked`]): while the
    /// controller runs, [`BlockedWatches::set`] watches an object found in a child's way and
    /// reconciles its owner again once the object is deleted or replaced. They end when the
    /// controller stops. A [`Driver`](crate::reconciler::Driver) that runs the controller
    /// uses them for every reconcile.
    pub fn blocked_watches(&self) -> BlockedWatches {
        self.blocked.clone()
    }

    /// A read handle on the cache of primary objects this controller will fill once it runs
    /// (empty until then), e.g. for another controller to read these objects without API
    /// calls.
    pub fn store(&self) -> reflector::Store<K> {
        self.store.clone()
    }

    /// Also watch children of kind `C` and reconcile their owner when they change; see
    /// `mapping::owners_of` for how a child maps to its owner. Same as
    /// [`Controller::owns_with`] with the default [`OwnsOptions`]: status-only changes, other
    /// controllers' metadata and (with [`Controller::with_child_caches`]) the apply engine's own
    /// writes do not reconcile the owner.
    #[must_use]
    pub fn owns<C>(self, api: Api<C>, watcher_config: watcher::Config) -> Self
    where
        C: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + serde::Serialize
            + Debug
            + Send
            + Sync
            + 'static,
    {
        self.owns_with(api, watcher_config, OwnsOptions::default())
    }

    /// Also watch children of kind `C`, reconciling their owner on the changes `options`
    /// select (e.g. [`OwnsOptions::reading_status`] for a kind whose status the reconcile
    /// reads).
    #[must_use]
    pub fn owns_with<C>(
        mut self,
        api: Api<C>,
        watcher_config: watcher::Config,
        options: OwnsOptions,
    ) -> Self
    where
        C: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + serde::Serialize
            + Debug
            + Send
            + Sync
            + 'static,
    {
        self.owned
            .push((C::api_version(&()).into_owned(), C::kind(&()).into_owned()));
        self.children.push(Box::new(move |shared| {
            watch::child::<K, C>(api, watcher_config, options, shared)
        }));
        self
    }

    /// Checks that the controller owns every kind of `kinds` (a reconciler's declaration),
    /// and keeps `status` in the watches of the kinds `reads_status`, a change of it
    /// reconciling the owner ([`OwnsOptions::reading_status`]); what
    /// [`Driver::run`](crate::reconciler::Driver::run) does with
    /// [`Reconciler::children`](crate::reconciler::Reconciler::children).
    ///
    /// # Errors
    /// [`ControllerError::KindNotOwned`] for a kind the controller does not own.
    pub(crate) fn declared(
        mut self,
        kinds: &KindSet,
        reads_status: KindSet,
    ) -> Result<Self, ControllerError> {
        if let Some(missing) = kinds.iter().find(|r| {
            !self
                .owned
                .iter()
                .any(|(v, k)| *v == r.api_version && *k == r.kind)
        }) {
            return Err(ControllerError::KindNotOwned {
                kind: missing.kind.clone(),
            });
        }
        self.reads_status = reads_status;
        Ok(self)
    }

    /// Also reconcile the primary objects whose keys `keys` yields (kube-runtime's
    /// `reconcile_on`): for triggers no owned-child watch sees (a foreign object that blocks a
    /// child's name is already watched by [`Controller::blocked_watches`]). A key of an object
    /// not in the cache is skipped.
    #[must_use]
    pub fn reconcile_on(
        mut self,
        keys: impl futures::Stream<Item = crate::key::ObjectKey> + Send + 'static,
    ) -> Self {
        self.children
            .push(Box::new(move |shared| watch::external::<K>(keys, shared)));
        self
    }

    /// How to find an object's tenant (the unit of fairness).
    #[must_use]
    pub fn tenant_of(mut self, f: impl Fn(&K) -> TenantKey + Send + Sync + 'static) -> Self {
        self.tenant_of = Arc::new(f);
        self
    }

    /// How to find the weight of an object's tenant (its fair share, ≥ 1; a 0 is logged and
    /// ignored). Read on every change of a primary object.
    #[must_use]
    pub fn weight_of(mut self, f: impl Fn(&K) -> u32 + Send + Sync + 'static) -> Self {
        self.weight_of = Some(Arc::new(f));
        self
    }

    /// Look a tenant's weight up at every dispatch of one of its keys (e.g. in another
    /// controller's cache), so a weight change applies without a change of this controller's
    /// objects or a restart; `None` falls back to [`Controller::weight_of`] or 1. It runs
    /// under the queue's lock: keep it to a cache read. See
    /// [`WorkQueue::set_weight_lookup`](crate::queue::WorkQueue::set_weight_lookup).
    #[must_use]
    pub fn tenant_weight(
        mut self,
        f: impl Fn(&TenantKey) -> Option<u32> + Send + Sync + 'static,
    ) -> Self {
        self.tenant_weight = Some(Arc::new(f));
        self
    }

    /// Reconcile only the primary objects for which `owns` is true (this replica's shard, see
    /// [`crate::shard`]); the others stay in the cache, and their keys (queued by their own or
    /// their children's events) are dropped by the worker without a reconcile or a resync.
    /// Children map to their owner as usual, so a child follows its owner's shard.
    #[must_use]
    pub fn shard(mut self, owns: impl Fn(&K) -> bool + Send + Sync + 'static) -> Self {
        self.shard = Some(Arc::new(owns));
        self
    }

    /// Keep in the primary cache only the objects for which `keep` is true: with
    /// [`Controller::shard`], this replica's share (a hash range, not whether the ring is
    /// current), when nothing else reads this controller's [`Controller::store`]. Where the API
    /// server does not filter lists by shard, each replica otherwise holds every object of the
    /// kind. An object outside it is as if it did not exist: never reconciled, its children's
    /// events dropped.
    #[must_use]
    pub fn shard_cache(mut self, keep: impl Fn(&K) -> bool + Send + Sync + 'static) -> Self {
        self.keep = Some(Arc::new(keep));
        self
    }

    /// This run holds the shard `buckets`, and its child watches select the children whose
    /// label `bucket_label` holds one of them (e.g. [`crate::manager::Shard::children_config`]
    /// with [`Labels::shard_bucket`], the bucket of the owner's uid the apply engine puts on
    /// every child; or a label of the user's own, for a kind sharded on another field).
    /// When the [`Controller::with_child_caches`] given were this controller's in the run
    /// before (a shard ring change: the manager keeps them from one ring to the next,
    /// [`crate::manager::Start::caches`]), each child watch keeps its store's children of the
    /// buckets still held, lists only those of the buckets gained, at the version its store is
    /// complete to, and watches on from that version (and the primary watch too, with
    /// [`Controller::resume_primary`]). When the API server no longer has that version (its
    /// history is minutes long) a watch lists its whole share, as the first run did.
    #[must_use]
    pub fn resume(mut self, bucket_label: &'static str, buckets: crate::shard::Ranges) -> Self {
        self.resume = Some((bucket_label, buckets));
        self
    }

    /// With [`Controller::resume`], the primary watch goes on from the store the run before
    /// left, without a list, when that store holds every object of the kind: for a cache
    /// without [`Controller::shard_cache`] of a kind the API server lists whole
    /// ([`crate::manager::Shard::lists_whole`]; e.g. the Tenants every replica of the operator
    /// keeps). Ignored with `shard_cache`.
    #[must_use]
    pub fn resume_primary(mut self) -> Self {
        self.resume_primary = true;
        self
    }

    /// Its tunables, as set so far.
    pub fn config(&self) -> &ControllerConfig {
        &self.config
    }

    /// Replace the tunables.
    #[must_use]
    pub fn with_config(mut self, config: ControllerConfig) -> Self {
        self.config = config;
        self
    }

    /// Report queue and reconcile metrics to `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Keeps a reflector store of every owned child kind and publishes it in `caches` once its
    /// first list is complete, so an [`Applier`](crate::apply::Applier) built
    /// [`with_caches`](crate::apply::Applier::with_caches) on the same `caches` reads and
    /// prunes children without requests. Memory: one copy of every watched child (as selected
    /// by its watcher config), kept as compact JSON without its `status` (unless the kind is
    /// owned with [`OwnsOptions::reading_status`] or named by the
    /// [`Reconciler::children`](crate::reconciler::Reconciler::children) of the
    /// driver that runs the controller), the `kubectl.kubernetes.io/last-applied-
    /// configuration` annotation and the `managedFields` timestamps, which the apply engine
    /// never reads.
    #[must_use]
    pub fn with_child_caches(mut self, caches: crate::cache::ChildCaches) -> Self {
        if self.record_of.is_some() {
            caches.will_trust();
        }
        self.caches = Some(caches);
        self
    }

    /// Tells the child caches ([`Controller::with_child_caches`]) which children are the
    /// owners' own: `record_of` gives the uids of the children a primary object recorded as
    /// created (its status' record, see [`crate::apply::record`]; the
    /// [`Driver`](crate::reconciler::Driver) passes [`Reconciler::child_record`]'s). The child
    /// stores then keep whole only the children in a record or written by the apply engine in
    /// this process; any other object the child watches deliver (whatever its labels and
    /// ownerReferences say: a tenant owner can write both) costs a stub of a few hundred bytes
    /// (see [`ChildCaches`](crate::apply::ChildCaches)). The child watches start once the
    /// primary objects are listed, so that the records are known before the children arrive.
    /// Without it every watched child is kept whole.
    ///
    /// [`Reconciler::child_record`]: crate::reconciler::Reconciler::child_record
    #[must_use]
    pub fn with_child_records(
        mut self,
        record_of: impl Fn(&K) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        self.record_of = Some(Arc::new(record_of));
        if let Some(caches) = &self.caches {
            caches.will_trust();
        }
        self
    }

    /// Keeps `synced` `true` while every watch (primary and children) has listed and is
    /// established: `true` once the caches first synced (the workers start then), `false`
    /// again while a watch is not established — its list failed, or its resource is no longer
    /// served or allowed (a deleted CustomResourceDefinition, revoked RBAC) — until it has
    /// listed again. A `/readyz` endpoint can serve it (controller-runtime: ready once the
    /// caches have synced; a cache that cannot list is not synced).
    #[must_use]
    pub fn with_synced_signal(mut self, synced: tokio::sync::watch::Sender<bool>) -> Self {
        self.synced = Some(synced);
        self
    }

    /// Keeps `synced` equal to whether the primary watch alone has listed and is established
    /// (as [`Controller::with_synced_signal`], without the child watches): for another
    /// controller whose reconciles read this one's primary cache ([`Controller::store`]).
    #[must_use]
    pub fn with_primary_synced_signal(mut self, synced: tokio::sync::watch::Sender<bool>) -> Self {
        self.primary_synced = Some(synced);
        self
    }

    /// Start the workers only once `ready` is also `true` (e.g. another controller's
    /// [`Controller::with_primary_synced_signal`], when the reconciles or the tenant lookup
    /// read that controller's cache), not only once this controller's own caches are synced;
    /// never, should its sender go away before. Its readiness is unchanged.
    #[must_use]
    pub fn workers_after(mut self, ready: tokio::sync::watch::Receiver<bool>) -> Self {
        self.workers_after.push(ready);
        self
    }

    /// Run until `shutdown` resolves: start the watches, wait for every cache to sync, then
    /// reconcile with [`ControllerConfig::workers`] workers. On shutdown, stop the watches and
    /// the queue, wait up to [`ControllerConfig::shutdown_grace`] for running reconciles and
    /// return what was dropped.
    ///
    /// A reconcile error (or panic) is logged and retried after the key's backoff; a key whose
    /// object is gone from the cache is skipped without calling `reconcile`.
    ///
    /// # Errors
    /// [`ControllerError`] if the configuration is invalid (checked before anything starts).
    pub async fn run<Ctx, F, Fut, E>(
        mut self,
        reconcile: F,
        ctx: Arc<Ctx>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<ShutdownReport, ControllerError>
    where
        Ctx: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<Ctx>, Attempt) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Display + Debug + Send + 'static,
    {
        let c = &self.config;
        if !c.resync_jitter.is_finite() || c.resync_jitter < 0.0 {
            return Err(ControllerError::ResyncJitter(c.resync_jitter));
        }
        let backoff = Backoff::new(c.backoff.clone())?;
        let name = c
            .name
            .clone()
            .unwrap_or_else(|| K::kind(&()).to_lowercase());
        let queue_config = QueueConfig {
            max_in_flight: c.workers,
            per_tenant_cap: c.per_tenant_cap,
            resync_max_wait: c.resync_max_wait,
            idle_reserve: c.idle_reserve,
        };
        let queue = match &self.metrics {
            Some(m) => WorkQueue::with_metrics(queue_config, m.queue(&name))?,
            None => WorkQueue::new(queue_config)?,
        };
        if let Some(lookup) = self.tenant_weight {
            queue.set_weight_lookup(move |t: &TenantKey| lookup(t));
        }
        let (store, writer) = (self.store, self.writer);
        let reasons = Reasons::default();
        let shared = Arc::new(Shared {
            reasons: reasons.clone(),
            queue: queue.clone(),
            store: store.clone(),
            tenant_of: self.tenant_of,
            label_names: self.label_names,
            weight_of: self.weight_of,
            change_of: self.change_of,
            caches: self.caches.clone(),
            blocked: self.blocked.clone(),
            record_of: self.record_of.clone(),
            reads_status: self.reads_status.clone(),
            strings: std::sync::Mutex::default(),
            keep: self.keep.clone(),
            resume: self.resume.clone(),
            resume_primary: self.resume_primary,
        });
        // The watches of blocking objects are this run's: they end with it (also when this
        // future is dropped, e.g. at a shard ring change).
        let gauge = match &self.metrics {
            Some(m) => m.blocked_watches(&name),
            None => prometheus_client::metrics::gauge::Gauge::default(),
        };
        let blocked_watches = self.blocked.start(self.api.clone().into_client(), gauge);
        let triggers = futures::stream::unfold(self.blocked_triggers, |mut rx| async move {
            rx.recv().await.map(|key| (key, rx))
        });
        let client = self.api.clone().into_client();
        let primary = watch::primary(self.api, self.watcher_config, writer, Arc::clone(&shared));
        // With records, the children are watched once the owners (and their records) are
        // listed: a child that arrives before its owner's record would be kept as a stub.
        let after_primary =
            (self.record_of.is_some() && self.caches.is_some()).then(|| primary.synced.clone());
        let primary_listed = primary.synced.clone();
        let mut tasks = vec![primary];
        if let Some((namespaces, config)) = self.namespaces.take() {
            let changed = watch::namespace_changed(Arc::clone(&shared));
            tasks.push(namespaces.watch(client, config, changed));
        }
        tasks.extend(self.children.into_iter().map(|f| {
            let task = f(Arc::clone(&shared));
            match after_primary.clone() {
                Some(mut listed) => WatchTask {
                    run: Box::pin(async move {
                        let _ = listed.wait_for(|s| *s).await;
                        task.run.await;
                    }),
                    synced: task.synced,
                },
                None => task,
            }
        }));
        tasks.push(watch::external::<K>(triggers, Arc::clone(&shared)));
        let mut watches = JoinSet::new();
        let mut synced = Vec::new();
        for task in tasks {
            synced.push(task.synced);
            watches.spawn(task.run);
        }
        if let Some(out) = self.synced.take() {
            watches.spawn(all_ready(synced.clone(), out));
        }
        tokio::pin!(shutdown);
        if let Some(out) = self.primary_synced.take() {
            let mut rx = primary_listed;
            watches.spawn(async move {
                loop {
                    out.send_replace(*rx.borrow_and_update());
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            });
        }
        let after = self.workers_after;
        let all_synced = async {
            for mut rx in synced {
                // An Err means the watch task ended; it cannot, short of a panic.
                let _ = rx.wait_for(|s| *s).await;
            }
            for mut rx in after {
                if rx.wait_for(|s| *s).await.is_err() {
                    // What it waited for stopped before it was ready: never start.
                    tracing::error!(controller = %name, "a signal the workers wait for \
                        (workers_after) ended before it was true: the workers do not start");
                    std::future::pending::<()>().await;
                }
            }
        };
        let mut workers = JoinSet::new();
        tokio::select! {
            () = &mut shutdown => {}
            () = all_synced => {
                tracing::info!(controller = %name, "caches synced; starting workers");
                let worker = Arc::new(Worker {
                    queue: queue.clone(),
                    store,
                    backoff: Arc::new(Mutex::new(backoff)),
                    ctx,
                    metrics: self.metrics.as_ref().map(|m| {
                        let m = m.controller(&name);
                        m.max_concurrent.set(c.workers as i64);
                        m
                    }),
                    resync_period: c.resync_period,
                    resync_jitter: c.resync_jitter,
                    owns: self.shard.clone(),
                    tenant_of: Arc::clone(&shared.tenant_of),
                    reasons,
                    idle: (idle::SUPPORTED && c.release_memory_when_idle.is_some())
                        .then(Arc::default),
                });
                #[cfg(all(target_os = "linux", target_env = "gnu"))]
                if let (Some(quiet), Some(notes)) = (c.release_memory_when_idle, &worker.idle) {
                    let (notes, queue) = (Arc::clone(notes), queue.clone());
                    let releases = worker
                        .metrics
                        .as_ref()
                        .map(|m| m.memory_releases.clone())
                        .unwrap_or_default();
                    let process = &*idle::PROCESS;
                    watches.spawn(async move {
                        // Counted among the process's releasing controllers while it runs.
                        let _registered = process.register(queue.clone());
                        let release = idle::release_free_memory;
                        notes.run(process, &queue, quiet, releases, release).await;
                    });
                }
                let reconcile = Arc::new(reconcile);
                for _ in 0..c.workers {
                    workers.spawn(Arc::clone(&worker).run(Arc::clone(&reconcile)));
                }
                shutdown.await;
            }
        }
        tracing::info!(controller = %name, "shutting down");
        watches.abort_all();
        drop(blocked_watches);
        let report = queue.shutdown(c.shutdown_grace).await;
        // Workers exit once their current key is done; abandoned ones are cancelled.
        workers.abort_all();
        while workers.join_next().await.is_some() {}
        while watches.join_next().await.is_some() {}
        if !report.drained() {
            tracing::warn!(controller = %name, abandoned = ?report.abandoned, "reconciles cut off");
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;

    use super::all_ready;

    /// Waits until `rx` holds `want`.
    async fn until(rx: &mut watch::Receiver<bool>, want: bool) {
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            rx.wait_for(|v| *v == want),
        )
        .await
        .expect("in time")
        .expect("open");
    }

    #[tokio::test]
    async fn readiness_follows_every_input_both_ways_and_a_closed_input_keeps_its_value() {
        let (a_tx, a) = watch::channel(false);
        let (_, done) = watch::channel(true); // sender gone at once, as a task with nothing to list
        let (out_tx, mut out) = watch::channel(false);
        let task = tokio::spawn(all_ready(vec![a, done], out_tx));
        a_tx.send_replace(true);
        until(&mut out, true).await;
        a_tx.send_replace(false); // a watch no longer established
        until(&mut out, false).await;
        a_tx.send_replace(true);
        until(&mut out, true).await;
        drop(a_tx);
        task.await.expect("ends once every input is gone");
    }
}
