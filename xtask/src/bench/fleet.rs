//! The bench's side of the cluster: the BaseTenant CRD, creating and changing tenants, a watch
//! that records when each one became Ready, and the raw-client limit.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use idem_bench::{BaseTenant, BaseTenantSpec, CHILD_NAME, RUN_LABEL, desired};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, CustomResourceExt as _, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

/// Concurrent requests of the bench's own writes (the controllers' worker count).
pub const CONCURRENCY: usize = 16;

/// Installs the BaseTenant CRD and waits until it is served.
///
/// # Errors
/// API errors, or the CRD not becoming established in 60 s.
pub async fn install_crd(client: &Client) -> anyhow::Result<()> {
    idem_tests::install_crd(client, &BaseTenant::crd())
        .await
        .context("installing the BaseTenant CRD")?;
    Ok(())
}

/// A BaseTenant of run `run`: `name`, belonging to `tenant`, with `namespaces` short names.
pub fn tenant(run: &str, name: &str, tenant: &str, namespaces: &[&str]) -> BaseTenant {
    let mut bt = BaseTenant::new(
        name,
        BaseTenantSpec {
            tenant: tenant.to_owned(),
            namespaces: namespaces.iter().map(|s| (*s).to_owned()).collect(),
            cpu: "4".into(),
            owner: format!("{tenant}-owner"),
        },
    );
    bt.metadata.labels = Some([(RUN_LABEL.to_owned(), run.to_owned())].into());
    bt
}

/// Creates `objects` with at most [`CONCURRENCY`] requests in flight; returns when every
/// create answered, with the Instant each was sent.
///
/// # Errors
/// The first failed create.
pub async fn create_all<K>(
    api: &Api<K>,
    objects: Vec<K>,
) -> anyhow::Result<HashMap<String, Instant>>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let pp = PostParams::default();
    futures::stream::iter(objects)
        .map(|o| {
            let (api, pp) = (api.clone(), &pp);
            async move {
                let name = o.meta().name.clone().unwrap_or_default();
                let sent = Instant::now();
                api.create(pp, &o)
                    .await
                    .with_context(|| format!("creating {name}"))?;
                Ok::<_, anyhow::Error>((name, sent))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
}

/// Changes `spec.cpu` of `name` (a merge patch); returns the new generation.
///
/// # Errors
/// API errors.
pub async fn change_cpu(client: &Client, name: &str, cpu: &str) -> anyhow::Result<i64> {
    let api = Api::<BaseTenant>::all(client.clone());
    let patch = serde_json::json!({"spec": {"cpu": cpu}});
    let bt = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    bt.metadata.generation.context("no generation")
}

/// What the watch saw of one BaseTenant.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Current generation.
    pub generation: i64,
    /// Whether it is Ready for its current generation.
    pub ready: bool,
    /// When it was first seen Ready, per generation.
    pub ready_at: BTreeMap<i64, Instant>,
}

/// A watch of one run's BaseTenants that records when each became Ready.
pub struct Tracker {
    seen: Arc<Mutex<HashMap<String, Seen>>>,
    /// How many of the seen BaseTenants are Ready now (kept with `seen`, under its lock), so
    /// a wait for N of them does not look at N names on every event.
    ready_now: Arc<AtomicUsize>,
    changed: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Tracker {
    /// Starts watching BaseTenants labelled with `run` and waits for the initial list.
    pub async fn start(client: &Client, run: &str) -> Self {
        let seen: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
        let changed = Arc::new(Notify::new());
        let api = Api::<BaseTenant>::all(client.clone());
        let config = watcher::Config::default().labels(&format!("{RUN_LABEL}={run}"));
        let ready_now = Arc::new(AtomicUsize::new(0));
        let (s, c, r) = (
            Arc::clone(&seen),
            Arc::clone(&changed),
            Arc::clone(&ready_now),
        );
        let (listed_tx, listed_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut listed = Some(listed_tx);
            let stream = watcher(api, config).default_backoff();
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let objects = match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => vec![o],
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = listed.take() {
                            let _ = tx.send(());
                        }
                        vec![]
                    }
                    _ => vec![],
                };
                let now = Instant::now();
                let mut map = s.lock().expect("tracker lock");
                for o in objects {
                    let entry = map
                        .entry(o.metadata.name.clone().unwrap_or_default())
                        .or_default();
                    entry.generation = o.metadata.generation.unwrap_or_default();
                    let was = entry.ready;
                    entry.ready = o.is_ready();
                    match (was, entry.ready) {
                        (false, true) => r.fetch_add(1, Ordering::Relaxed),
                        (true, false) => r.fetch_sub(1, Ordering::Relaxed),
                        _ => 0,
                    };
                    if entry.ready {
                        entry.ready_at.entry(entry.generation).or_insert(now);
                    }
                }
                drop(map);
                c.notify_waiters();
            }
        });
        let _ = listed_rx.await;
        Self {
            seen,
            ready_now,
            changed,
            task,
        }
    }

    /// A copy of what was seen of `name`.
    pub fn get(&self, name: &str) -> Option<Seen> {
        self.seen.lock().expect("tracker lock").get(name).cloned()
    }

    /// How many of `names` are Ready at their current generation.
    pub fn ready_count<'a>(&self, names: impl IntoIterator<Item = &'a String>) -> usize {
        let map = self.seen.lock().expect("tracker lock");
        names
            .into_iter()
            .filter(|n| map.get(*n).is_some_and(|s| s.ready))
            .count()
    }

    /// Waits until `done` holds for the seen map, calling `progress` on every change.
    ///
    /// # Errors
    /// When `timeout` passes first.
    pub async fn wait(
        &self,
        timeout: Duration,
        what: &str,
        mut done: impl FnMut(&HashMap<String, Seen>) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            if done(&self.seen.lock().expect("tracker lock")) {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                bail!("timed out after {timeout:?} waiting for {what}");
            }
        }
    }

    /// Waits until every one of `names` is Ready at its current generation.
    ///
    /// # Errors
    /// When `timeout` passes first.
    pub async fn wait_ready(
        &self,
        names: &[String],
        timeout: Duration,
        progress: impl Fn(usize),
    ) -> anyhow::Result<()> {
        self.wait(timeout, "tenants to become Ready", |m| {
            // Fewer Ready than `names` in all: not yet, whichever they are (looking at every
            // name on every event would cost the bench N² at N tenants).
            let all = self.ready_now.load(Ordering::Relaxed);
            if all < names.len() {
                progress(all);
                return false;
            }
            let n = names
                .iter()
                .filter(|n| m.get(*n).is_some_and(|s| s.ready))
                .count();
            progress(n);
            n == names.len()
        })
        .await
    }

    /// Waits until `name` is Ready at generation `generation` (or later); returns when.
    ///
    /// # Errors
    /// When `timeout` passes first.
    pub async fn wait_generation(
        &self,
        name: &str,
        generation: i64,
        timeout: Duration,
    ) -> anyhow::Result<Instant> {
        let mut at = None;
        self.wait(timeout, "a changed tenant to become Ready", |m| {
            at = m
                .get(name)
                .and_then(|s| s.ready_at.range(generation..).next().map(|(_, t)| *t));
            at.is_some()
        })
        .await?;
        Ok(at.unwrap_or_else(Instant::now))
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The raw-client limit: the `tenants × 13` creates the job needs (3 namespaces, 9 children,
/// and one ConfigMap standing in for each status write), sent from a plain client at
/// [`CONCURRENCY`]; namespaces first, since the children live in them.
///
/// # Errors
/// The first failed create.
pub async fn raw_limit(client: &Client, tenants: usize) -> anyhow::Result<Duration> {
    let fleet: Vec<BaseTenant> = (0..tenants)
        .map(|i| {
            let mut bt = tenant("raw", &format!("raw-t{i:04}"), "raw", &["a", "b", "c"]);
            bt.metadata.uid = Some("raw".into());
            bt
        })
        .collect();
    let all: Vec<_> = fleet.iter().map(desired).collect();
    let start = Instant::now();
    let namespaces = all.iter().flat_map(|d| d.namespaces.clone()).collect();
    create_all(&Api::all(client.clone()), namespaces).await?;
    create_namespaced(client, all.iter().flat_map(|d| d.quotas.clone()).collect()).await?;
    create_namespaced(client, all.iter().flat_map(|d| d.limits.clone()).collect()).await?;
    create_namespaced(
        client,
        all.iter().flat_map(|d| d.bindings.clone()).collect(),
    )
    .await?;
    let status_stand_ins = (0..tenants)
        .map(|i| ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{CHILD_NAME}-status-{i}")),
                ..Default::default()
            },
            ..ConfigMap::default()
        })
        .collect();
    create_all(
        &Api::namespaced(client.clone(), "default"),
        status_stand_ins,
    )
    .await?;
    Ok(start.elapsed())
}

