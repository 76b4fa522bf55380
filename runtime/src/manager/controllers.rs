//! What a [`Manager`](super::Manager) runs: sets of controllers behind one object-safe trait,
//! [`Controllers`] (the public hook: a set may share state, shard on any field and watch
//! anything), and [`Reconciles`], the set of one [`Reconciler`]'s kind.

use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ObjectMeta;
use kube::runtime::events::Reporter;
use kube::runtime::watcher;
use kube::{Client, CustomResourceExt, Resource};
use schemars::JsonSchema;
use tokio::sync::watch;

use crate::apply::{ChildCaches, ChildScope, DriftMetrics, Labels};
use crate::controller::{Controller, ControllerConfig, ControllerError};
use crate::metrics::Metrics;
use crate::queue::ShutdownReport;
use crate::reconciler::cleanup_guard::cleanup_guard;
use crate::reconciler::{Driver, DriverConfig, Reconciler, children_config, primary_config};
use crate::resource::{IdempotentResource, TenantRule};
use crate::schema::SchemaError;
use crate::shard::{Ranges, ShardField, shard_hash};

use super::rbac;

/// Whether the ring a run of controllers was started for is still the current one.
type CurrentFn = Arc<dyn Fn() -> bool + Send + Sync>;

/// This replica's share of a shard ring, for one run of the controllers.
#[derive(Clone)]
pub struct Shard {
    ranges: Ranges,
    current: CurrentFn,
    server_filtered: bool,
}

impl Shard {
    pub(crate) fn new(ranges: Ranges, current: CurrentFn) -> Self {
        Self {
            ranges,
            current,
            server_filtered: false,
        }
    }

    /// The API server filters the lists and watches of the sharded kinds to this share (its
    /// `ShardedListAndWatch` gate is on).
    pub(crate) fn server_filtered(mut self, on: bool) -> Self {
        self.server_filtered = on;
        self
    }

    /// Whether the API server sends this replica every object of a kind the manager shards
    /// ([`super::Controllers::sharded`]): its `ShardedListAndWatch` gate is off. A controller
    /// whose cache then keeps every object (no [`Controller::shard_cache`]) may go on from
    /// it after a ring change without a list ([`Controller::resume_primary`]).
    pub fn lists_whole(&self) -> bool {
        !self.server_filtered
    }

    /// The hash ranges this replica owns.
    pub fn ranges(&self) -> &Ranges {
        &self.ranges
    }

    /// Whether this replica reconciles the object of `meta`, sharded on `field`: its hash is
    /// in [`Shard::ranges`] and the ring is still the current one (no reconcile starts once
    /// it changed, even before the controllers are dropped; the fence already refuses their
    /// writes). Give it to [`Controller::shard`].
    pub fn owns(&self, meta: &ObjectMeta, field: ShardField) -> bool {
        (self.current)() && self.ranges.contains(shard_hash(meta, field))
    }

    /// `config` (a child watch's) narrowed to the children labelled with one of this replica's
    /// buckets (the shard-bucket label under the owner kind's `labels`,
    /// [`Labels::shard_bucket`]: the bucket of the owner's uid, which the apply engine puts on
    /// every child): for the children of a primary sharded by its uid.
    pub fn children_config(&self, labels: Labels, config: watcher::Config) -> watcher::Config {
        match self.ranges.label_selector(labels.shard_bucket()) {
            Some(buckets) => {
                let labels = match config.label_selector.as_deref() {
                    Some(l) if !l.is_empty() => format!("{l},{buckets}"),
                    _ => buckets,
                };
                config.labels(&labels)
            }
            None => config,
        }
    }
}

/// What one run of a set of controllers gets from the manager.
pub struct Start<'a> {
    /// The manager's client: retrying what is safe to retry, its writes fenced (leadership,
    /// shard membership), its lists and watches narrowed to this replica's shard.
    pub client: &'a Client,
    /// Workers, tenant concurrency, resync period and shutdown grace from the options; set
    /// `name` per controller.
    pub config: &'a ControllerConfig,
    /// The controllers' metrics (give them to [`Controller::with_metrics`]).
    pub metrics: &'a Metrics,
    /// The apply engine's drift metrics ([`Driver::with_drift_metrics`]).
    pub drift: &'a DriftMetrics,
    /// The Events reporter ([`Driver::with_reporter`]): the manager's name and this replica.
    pub reporter: &'a Reporter,
    /// This replica's share when sharded; `None`: every object.
    pub shard: Option<&'a Shard>,
    /// Turns `true` for a graceful stop.
    pub stop: watch::Receiver<bool>,
    /// The child caches for the set's drivers and controllers
    /// ([`Driver::with_caches`], which gives them to its controller): when sharded, the same
    /// from one ring to the next, so that child watches with
    /// [`Controller::resume`] go on from their stores; new for every other run.
    pub caches: ChildCaches,
}

