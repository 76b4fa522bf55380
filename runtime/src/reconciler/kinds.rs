//! The child kinds a reconciler declares once ([`Reconciler::children`]): the controller's
//! watches, the child caches, the status a readiness reads and the kinds a pass may apply all
//! follow from it.
//!
//! [`Reconciler::children`]: super::Reconciler::children

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use kube::core::ApiResource;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use super::Reconciler;
use crate::apply::{ChildCaches, ChildScope, MANAGED_BY_LABEL};
use crate::backoff::watch_backoff;
use crate::controller::relisting;
use crate::controller::{Controller, KindSet, same};
use crate::resource::IdempotentResource;

/// The condition reason of a pass that desires a child of a kind its reconciler does not
/// declare in [`Reconciler::children`](super::Reconciler::children).
pub const KIND_NOT_DECLARED: &str = "ChildKindNotDeclared";

/// The watch configuration of the children of kind `K`'s objects: only objects labelled
/// `app.kubernetes.io/managed-by=<FIELD_MANAGER>`, which the apply engine puts on every child,
/// so a controller does not cache every Namespace or RoleBinding of the cluster; listed by a
/// streaming list ([`primary_config`]).
pub fn children_config<K: IdempotentResource>() -> watcher::Config {
    primary_config().labels(&format!("{MANAGED_BY_LABEL}={}", K::FIELD_MANAGER))
}

/// The watch configuration of a controller's objects: every object of the kind, its lists
/// streamed (`sendInitialEvents`: a watch that starts with the objects, served from the API
/// server's watch cache and decoded one object at a time, as client-go's informers list on
/// Kubernetes 1.34 and later), by pages where the API server refuses that.
pub fn primary_config() -> watcher::Config {
    watcher::Config::default().streaming_lists()
}

/// Registers the watch of one child kind on a controller of `K`.
type OwnFn<K> = Arc<dyn Fn(Controller<K>, &Client, watcher::Config) -> Controller<K> + Send + Sync>;

/// Starts a reflector of one child kind into caches; resolves once it is listed.
type CacheFn = Arc<
    dyn Fn(
            Client,
            watcher::Config,
            ChildCaches,
        ) -> BoxFuture<'static, Result<JoinHandle<()>, WatchChildrenError>>
        + Send
        + Sync,
>;

/// One declared kind.
struct Declared<K: IdempotentResource> {
    resource: ApiResource,
    namespaced: bool,
    reads_status: bool,
    own: OwnFn<K>,
    cache: CacheFn,
}

impl<K: IdempotentResource> Clone for Declared<K> {
    fn clone(&self) -> Self {
        Self {
            resource: self.resource.clone(),
            namespaced: self.namespaced,
            reads_status: self.reads_status,
            own: Arc::clone(&self.own),
            cache: Arc::clone(&self.cache),
        }
    }
}

/// The child kinds of a reconciler of `K`, each declared once, e.g.
/// `ChildKinds::new().owns::<Namespace>().owns_reading_status::<Deployment>()`: the
/// controller [`Controller::for_reconciler`] builds watches them (by the managed-by label),
/// the child caches serve them, a readiness reads the status of those declared
/// [`ChildKinds::owns_reading_status`], and a pass that desires a child of another kind fails
/// with a terminal [`KIND_NOT_DECLARED`] error.
///
/// ```
/// # use idem_runtime::IdempotentResource;
/// # use idem_runtime::reconciler::ChildKinds;
/// # use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
/// # use k8s_openapi::api::core::v1::Service;
/// # use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
/// # use kube::CustomResource;
/// # use schemars::JsonSchema;
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
/// # pub struct S { pub observed_generation: Option<i64>, pub conditions: Vec<Condition> }
/// # #[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "Db", namespaced, status = "S")]
/// # #[idempotent(tenant = namespace, prune = owner_references)]
/// # pub struct DbSpec { pub size: u32 }
/// let kinds: ChildKinds<Db> = ChildKinds::new()
///     .owns::<Service>()
///     .owns::<StatefulSet>()
///     .owns_reading_status::<StatefulSet>(); // one kind, its status read
/// assert_eq!(kinds.iter().count(), 2);
/// assert!(kinds.contains::<StatefulSet>() && !kinds.contains::<Deployment>());
/// assert_eq!(format!("{kinds:?}"), r#"["v1/Service", "apps/v1/StatefulSet (status)"]"#);
/// ```
pub struct ChildKinds<K: IdempotentResource> {
    kinds: Vec<Declared<K>>,
}

impl<K: IdempotentResource> Clone for ChildKinds<K> {
    fn clone(&self) -> Self {
        Self {
            kinds: self.kinds.clone(),
        }
    }
}

impl<K: IdempotentResource> Default for ChildKinds<K> {
    fn default() -> Self {
        Self { kinds: Vec::new() }
    }
}

impl<K: IdempotentResource> Debug for ChildKinds<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.kinds.iter().map(|d| {
                let status = if d.reads_status { " (status)" } else { "" };
                format!("{}/{}{status}", d.resource.api_version, d.resource.kind)
            }))
            .finish()
    }
}

impl<K: IdempotentResource> ChildKinds<K> {
    /// No kind: a reconciler without children.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether kind `C` is declared.
    pub fn contains<C: Resource<DynamicType = ()>>(&self) -> bool {
        self.set().has(&ApiResource::erase::<C>(&()))
    }

