//! Watches of blocking objects: when a reconcile finds a desired child's name taken by an
//! object the owner does not own (`ChildNotOwned`), the controller watches exactly that object
//! (a watch with a `metadata.name` field selector, in its namespace) and reconciles the owner
//! again as soon as the object is deleted or replaced (another uid under the name), so the
//! owner recovers without polling. The owned-children watches cannot see such an object: they
//! select `app.kubernetes.io/managed-by`, which a foreign object does not carry.
//!
//! The watches belong to the controller that started them ([`super::Controller::run`]): they
//! end when it stops (shutdown, or a shard ring change that restarts the controllers), when
//! the owner's next reconcile no longer finds the object in a child's way, when the owner is
//! deleted, and once they have triggered. Each blocking object costs one watch while it
//! blocks; past [`MAX_BLOCKED_WATCHES_PER_TENANT`] watches for one tenant (so that one tenant
//! cannot use up the watches of all others) or [`MAX_BLOCKED_WATCHES`] for the controller,
//! the owner is polled every [`BLOCKED_POLL`] instead. The gauge
//! `idem_blocked_object_watches{controller}` counts the watches running.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use kube::runtime::watcher as watch_fn;
use kube::runtime::watcher::{self, Event};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::backoff::watch_backoff;
use crate::key::{ObjectKey, TenantKey};

/// Most blocking objects one controller watches at once for all tenants together (a
/// backstop); beyond, a blocked owner is polled every [`BLOCKED_POLL`].
pub const MAX_BLOCKED_WATCHES: usize = 500;

/// Most blocking objects one controller watches at once for one tenant; beyond, that tenant's
/// blocked owners are polled every [`BLOCKED_POLL`] while other tenants' still get watches.
pub const MAX_BLOCKED_WATCHES_PER_TENANT: usize = 20;

/// How often an owner blocked by an object that cannot be watched (over a limit) is
/// reconciled again.
pub const BLOCKED_POLL: Duration = Duration::from_secs(30);

/// One watched blocking object of one owner.
type Watch = (ObjectKey, ObjectKey);

#[derive(Debug)]
struct Entry {
    tenant: TenantKey,
    /// Distinguishes this watch from a later one of the same pair (its task removes only its
    /// own entry).
    id: u64,
    abort: AbortHandle,
}

#[derive(Default)]
struct State {
    /// `None` until the controller runs, and again once it stopped: nothing is watched then.
    running: Option<Running>,
    watches: HashMap<Watch, Entry>,
    by_tenant: HashMap<TenantKey, usize>,
    next_id: u64,
}

struct Running {
    client: kube::Client,
    gauge: Gauge,
}

impl State {
    fn remove(&mut self, watch: &Watch) -> Option<Entry> {
        let entry = self.watches.remove(watch)?;
        if let Some(n) = self.by_tenant.get_mut(&entry.tenant) {
            *n -= 1;
            if *n == 0 {
                self.by_tenant.remove(&entry.tenant);
            }
        }
        Some(entry)
    }
}

/// The blocking-object watches of one controller (a cheap handle; see the
/// [module docs](self)). Reconcilers run by a [`Driver`](crate::reconciler::Driver) get
/// their blocking objects watched without doing anything.
#[derive(Clone)]
pub struct BlockedWatches {
    limits: (usize, usize),
    state: Arc<Mutex<State>>,
    trigger: mpsc::UnboundedSender<ObjectKey>,
}

impl std::fmt::Debug for BlockedWatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockedWatches")
            .field("watches", &self.len())
            .finish()
    }
}

/// The receiving end of [`BlockedWatches`]' triggers: the owners to reconcile again.
pub(crate) type Triggers = mpsc::UnboundedReceiver<ObjectKey>;

impl BlockedWatches {
    /// Watches with the shipped limits, and the stream of owners they trigger.
    pub(crate) fn new() -> (Self, Triggers) {
        Self::with_limits(MAX_BLOCKED_WATCHES_PER_TENANT, MAX_BLOCKED_WATCHES)
    }

