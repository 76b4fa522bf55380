//! The manager: owns startup (client, metrics, probes, leader election, caches) and shutdown:
//! graceful on a signal (stop taking work, let in-flight reconciles finish, release the Lease),
//! immediate on lost leadership (in-flight reconciles are cancelled, as controller-runtime does).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use idem_runtime::apply::MANAGED_BY_LABEL;
use idem_runtime::controller::ControllerConfig;
use idem_runtime::metrics::Metrics;
use idem_runtime::reconciler::Driver;
use k8s_openapi::api::core::v1::Namespace;
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::Reporter;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Config};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::context::Context;
use crate::resources::FIELD_MANAGER;
use crate::shard::guard::Ring;
use crate::shard::membership::{Membership, MembershipMetrics};
use crate::shard::selector::{SelectorLayer, Selectors};
use crate::{tenant, tenant_app};
use idem_runtime::http;
use idem_runtime::leader::{Fence, FenceLayer, FenceMode};

/// How the manager runs; see `idem-operator run --help`.
#[derive(Debug, Clone)]
pub struct ManagerOptions {
    /// Kubeconfig file; `None`: `KUBECONFIG`, `~/.kube/config`, then in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// Concurrent reconciles per controller.
    pub workers: usize,
    /// Reconciles of one tenant at once, per controller; 0 (the default of the flag): no
    /// cap, a tenant may use every idle worker and weights share workers under contention.
    pub tenant_concurrency: usize,
    /// Anti-entropy resync period (zero disables).
    pub resync_period: Duration,
    /// Address of `/metrics`.
    pub metrics_addr: SocketAddr,
    /// Address of `/healthz` and `/readyz`.
    pub health_addr: SocketAddr,
    /// Hold a Lease before running controllers.
    pub leader_elect: bool,
    /// Namespace of the Lease (default `default`).
    pub leader_elect_namespace: Option<String>,
    /// Identity in the Lease (default host name + pid).
    pub identity: Option<String>,
    /// How long a graceful shutdown (a signal) waits for in-flight reconciles; lost
    /// leadership cancels them at once.
    pub shutdown_grace: Duration,
    /// Shard tenants across the replicas that hold a member Lease (`--shards auto`, see
    /// [`crate::shard`]); excludes `leader_elect`.
    pub shards: bool,
}

/// Resolves on SIGTERM or Ctrl-C (idem-runtime's).
pub use idem_runtime::http::shutdown_signal;

/// A client from `kubeconfig`, or kube's inferred config.
///
/// # Errors
/// When no configuration can be loaded.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    Ok(crate::client::build(config(kubeconfig).await?)?)
}

async fn config(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Config> {
    Ok(match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
        }
        None => Config::infer().await?,
    })
}

/// A client whose writes pass only while `fence` is valid ([`idem_runtime::leader::fence`]), with the
/// operator's retry of transient failures ([`crate::client`]: a `POST` only on 429) outside
/// the fence, so every attempt is fenced.
///
/// `gate` is a second fence every write must pass too (a shard ring's own, closed for good
/// when the ring ends; [`Fence::open`] otherwise).
fn fenced_client(
    mut config: Config,
    fence: Arc<Fence>,
    gate: Arc<Fence>,
    selectors: Arc<Selectors>,
) -> anyhow::Result<Client> {
    config.default_retry = false;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&SelectorLayer(selectors))
        .with_layer(&FenceLayer::new(fence))
        .with_layer(&FenceLayer::new(gate))
        .with_layer(&tower::buffer::BufferLayer::new(1024))
        .with_layer(&tower::retry::RetryLayer::new(
            crate::client::IdempotentRetry::default(),
        ))
        .build())
}

fn identity(options: &ManagerOptions) -> String {
    (options.identity.clone()).unwrap_or_else(idem_runtime::leader::default_identity)
}