impl Start<'_> {
    /// Resolves once a graceful stop is asked for (give it to [`Driver::run`]).
    pub fn stopping(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stop = self.stop.clone();
        async move {
            let _ = stop.wait_for(|s| *s).await;
        }
    }
}

/// A controller's name and how it stopped.
pub type Stopped = (String, Result<ShutdownReport, ControllerError>);

/// One run of a set of controllers: until a graceful stop, or until dropped (cancelled).
pub struct Running {
    pub(crate) stopped: BoxFuture<'static, Vec<Stopped>>,
    pub(crate) synced: watch::Receiver<bool>,
    pub(crate) tasks: Vec<tokio::task::JoinHandle<()>>,
    pub(crate) owned: Option<Arc<dyn Fn() -> usize + Send + Sync>>,
    pub(crate) caches: Vec<ChildCaches>,
}

impl Running {
    /// A run whose controllers end with `stopped`, `synced` true while every one's caches
    /// are synced and watches established (e.g. from
    /// [`Controller::with_synced_signal`] and [`crate::controller::all_ready`]).
    pub fn new(
        stopped: impl Future<Output = Vec<Stopped>> + Send + 'static,
        synced: watch::Receiver<bool>,
    ) -> Self {
        Self {
            stopped: Box::pin(stopped),
            synced,
            tasks: Vec::new(),
            owned: None,
            caches: Vec::new(),
        }
    }

    /// A task of this run (e.g. a watch its reconciles read), aborted with it.
    #[must_use]
    pub fn with_task(mut self, task: tokio::task::JoinHandle<()>) -> Self {
        self.tasks.push(task);
        self
    }

    /// How many primaries this replica's shard holds (metric `idem_shard_owned_tenants`).
    #[must_use]
    pub fn counting(mut self, owned: impl Fn() -> usize + Send + Sync + 'static) -> Self {
        self.owned = Some(Arc::new(owned));
        self
    }

    /// Child caches whose size is metric `idem_shard_child_cache_objects`.
    #[must_use]
    pub fn with_caches(mut self, caches: ChildCaches) -> Self {
        self.caches.push(caches);
        self
    }
}

/// A set of controllers a [`Manager`](super::Manager) runs; object safe, so kinds of any type
/// run side by side. [`Reconciles`] is the set of one reconciler's kind; implement it for
/// controllers that share state, shard on another field (e.g. by namespace) or watch more.
pub trait Controllers: Send + Sync + 'static {
    /// The CRDs of the kinds, structurally checked (`crds` prints them).
    ///
    /// # Errors
    /// [`SchemaError`] naming a field without a structural schema.
    fn crds(&self) -> Result<Vec<CustomResourceDefinition>, SchemaError>;

    /// The cluster-wide collections (e.g. `/apis/apps/v1/deployments`) whose lists and watches
    /// the API server may narrow to this replica's shard, and on which field.
    fn sharded(&self) -> Vec<(String, ShardField)>;

    /// Starts the controllers for one run (a ring, or the whole life of a single replica).
    fn start(&self, start: Start<'_>) -> Running;

    /// What the controllers do on the API server, as RBAC rules (beside the manager's own:
    /// Events, CRDs, Leases; see [`super::rbac`]): `rbac` prints them in its ServiceAccount's
    /// ClusterRole. [`super::rbac::rule`] writes one.
    fn rules(&self) -> Vec<PolicyRule>;

    /// The admission policies the kinds need beside RBAC, which `rbac` prints after its
    /// objects: for each kind with a finalizer, its [`cleanup_guard`] (no one removes the
    /// finalizer before the driver has marked the cleanup done). None by default.
    fn admission(&self) -> Vec<serde_json::Value> {
        Vec::new()
    }
}