    /// The declared kinds, in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = &ApiResource> {
        self.kinds.iter().map(|d| &d.resource)
    }

    /// The declared kinds, each with whether it is namespaced.
    pub fn scoped(&self) -> impl Iterator<Item = (&ApiResource, bool)> {
        self.kinds.iter().map(|d| (&d.resource, d.namespaced))
    }

    /// Whether no kind is declared.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Every declared kind.
    pub(crate) fn set(&self) -> KindSet {
        KindSet(self.iter().cloned().collect())
    }

    /// The kinds whose status is read.
    pub(crate) fn status_set(&self) -> KindSet {
        KindSet(
            self.kinds
                .iter()
                .filter(|d| d.reads_status)
                .map(|d| d.resource.clone())
                .collect(),
        )
    }

    /// `controller` owning every declared kind, each watched with `config`.
    pub(crate) fn own_all(
        &self,
        mut controller: Controller<K>,
        client: &Client,
        config: &watcher::Config,
    ) -> Controller<K> {
        for d in &self.kinds {
            controller = (d.own)(controller, client, config.clone());
        }
        controller
    }

    /// Starts a reflector of every declared kind on `client`, selected by `config`, into
    /// `caches`; returns once each is listed.
    ///
    /// # Errors
    /// [`WatchChildrenError`] when a watch ended before its first list.
    ///
    /// # Cancel safety
    /// Cancel safe: the watches started so far end when the future is dropped.
    pub(crate) async fn cache_all(
        &self,
        client: &Client,
        config: &watcher::Config,
        caches: &ChildCaches,
    ) -> Result<ChildWatches, WatchChildrenError> {
        let mut watches = ChildWatches(Vec::new());
        for d in &self.kinds {
            let task = (d.cache)(client.clone(), config.clone(), caches.clone()).await?;
            watches.0.push(task);
        }
        Ok(watches)
    }
}

impl<K: IdempotentResource> ChildKinds<K>
where
    K::Scope: 'static,
{
    /// These kinds and child kind `C`: watched by the controller (a change of a child
    /// reconciles its owner; status-only changes do not), cached without its status.
    #[must_use]
    pub fn owns<C>(self) -> Self
    where
        C: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + Debug
            + Send
            + Sync
            + 'static,
        C::Scope: ChildScope,
    {
        self.declare::<C>(false)
    }

    /// These kinds and child kind `C`, whose `status` the readiness reads (e.g. a
    /// StatefulSet's `readyReplicas`): its watch keeps the status, a change of it reconciles
    /// the owner, and [`Children::get`](super::Children::get) reads it from the cache.
    #[must_use]
    pub fn owns_reading_status<C>(self) -> Self
    where
        C: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + Debug
            + Send
            + Sync
            + 'static,
        C::Scope: ChildScope,
    {
        self.declare::<C>(true)
    }

    fn declare<C>(mut self, reads_status: bool) -> Self
    where
        C: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + Debug
            + Send
            + Sync
            + 'static,
        C::Scope: ChildScope,
    {
        let resource = ApiResource::erase::<C>(&());
        if let Some(d) = self.kinds.iter_mut().find(|d| same(&d.resource, &resource)) {
            d.reads_status |= reads_status;
            return self;
        }
        let own: OwnFn<K> = Arc::new(|controller, client, config| {
            controller.owns(Api::<C>::all(client.clone()), config)
        });
        let cache: CacheFn = Arc::new(|client, config, caches| {
            Box::pin(async move {
                let (store, writer) = reflector::store::<C>();
                let stream = watch_backoff(relisting(Api::<C>::all(client), config))
                    .reflect(writer)
                    .for_each(|_| futures::future::ready(()));
                let task = tokio::spawn(stream);
                let listed = store.wait_until_ready().await;
                if listed.is_err() {
                    task.abort();
                    return Err(WatchChildrenError::NotListed {
                        kind: C::kind(&()).into_owned(),
                    });
                }
                caches.register(store);
                Ok(task)
            })
        });
        self.kinds.push(Declared {
            resource,
            namespaced: <C::Scope as ChildScope>::NAMESPACED,
            reads_status,
            own,
            cache,
        });
        self
    }
}

/// Why the watches of declared child kinds could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchChildrenError {
    /// A watch ended before its first list completed.
    #[error("the watch of {kind} ended before it was listed")]
    NotListed {
        /// The child kind.
        kind: String,
    },
}

/// The running watches that fill child caches (from [`Driver::watch_children`]); they end
/// when this is dropped.
///
/// [`Driver::watch_children`]: super::Driver::watch_children
#[derive(Debug)]
pub struct ChildWatches(Vec<JoinHandle<()>>);

impl Drop for ChildWatches {
    fn drop(&mut self) {
        for w in &self.0 {
            w.abort();
        }
    }
}

/// The controller of a reconciler: built here, where the reconciler's declaration is, so the
/// controller loop knows nothing of reconcilers.
impl<K: IdempotentResource> Controller<K>
where
    K::Scope: 'static,
{
    /// The controller of reconciler `R`'s kind: [`Controller::for_derived`] on every object of
    /// the kind, owning every child kind [`Reconciler::children`] declares, each watched with
    /// [`children_config`] (only the children labelled managed-by the kind's field manager),
    /// so that no child kind is forgotten or watched unselected. Run it with
    /// [`Driver::run`](super::Driver::run).
    ///
    /// [`Reconciler::children`]: super::Reconciler::children
    pub fn for_reconciler<R: Reconciler<Resource = K>>(client: &Client) -> Self {
        Self::for_reconciler_with::<R>(client, primary_config(), children_config::<K>())
    }

    /// As [`Controller::for_reconciler`], watching the objects with `config` and the children
    /// of every declared kind with `children` (e.g. [`children_config`] narrowed to a shard's
    /// buckets, or with streaming lists and a page size).
    pub fn for_reconciler_with<R: Reconciler<Resource = K>>(
        client: &Client,
        config: watcher::Config,
        children: watcher::Config,
    ) -> Self {
        let controller = Self::for_derived(Api::all(client.clone()), config);
        R::children().own_all(controller, client, &children)
    }
}