/// Runs both controllers until `shutdown` resolves, then shuts down gracefully; or until
/// leadership is lost, then cancels every reconcile at once and returns an error.
///
/// `/readyz` does not depend on leadership (controller-runtime's convention): with
/// `leader_elect` a standby is ready once it takes part in the election, so every replica of
/// a Deployment is Ready; once it leads, and without it, while every controller's caches are
/// synced and their watches established (not while, e.g., the Tenant CRD is missing). With
/// `shards`, a replica waiting for a ring is ready as a standby is, and one working on its
/// share as a single replica is ([`Sharded::run`]).
///
/// A replica outside the shard ring (without `shards`) does not work beside a live ring
/// ([`crate::shard::guard`]): at start it waits until the ring is gone, and a ring that comes
/// alive while it works stops it until `shutdown`; a member whose Lease another process renews
/// refuses until `shutdown`. Meanwhile: not ready, nothing reconciled, an error logged.
///
/// # Errors
/// When the client or endpoints cannot be set up, a controller's configuration is invalid, or
/// leadership is lost (so the process exits and a standby takes over).
pub async fn run(
    options: ManagerOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let kube_config = config(options.kubeconfig.as_deref()).await?;
    let lease_client = Client::try_from(kube_config.clone())?;
    crate::resources::report_missing_crds(&lease_client).await;
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let drift = idem_runtime::apply::DriftMetrics::new(&mut registry);
    let leader_status = Gauge::default();
    let identity = identity(&options);
    let mut leadership = if options.leader_elect {
        let ns = options
            .leader_elect_namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        tracing::info!(%identity, namespace = %ns, "waiting to become leader");
        let mut election = crate::leader::election(&ns, &identity);
        election.status = leader_status.clone();
        Some(election.start(lease_client.clone())?)
    } else {
        None
    };
    let membership_metrics = MembershipMetrics::default();
    let membership = options.shards.then(|| {
        let ns = options
            .leader_elect_namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        tracing::info!(%identity, namespace = %ns, "joining the shard ring");
        Membership::start(
            lease_client.clone(),
            &ns,
            &identity,
            membership_metrics.clone(),
        )
    });
    let fence = match (&leadership, &membership) {
        (Some(lease), _) => lease.fence(),
        (None, Some(member)) => member.fence(),
        (None, None) => Fence::open(),
    };
    if leadership.is_none() {
        leader_status.set(1);
    }
    let selectors = Arc::new(Selectors::default());
    let owned = Gauge::default();
    let cached_children = Gauge::default();
    let server_side: Gauge = Gauge::default();
    if membership.is_some() {
        match crate::shard::probe_server_side(&lease_client).await {
            Ok(on) => {
                tracing::info!(server_side = on, "shardSelector support of the API server");
                selectors
                    .server_side
                    .store(on, std::sync::atomic::Ordering::Relaxed);
                server_side.set(i64::from(on));
            }
            Err(e) => {
                tracing::warn!(error = %e, "probing shardSelector support failed; filtering on this side")
            }
        }
        registry.register(
            "idem_shard_members",
            "Live members of the shard ring as this replica last saw it",
            membership_metrics.members.clone(),
        );
        registry.register(
            "idem_shard_handovers",
            "Times this replica stopped working on a ring because its membership changed",
            membership_metrics.handovers.clone(),
        );
        registry.register(
            "idem_shard_working",
            "1 while this replica works on an acknowledged ring, 0 while it waits for one",
            membership_metrics.working.clone(),
        );
        registry.register(
            "idem_shard_server_side",
            "1 when the API server filters this replica's lists and watches by shardSelector",
            server_side,
        );
        registry.register(
            "idem_shard_owned_tenants",
            "Tenants in this replica's shard",
            owned.clone(),
        );
        registry.register(
            "idem_shard_child_cache_objects",
            "Objects in this replica's child caches (the children of its share of the owners)",
            cached_children.clone(),
        );
    }
    registry.register(
        "idem_watch_events_received",
        "Watch events this replica received (all watches of its controllers)",
        selectors.events_received.clone(),
    );
    registry.register(
        "idem_received_bytes",
        "Bytes of GET responses (lists, watches, reads) this replica received",
        selectors.bytes_received.clone(),
    );
    registry.register(
        "leader_election_master_status",
        "1 while this replica is the leader (always 1 without leader election)",
        leader_status,
    );
    registry.register(
        "idem_fenced_writes",
        "Writes refused because this replica's leader lease was not valid",
        fence.refused.clone(),
    );
    let registry = Arc::new(registry);
    let client = fenced_client(
        kube_config.clone(),
        Arc::clone(&fence),
        Fence::open(),
        Arc::clone(&selectors),
    )?;
    let (ready_tx, ready_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let servers = http::start(
        options.metrics_addr,
        options.health_addr,
        Arc::clone(&registry),
        ready_rx,
        stop_rx.clone(),
    )
    .await
    .context("binding the metrics/health addresses")?;
    for (addr, _) in &servers {
        tracing::info!(%addr, "serving HTTP endpoints");
    }
    tokio::pin!(shutdown);

    if let Some(membership) = membership {
        let sharded = Sharded {
            config: &kube_config,
            fence: &fence,
            ready: &ready_tx,
            identity: &identity,
            options: &options,
            metrics: &metrics,
            drift: &drift,
            selectors: &selectors,
            owned: &owned,
            cached_children: &cached_children,
        };
        sharded.run(&membership, &mut shutdown).await;
        membership.leave().await;
        let _ = stop_tx.send(true);
        for (_, task) in servers {
            let _ = task.await;
        }
        return Ok(());
    }

    // Not a member of the shard ring: not beside a live one (it would reconcile everything
    // a second time).
    let ns = options
        .leader_elect_namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let mut guard = crate::shard::guard::start(lease_client.clone(), &ns);
    // At start, beside a live ring: not ready, nothing reconciled, until the ring is gone
    // (e.g. the replicas of a Deployment switched away from `--shards` being replaced).
    let clear = async {
        let mut said = false;
        loop {
            let ring = guard.borrow_and_update().clone();
            match ring {
                Ring::None => return,
                Ring::Live(why) if !said => {
                    said = true;
                    tracing::error!(problem = %why, "refusing to run while the shard ring is live: this replica reconciles nothing and is not ready");
                }
                _ => {}
            }
            if guard.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = clear => {}
        () = &mut shutdown => {
            if let Some(lease) = leadership.take() {
                lease.release().await;
            }
            let _ = stop_tx.send(true);
            return Ok(());
        }
    }
    // Once working, a ring that comes alive stops it for good.
    let ring_live = async move {
        let ring = guard.wait_for(|r| matches!(r, Ring::Live(_))).await;
        match ring.map(|r| r.clone()) {
            Ok(Ring::Live(why)) => why,
            _ => std::future::pending().await,
        }
    };
    tokio::pin!(ring_live);

    if let Some(lease) = leadership.as_mut() {
        // A standby is ready: readiness does not depend on leadership.
        let _ = ready_tx.send(true);
        tokio::select! {
            acquired = lease.acquired() => {
                acquired?;
                tracing::info!(%identity, "became leader");
            }
            why = &mut ring_live => {
                refuse(&why, &ready_tx, leadership.take(), shutdown.as_mut()).await;
                let _ = stop_tx.send(true);
                for (_, task) in servers {
                    let _ = task.await;
                }
                return Ok(());
            }
            () = &mut shutdown => {
                if let Some(lease) = leadership.take() {
                    lease.release().await;
                }
                let _ = stop_tx.send(true);
                return Ok(());
            }
        }
    }

    let epoch = controllers(
        &client,
        &identity,
        &options,
        &metrics,
        &drift,
        None,
        stop_rx.clone(),
    );
    let Epoch {
        mut controllers,
        ns_watch,
        mut synced,
        ..
    } = epoch;
    let readiness = tokio::spawn({
        let ready_tx = ready_tx.clone();
        async move {
            let _ = synced.wait_for(|s| *s).await;
            tracing::info!("all caches synced");
            // Not ready again while a watch is not established (e.g. the Tenant CRD deleted).
            idem_runtime::controller::all_ready(vec![synced], ready_tx).await;
        }
    });
    let lost = async {
        match &leadership {
            Some(lease) => lease.lost().await,
            None => std::future::pending().await,
        }
    };
    let (tenant_report, app_report) = tokio::select! {
        reports = &mut controllers => reports,
        () = &mut shutdown => {
            tracing::info!("shutdown requested: finishing in-flight reconciles");
            let _ = stop_tx.send(true);
            controllers.await
        }
        why = &mut ring_live => {
            // Cancelled at once, as on lost leadership; then nothing more until shutdown.
            drop(controllers);
            ns_watch.abort();
            readiness.abort();
            refuse(&why, &ready_tx, leadership.take(), shutdown.as_mut()).await;
            let _ = stop_tx.send(true);
            for (_, task) in servers {
                let _ = task.await;
            }
            return Ok(());
        }
        () = lost => {
            // The fence already refuses writes; dropping the controllers aborts their
            // workers (in-flight reconciles included) and watches now, with no grace period.
            tracing::error!("lost leadership: cancelling every reconcile and exiting");
            drop(controllers);
            ns_watch.abort();
            let _ = stop_tx.send(true);
            for (_, task) in servers {
                let _ = task.await;
            }
            anyhow::bail!("lost leadership");
        }
    };
    readiness.abort();
    let _ = stop_tx.send(true);
    ns_watch.abort();
    for (name, report) in [("tenant", tenant_report?), ("tenantapp", app_report?)] {
        tracing::info!(
            controller = name,
            dropped = report.dropped.len(),
            abandoned = report.abandoned.len(),
            "controller stopped"
        );
    }
    if let Some(lease) = leadership {
        lease.release().await;
    }
    for (_, task) in servers {
        let _ = task.await;
    }
    Ok(())
}

/// Refuses to work (another replica set reconciles the same objects): not ready, nothing
/// reconciled, until `shutdown`.
async fn refuse(
    why: &str,
    ready: &watch::Sender<bool>,
    leadership: Option<idem_runtime::leader::Leadership>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let _ = ready.send(false);
    tracing::error!(problem = %why, "refusing to run: this replica reconciles nothing and is not ready");
    if let Some(lease) = leadership {
        lease.release().await;
    }
    shutdown.await;
}

/// Whether the ring an epoch's controllers were started for is still the current one.
type CurrentFn = Arc<dyn Fn() -> bool + Send + Sync>;

/// One run of both controllers: until `stop` (graceful) or until dropped (cancelled).
struct Epoch {
    /// Both controllers' reports once they stopped.
    controllers: futures::future::BoxFuture<'static, Reports>,
    /// The Namespace watch behind [`Context::namespaces`]; aborted with the epoch.
    ns_watch: tokio::task::JoinHandle<()>,
    /// True while both controllers' caches are synced and their watches established.
    synced: watch::Receiver<bool>,
    /// The Tenant controller's cache.
    tenants: reflector::Store<crate::resources::Tenant>,
    /// Both controllers' child caches.
    caches: idem_runtime::apply::ChildCaches,
}

type Report =
    Result<idem_runtime::queue::ShutdownReport, idem_runtime::controller::ControllerError>;
type Reports = (Report, Report);

/// Builds and starts both controllers (and the Namespace cache they share); with `shard`, each
/// reconciles only the objects whose hash falls in those ranges (a Tenant by uid, a TenantApp
/// by namespace; see [`crate::shard`]).
fn controllers(
    client: &Client,
    identity: &str,
    options: &ManagerOptions,
    metrics: &Metrics,
    drift: &idem_runtime::apply::DriftMetrics,
    shard: Option<(idem_runtime::shard::Ranges, CurrentFn)>,
    stop: watch::Receiver<bool>,
) -> Epoch {
    use idem_runtime::shard::{ShardField, shard_hash};
    use kube::Resource as _;
    // The operator's namespaces, cached, to find a TenantApp's tenant without an API call.
    let (store, writer) = reflector::store::<Namespace>();
    // Sharded: only the namespaces of this replica's TenantApps (see `crate::shard`).
    let ns_buckets = shard.as_ref().and_then(|(r, _)| {
        r.label_selector(crate::shard::NAMESPACE_BUCKET_LABEL)
            .map(|b| format!(",{b}"))
    });
    let ns_config = watcher::Config::default().labels(&format!(
        "{MANAGED_BY_LABEL}={FIELD_MANAGER}{}",
        ns_buckets.unwrap_or_default()
    ));
    let ns_watch = tokio::spawn(
        watcher(Api::<Namespace>::all(client.clone()), ns_config.clone())
            .default_backoff()
            .reflect(writer)
            .for_each(|_| futures::future::ready(())),
    );
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(identity.to_string()),
    };
    let ctx = Context::new(client.clone(), store);
    let tenant_driver = Driver::new(
        client.clone(),
        tenant::reconcile::Tenants {
            ctx: Arc::clone(&ctx),
        },
    )
    .with_caches(ctx.caches.clone())
    .with_drift_metrics(drift.clone())
    .with_reporter(reporter.clone());
    let app_driver = Driver::new(
        client.clone(),
        tenant_app::reconcile::TenantApps {
            ctx: Arc::clone(&ctx),
        },
    )
    .with_caches(ctx.caches.clone())
    .with_drift_metrics(drift.clone())
    .with_reporter(reporter);
    let config = |name: &str| ControllerConfig {
        name: Some(name.into()),
        workers: options.workers,
        per_tenant_cap: (options.tenant_concurrency > 0).then_some(options.tenant_concurrency),
        resync_period: options.resync_period,
        shutdown_grace: options.shutdown_grace,
        ..ControllerConfig::default()
    };
    let (tenant_synced, tenant_ready) = watch::channel(false);
    let (app_synced, app_ready) = watch::channel(false);
    let mut tenants =
        tenant::source::controller(client, config("tenant"), shard.as_ref().map(|(r, _)| r))
            .with_metrics(metrics.clone())
            .with_synced_signal(tenant_synced);
    let tenant_store = tenants.store();
    let mut apps =
        tenant_app::source::controller(client, ns_config, config("tenantapp"), tenants.store())
            .with_metrics(metrics.clone())
            .with_synced_signal(app_synced);
    if let Some((ranges, current)) = shard {
        let (by_uid, current_too) = (ranges.clone(), Arc::clone(&current));
        tenants = tenants.shard(move |t| {
            current_too() && by_uid.contains(shard_hash(t.meta(), ShardField::Uid))
        });
        apps = apps.shard(move |a| {
            current() && ranges.contains(shard_hash(a.meta(), ShardField::Namespace))
        });
    }
    let (synced_tx, synced) = watch::channel(false);
    tokio::spawn(idem_runtime::controller::all_ready(
        vec![tenant_ready, app_ready],
        synced_tx,
    ));
    let stopping = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let controllers = Box::pin(futures::future::join(
        tenant_driver.run(tenants, stopping(stop.clone())),
        app_driver.run(apps, stopping(stop)),
    ));
    Epoch {
        controllers,
        ns_watch,
        synced,
        tenants: tenant_store,
        caches: ctx.caches.clone(),
    }
}

/// What the sharded manager loop needs.
struct Sharded<'a> {
    /// To build each ring's client.
    config: &'a Config,
    /// The membership's write fence.
    fence: &'a Arc<Fence>,
    /// `/readyz`.
    ready: &'a watch::Sender<bool>,
    identity: &'a str,
    options: &'a ManagerOptions,
    metrics: &'a Metrics,
    drift: &'a idem_runtime::apply::DriftMetrics,
    selectors: &'a Arc<Selectors>,
    owned: &'a Gauge,
    cached_children: &'a Gauge,
}