type Configure<K> = Box<dyn Fn(Controller<K>) -> Controller<K> + Send + Sync>;

/// One [`Reconciler`]'s kind: a [`Driver`] and its [`Controller`] owning the child kinds the
/// reconciler declares ([`Reconciler::children`]), the primary sharded by the hash of its uid
/// and its children (labelled with the bucket of that uid by the apply engine) selected by
/// label; its cache keeps only the replica's share ([`Controller::shard_cache`]).
pub struct Reconciles<R: Reconciler> {
    reconciler: R,
    configure: Option<Configure<R::Resource>>,
    driver: DriverConfig,
    crds: fn() -> Result<CustomResourceDefinition, SchemaError>,
    rules: Vec<PolicyRule>,
}

impl<R> Reconciles<R>
where
    R: Reconciler + Clone,
    R::Resource: CustomResourceExt,
    <R::Resource as Resource>::Scope: ChildScope,
    <R::Resource as IdempotentResource>::Spec: JsonSchema,
    <R::Resource as IdempotentResource>::Status: JsonSchema,
{
    /// The controller of `reconciler`'s kind (each run gets a clone of `reconciler`).
    pub fn new(reconciler: R) -> Self {
        Self {
            reconciler,
            configure: None,
            driver: DriverConfig::default(),
            crds: crate::schema::crd::<R::Resource>,
            rules: Vec::new(),
        }
    }

    /// Adds `rules` to those [`Controllers::rules`] derives from the kind and its declared
    /// children: what the reconciler or [`Reconciles::configure`] does beyond them (a kind it
    /// reads, a watch it adds), so `rbac` prints it too ([`super::rbac::rule`] writes one).
    #[must_use]
    pub fn with_rules(mut self, rules: impl IntoIterator<Item = PolicyRule>) -> Self {
        self.rules.extend(rules);
        self
    }

    /// The [`Driver`]'s tunables: the failures in a row that stall an object, the bound on
    /// one pass (default [`DriverConfig::default`]).
    #[must_use]
    pub fn with_driver_config(mut self, config: DriverConfig) -> Self {
        self.driver = config;
        self
    }

    /// Changes the controller each run builds (e.g. a weight, more watches). `f` gets it with
    /// the manager's settings in place (its [`ControllerConfig`] from the
    /// [`ManagerOptions`](super::ManagerOptions)), so a `with_config` in `f` replaces them:
    /// start from [`Controller::config`] to change one field (e.g. `resync_max_wait` or
    /// `name`). The manager then adds what it owns: its metrics, its synced signal and, when
    /// sharded, the replica's shard (and a cache of only its share: a store `f` takes with
    /// [`Controller::store`] holds only that).
    #[must_use]
    pub fn configure(
        mut self,
        f: impl Fn(Controller<R::Resource>) -> Controller<R::Resource> + Send + Sync + 'static,
    ) -> Self {
        self.configure = Some(Box::new(f));
        self
    }
}