    fn with_limits(per_tenant: usize, total: usize) -> (Self, Triggers) {
        let (trigger, triggers) = mpsc::unbounded_channel();
        let watches = Self {
            limits: (per_tenant, total),
            state: Arc::default(),
            trigger,
        };
        (watches, triggers)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts taking watches (the controller runs), with `client`, counting them in `gauge`;
    /// the returned guard stops every watch when dropped (the controller stopped, or its
    /// future was dropped).
    pub(crate) fn start(&self, client: kube::Client, gauge: Gauge) -> StopOnDrop {
        self.state().running = Some(Running { client, gauge });
        StopOnDrop(self.clone())
    }

    /// Ends every watch and takes no more.
    fn stop(&self) {
        let mut state = self.state();
        state.running = None;
        state.by_tenant.clear();
        for (_, entry) in state.watches.drain() {
            entry.abort.abort();
        }
    }

    /// The watches running now.
    pub fn len(&self) -> usize {
        self.state().watches.len()
    }

    /// Whether no watch runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes the watches of `owner` (of tenant `tenant`) exactly `blocking`: the objects
    /// (each with its kind's resource) that its reconcile just found in its children's way.
    /// Watches of objects no longer in the list end; new ones start within the limits.
    /// Returns `false` when one could not be watched (over a limit, or the controller is not
    /// running): poll the owner instead ([`BLOCKED_POLL`]).
    pub fn set(
        &self,
        owner: &ObjectKey,
        tenant: &TenantKey,
        blocking: &[(ApiResource, ObjectKey)],
    ) -> bool {
        let wanted: BTreeSet<&ObjectKey> = blocking.iter().map(|(_, k)| k).collect();
        let mut state = self.state();
        let ended: Vec<Watch> = state
            .watches
            .keys()
            .filter(|(o, child)| o == owner && !wanted.contains(child))
            .cloned()
            .collect();
        for watch in ended {
            if let Some(entry) = state.remove(&watch) {
                entry.abort.abort();
            }
        }
        let mut all = true;
        for (resource, child) in blocking {
            let watch = (owner.clone(), child.clone());
            if state.watches.contains_key(&watch) {
                continue;
            }
            let Some(running) = &state.running else {
                all = false;
                continue;
            };
            let used = state.by_tenant.get(tenant).copied().unwrap_or(0);
            if used >= self.limits.0 || state.watches.len() >= self.limits.1 {
                all = false;
                continue;
            }
            let (client, gauge) = (running.client.clone(), running.gauge.clone());
            let id = state.next_id;
            state.next_id += 1;
            let abort = self.spawn(client, gauge, resource.clone(), watch.clone(), id);
            state.watches.insert(
                watch,
                Entry {
                    tenant: tenant.clone(),
                    id,
                    abort,
                },
            );
            *state.by_tenant.entry(tenant.clone()).or_default() += 1;
        }
        all
    }

    /// Ends the watches of `owner` (deleted).
    pub(crate) fn forget_owner(&self, owner: &ObjectKey) {
        let mut state = self.state();
        let ended: Vec<Watch> = state
            .watches
            .keys()
            .filter(|(o, _)| o == owner)
            .cloned()
            .collect();
        for watch in ended {
            if let Some(entry) = state.remove(&watch) {
                entry.abort.abort();
            }
        }
    }

    /// The task watching `watch.1` for `watch.0`: counted in `gauge` while it runs (aborted
    /// or done), it triggers the owner once the object is gone or replaced.
    fn spawn(
        &self,
        client: kube::Client,
        gauge: Gauge,
        resource: ApiResource,
        watch: Watch,
        id: u64,
    ) -> AbortHandle {
        let live = Live::new(gauge);
        let (owner, child) = watch.clone();
        let api = match &child.namespace {
            Some(ns) => Api::<DynamicObject>::namespaced_with(client, ns, &resource),
            None => Api::<DynamicObject>::all_with(client, &resource),
        };
        let config = watcher::Config::default().fields(&format!("metadata.name={}", child.name));
        let (state, trigger) = (Arc::clone(&self.state), self.trigger.clone());
        let task = tokio::spawn(async move {
            let _live = live;
            let stream = watch_backoff(watch_fn(api, config));
            futures::pin_mut!(stream);
            // The uid of the blocking object, as first seen; `present`: seen in this list.
            let mut first: Option<String> = None;
            let mut present = false;
            while let Some(event) = stream.next().await {
                let gone = match event {
                    Ok(Event::Init) => {
                        present = false;
                        false
                    }
                    Ok(Event::InitApply(obj) | Event::Apply(obj)) => {
                        present = true;
                        let uid = obj.metadata.uid.unwrap_or_default();
                        // Replaced: another object under the name (deleted and created again).
                        first.get_or_insert_with(|| uid.clone()) != &uid
                    }
                    Ok(Event::InitDone) => !present,
                    Ok(Event::Delete(_)) => true,
                    Err(e) => {
                        tracing::debug!(error = %e, object = %child, "blocking object watch error");
                        false
                    }
                };
                if gone {
                    break;
                }
            }
            {
                let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
                if state.watches.get(&watch).is_some_and(|e| e.id == id) {
                    state.remove(&watch);
                }
            }
            tracing::debug!(%owner, blocking = %child, "blocking object gone or replaced");
            let _ = trigger.send(owner);
        });
        task.abort_handle()
    }
}

/// Stops every watch of a [`BlockedWatches`] when dropped.
pub(crate) struct StopOnDrop(BlockedWatches);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Holds one increment of a gauge for its lifetime (the life of a watch task).
struct Live(Gauge);

impl Live {
    fn new(gauge: Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(name: &str) -> (ApiResource, ObjectKey) {
        (
            ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            ObjectKey::namespaced("ConfigMap", "ns", name),
        )
    }

    fn owner(name: &str) -> ObjectKey {
        ObjectKey::namespaced("App", "ns", name)
    }

    /// A client that never connects (the watches only retry with backoff).
    fn client() -> kube::Client {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    #[tokio::test]
    async fn one_tenant_cannot_use_up_the_watches_of_the_others_and_stop_ends_every_watch() {
        let (watches, _triggers) = BlockedWatches::with_limits(2, 3);
        let (a, b, c) = (
            TenantKey::new("a"),
            TenantKey::new("b"),
            TenantKey::new("c"),
        );
        assert!(
            !watches.set(&owner("a"), &a, &[cm("a1")]),
            "not running: nothing is watched"
        );
        let gauge = Gauge::default();
        let guard = watches.start(client(), gauge.clone());
        assert!(watches.set(&owner("a"), &a, &[cm("a1"), cm("a2")]));
        assert!(
            watches.set(&owner("a"), &a, &[cm("a1"), cm("a2")]),
            "already watched"
        );
        // Tenant a is at its own limit; b still gets a watch.
        assert!(!watches.set(&owner("a2"), &a, &[cm("a3")]));
        assert!(watches.set(&owner("b"), &b, &[cm("b1")]));
        // The backstop.
        assert!(!watches.set(&owner("c"), &c, &[cm("c1")]));
        assert_eq!((watches.len(), gauge.get()), (3, 3));
        // The owner's next reconcile no longer finds a1 in the way: its watch ends.
        assert!(watches.set(&owner("a"), &a, &[cm("a2")]));
        assert!(watches.set(&owner("c"), &c, &[cm("c1")]));
        assert!(
            !watches.set(&owner("a2"), &a, &[cm("a3")]),
            "the total is full again"
        );
        watches.forget_owner(&owner("b"));
        assert!(watches.set(&owner("a2"), &a, &[cm("a3")]), "a has one left");
        assert_eq!(watches.len(), 3);
        drop(guard);
        assert!(watches.is_empty());
        // Aborted tasks drop their gauge increment once the runtime drops them.
        for _ in 0..100 {
            if gauge.get() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(gauge.get(), 0);
        assert!(!watches.set(&owner("a"), &a, &[cm("a1")]), "stopped");
    }

    #[test]
    fn the_shipped_limits_keep_a_tenant_below_the_total() {
        const { assert!(MAX_BLOCKED_WATCHES_PER_TENANT * 10 <= MAX_BLOCKED_WATCHES) };
    }
}