impl Sharded<'_> {
    /// Runs the controllers on this replica's share of each ring the membership hands out,
    /// each ring with a client of its own, and returns on `shutdown` after in-flight
    /// reconciles finished.
    ///
    /// A new ring (the fence is already closed) ends the running one: its client's own fence
    /// closes for good, its controllers are cancelled and joined, and every write they sent is
    /// awaited ([`Fence::drained`]); only then is the membership told it stopped
    /// ([`Membership::stopped`]), so the acknowledgement of the new ring comes after the last
    /// write of the old one. The new controllers start, with new watches (and server-side
    /// selectors), once every member acknowledged it.
    ///
    /// `/readyz`: ready while waiting for a ring (as a standby is); while working, ready
    /// while every controller's caches are synced and their watches established (as a single
    /// replica); not ready for good when the membership refuses (another process renews this
    /// replica's Lease).
    async fn run(
        &self,
        membership: &Membership,
        shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) {
        use idem_runtime::shard::{ShardField, shard_hash};
        use kube::Resource as _;
        let mut assignments = membership.assignments();
        loop {
            let assignment = assignments.borrow_and_update().clone();
            if let Some(why) = assignment.refused {
                refuse(&why, self.ready, None, shutdown.as_mut()).await;
                return;
            }
            let Some(ring) = assignment.ring else {
                // Nothing of an earlier ring runs or writes any more.
                membership.stopped(assignment.seq);
                let _ = self.ready.send(true);
                tokio::select! {
                    changed = assignments.changed() => if changed.is_err() { return },
                    () = shutdown.as_mut() => return,
                }
                continue;
            };
            let seq = assignment.seq;
            let ranges = ring.ranges_of(self.identity);
            tracing::info!(
                members = ring.members().len(),
                share = ranges.share(),
                "starting the controllers on this replica's shard"
            );
            self.selectors.set(Some(ranges.clone()));
            // This ring's own fence, closed for good when it ends: nothing of this ring writes
            // once a later ring opens the membership's fence again.
            let gate = Fence::counting_into(FenceMode::ShardMembership, self.fence.refused.clone());
            gate.extend(std::time::Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600));
            let client = match fenced_client(
                self.config.clone(),
                Arc::clone(self.fence),
                Arc::clone(&gate),
                Arc::clone(self.selectors),
            ) {
                Ok(client) => client,
                Err(e) => {
                    tracing::error!(error = %e, "building the shard's client failed");
                    return;
                }
            };
            let (stop_tx, stop_rx) = watch::channel(false);
            let epoch = controllers(
                &client,
                self.identity,
                self.options,
                self.metrics,
                self.drift,
                Some((ranges.clone(), {
                    // No reconcile of this epoch starts once the ring changed, even before the
                    // controllers are dropped (the fence already refuses their writes).
                    let now = membership.assignments();
                    Arc::new(move || now.borrow().seq == seq) as CurrentFn
                })),
                stop_rx,
            );
            let Epoch {
                controllers,
                ns_watch,
                synced,
                tenants,
                caches,
            } = epoch;
            let mut controllers = tokio::spawn(controllers);
            let readiness = tokio::spawn(idem_runtime::controller::all_ready(
                vec![synced],
                self.ready.clone(),
            ));
            let owned = self.owned.clone();
            let cached_children = self.cached_children.clone();
            let counter = tokio::spawn(async move {
                loop {
                    let n = tenants
                        .state()
                        .iter()
                        .filter(|t| ranges.contains(shard_hash(t.meta(), ShardField::Uid)))
                        .count();
                    owned.set(n as i64);
                    cached_children.set(caches.objects() as i64);
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            });
            let changed = async {
                let _ = assignments.wait_for(|a| a.seq != seq).await;
            };
            let (done, joined) = tokio::select! {
                _ = &mut controllers => (true, true),
                () = changed => {
                    tracing::info!("shard ring changed: cancelling the controllers");
                    (false, false)
                }
                () = shutdown.as_mut() => {
                    tracing::info!("shutdown requested: finishing in-flight reconciles");
                    let _ = stop_tx.send(true);
                    let _ = (&mut controllers).await;
                    (true, true)
                }
            };
            // Nothing of this ring writes from now on; its reconciles are cancelled and
            // joined, its watches stopped, and the writes it sent before are awaited.
            gate.revoke();
            if !joined {
                controllers.abort();
                let _ = controllers.await;
            }
            ns_watch.abort();
            let _ = ns_watch.await;
            readiness.abort();
            counter.abort();
            if gate.writes_in_flight() > 0 {
                tracing::info!(
                    writes = gate.writes_in_flight(),
                    "waiting for the writes of the previous ring to end"
                );
            }
            gate.drained().await;
            tracing::info!("the controllers of the previous ring stopped");
            self.owned.set(0);
            self.cached_children.set(0);
            self.selectors.set(None);
            if done {
                return;
            }
        }
    }
}