impl<R> Controllers for Reconciles<R>
where
    R: Reconciler + Clone,
    R::Resource: CustomResourceExt,
    <R::Resource as Resource>::Scope: ChildScope,
{
    fn crds(&self) -> Result<Vec<CustomResourceDefinition>, SchemaError> {
        Ok(vec![(self.crds)()?])
    }

    fn sharded(&self) -> Vec<(String, ShardField)> {
        vec![(R::Resource::url_path(&(), None), ShardField::Uid)]
    }

    /// The primary kind's rules, each declared child kind's, `namespaces` (read) when the
    /// tenant is a namespace's label, and those added with [`Reconciles::with_rules`].
    fn rules(&self) -> Vec<PolicyRule> {
        let mut rules = rbac::primary_rules(&R::Resource::group(&()), &R::Resource::plural(&()));
        rules.extend(R::children().iter().map(rbac::child_rule));
        if matches!(
            <R::Resource as IdempotentResource>::TENANT_RULE,
            TenantRule::NamespaceLabel(_)
        ) {
            rules.push(rbac::rule("", &["namespaces"], &["get", "list", "watch"]));
        }
        rules.extend(self.rules.iter().cloned());
        rules
    }

    /// The kind's [`cleanup_guard`] when the reconciler has a finalizer.
    fn admission(&self) -> Vec<serde_json::Value> {
        R::FINALIZER
            .and_then(|f| cleanup_guard::<R::Resource>(f, &serde_json::json!({})))
            .into_iter()
            .flatten()
            .collect()
    }

    fn start(&self, start: Start<'_>) -> Running {
        let client = start.client;
        let base = children_config::<R::Resource>();
        let children = match start.shard {
            Some(shard) => shard.children_config(Labels::of::<R::Resource>(), base),
            None => base,
        };
        let mut controller =
            Controller::for_reconciler_with::<R>(client, primary_config(), children)
                .with_config(start.config.clone());
        if let Some(configure) = &self.configure {
            controller = configure(controller);
        }
        let mut config = controller.config().clone();
        let name = (config.name.clone()).unwrap_or_else(|| R::Resource::kind(&()).to_lowercase());
        config.name = Some(name.clone());
        let (synced_tx, synced) = watch::channel(false);
        controller = controller
            .with_config(config)
            .with_metrics(start.metrics.clone())
            .with_synced_signal(synced_tx);
        let store = controller.store();
        let mut owned: Option<Arc<dyn Fn() -> usize + Send + Sync>> = None;
        if let Some(shard) = start.shard.cloned() {
            let (mine, share) = (shard.clone(), shard.ranges().clone());
            controller = controller
                .shard(move |k| mine.owns(k.meta(), ShardField::Uid))
                .shard_cache(move |k| share.contains(shard_hash(k.meta(), ShardField::Uid)))
                .resume(
                    Labels::of::<R::Resource>().shard_bucket(),
                    shard.ranges().clone(),
                );
            owned = Some(Arc::new(move || {
                (store.state().iter())
                    .filter(|k| {
                        shard
                            .ranges()
                            .contains(shard_hash(k.meta(), ShardField::Uid))
                    })
                    .count()
            }));
        }
        let driver = Driver::new(client.clone(), self.reconciler.clone())
            .with_config(self.driver.clone())
            .with_drift_metrics(start.drift.clone())
            .with_reporter(start.reporter.clone())
            .with_caches(start.caches.clone());
        let caches = driver.caches().clone();
        let stopping = start.stopping();
        let mut running = Running::new(
            async move { vec![(name, driver.run(controller, stopping).await)] },
            synced,
        )
        .with_caches(caches);
        running.owned = owned;
        running
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::Ring;

    #[test]
    fn a_shards_child_watches_select_its_buckets_beside_the_base_labels() {
        let base = || watcher::Config::default().labels("app.kubernetes.io/managed-by=x");
        let alone = Shard::new(Ring::new(["a"]).ranges_of("a"), Arc::new(|| true));
        assert_eq!(
            alone
                .children_config(Labels::operator(), base())
                .label_selector
                .as_deref(),
            Some("app.kubernetes.io/managed-by=x")
        );
        let ring = Ring::new(["a", "b", "c"]);
        let shard = Shard::new(ring.ranges_of("b"), Arc::new(|| true));
        let selector = shard
            .children_config(Labels::operator(), base())
            .label_selector
            .unwrap();
        let prefix = format!(
            "app.kubernetes.io/managed-by=x,{} in (",
            crate::apply::SHARD_BUCKET_LABEL
        );
        assert!(selector.starts_with(&prefix), "{selector}");
        // A user kind's children are selected by the bucket label under its own prefix.
        let theirs = Labels::with_prefix("teams.example.com");
        let selector = shard
            .children_config(theirs, base())
            .label_selector
            .unwrap();
        assert_eq!(
            selector
                .strip_prefix("app.kubernetes.io/managed-by=x,teams.example.com/shard-bucket in ("),
            shard
                .children_config(Labels::operator(), base())
                .label_selector
                .unwrap()
                .strip_prefix(&prefix),
            "{selector}"
        );
        assert!(!selector.contains("tenancy.idem.dev"), "{selector}");
        let meta = ObjectMeta {
            uid: Some("0f0c9a6e-0000-4000-8000-000000000001".into()),
            ..ObjectMeta::default()
        };
        let mine = ring.owner_of(shard_hash(&meta, ShardField::Uid)) == Some("b");
        assert_eq!(shard.owns(&meta, ShardField::Uid), mine);
        let stale = Shard::new(ring.ranges_of("b"), Arc::new(|| false));
        assert!(
            !stale.owns(&meta, ShardField::Uid),
            "no reconcile once the ring changed"
        );
    }
}