/// Creates namespaced `objects`, each in its own `metadata.namespace`, at [`CONCURRENCY`].
async fn create_namespaced<K>(client: &Client, objects: Vec<K>) -> anyhow::Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug,
{
    let pp = PostParams::default();
    futures::stream::iter(objects)
        .map(|o| {
            let pp = &pp;
            let ns = o.meta().namespace.clone().unwrap_or_default();
            let api = Api::<K>::namespaced(client.clone(), &ns);
            async move {
                api.create(pp, &o)
                    .await
                    .with_context(|| format!("creating {} in {ns}", K::kind(&())))?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Waits until kube-controller-manager has done its part for every object made so far: each
/// namespace has its `default` ServiceAccount and `kube-root-ca.crt` ConfigMap, and each
/// ResourceQuota its `status.hard`. A side's time to all Ready then holds only the work of its
/// own fleet, not the controller-manager's backlog from what ran before it (the raw-client
/// limit's 3,000 namespaces and quotas, or the previous side's). Gives up after `timeout`
/// (the run goes on, said on stderr).
///
/// # Errors
/// When the API fails.
pub async fn settle(client: &Client, timeout: Duration) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Namespace, ResourceQuota, ServiceAccount};
    use kube::api::ListParams;
    let deadline = Instant::now() + timeout;
    let named = |name: &str| ListParams::default().fields(&format!("metadata.name={name}"));
    loop {
        let namespaces = Api::<Namespace>::all(client.clone())
            .list_metadata(&ListParams::default())
            .await?
            .items
            .len();
        let accounts = Api::<ServiceAccount>::all(client.clone())
            .list_metadata(&named("default"))
            .await?
            .items
            .len();
        let root_ca = Api::<ConfigMap>::all(client.clone())
            .list_metadata(&named("kube-root-ca.crt"))
            .await?
            .items
            .len();
        let quotas = Api::<ResourceQuota>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let unsettled_quotas = quotas
            .iter()
            .filter(|q| q.status.as_ref().and_then(|s| s.hard.as_ref()).is_none())
            .count();
        if accounts >= namespaces && root_ca >= namespaces && unsettled_quotas == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            eprintln!(
                "the control plane did not settle in {timeout:?}: {namespaces} namespaces, \
                 {accounts} default ServiceAccounts, {root_ca} root CA ConfigMaps, \
                 {unsettled_quotas} quotas without status; going on"
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
