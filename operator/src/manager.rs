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
use crate::shard::membership::{Membership, MembershipMetrics};
use crate::shard::selector::{SelectorLayer, Selectors};
use crate::{tenant, tenant_app};
use idem_runtime::http;
use idem_runtime::leader::{Fence, FenceLayer};

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
fn fenced_client(
    mut config: Config,
    fence: Arc<Fence>,
    selectors: Arc<Selectors>,
) -> anyhow::Result<Client> {
    config.default_retry = false;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&SelectorLayer(selectors))
        .with_layer(&FenceLayer::new(fence))
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
/// a Deployment is Ready; without it, while every controller's caches are synced and their
/// watches established (not while, e.g., the Tenant CRD is missing).
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
    let client = fenced_client(kube_config, Arc::clone(&fence), Arc::clone(&selectors))?;
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
        // A member waiting for a ring is ready, as a standby is.
        let _ = ready_tx.send(true);
        let sharded = Sharded {
            client: &client,
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

    if let Some(lease) = leadership.as_mut() {
        // A standby is ready: readiness does not depend on leadership.
        let _ = ready_tx.send(true);
        tokio::select! {
            acquired = lease.acquired() => {
                acquired?;
                tracing::info!(%identity, "became leader");
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
    tokio::spawn(async move {
        let _ = synced.wait_for(|s| *s).await;
        tracing::info!("all caches synced");
        // Not ready again while a watch is not established (e.g. the Tenant CRD deleted).
        idem_runtime::controller::all_ready(vec![synced], ready_tx).await;
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
        watcher(Api::<Namespace>::all(client.clone()), ns_config)
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
        tenant_app::source::controller(client, &ctx, config("tenantapp"), tenants.store())
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
    client: &'a Client,
    identity: &'a str,
    options: &'a ManagerOptions,
    metrics: &'a Metrics,
    drift: &'a idem_runtime::apply::DriftMetrics,
    selectors: &'a Selectors,
    owned: &'a Gauge,
    cached_children: &'a Gauge,
}

impl Sharded<'_> {
    /// Runs the controllers on this replica's share of each ring the membership hands out:
    /// a new ring cancels the running controllers at once (the fence is already closed) and
    /// starts new ones, with new watches (and server-side selectors), once every member
    /// acknowledged it. Returns on `shutdown`, after in-flight reconciles finished.
    async fn run(
        &self,
        membership: &Membership,
        shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) {
        use idem_runtime::shard::{ShardField, shard_hash};
        use kube::Resource as _;
        let mut assignments = membership.assignments();
        loop {
            let ring = tokio::select! {
                ring = assignments.wait_for(Option::is_some) => match ring {
                    Ok(ring) => ring.clone().unwrap_or_default(),
                    Err(_) => return,
                },
                () = shutdown.as_mut() => return,
            };
            let ranges = ring.ranges_of(self.identity);
            tracing::info!(
                members = ring.members().len(),
                share = ranges.share(),
                "starting the controllers on this replica's shard"
            );
            self.selectors.set(Some(ranges.clone()));
            let (stop_tx, stop_rx) = watch::channel(false);
            let epoch = controllers(
                self.client,
                self.identity,
                self.options,
                self.metrics,
                self.drift,
                Some((ranges.clone(), {
                    // No reconcile of this epoch starts once the ring changed, even before the
                    // controllers are dropped (the fence already refuses their writes).
                    let now = membership.assignments();
                    let ring = ring.clone();
                    Arc::new(move || now.borrow().as_ref() == Some(&ring)) as CurrentFn
                })),
                stop_rx,
            );
            let Epoch {
                mut controllers,
                ns_watch,
                tenants,
                caches,
                ..
            } = epoch;
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
                let _ = assignments.wait_for(|r| r.as_ref() != Some(&ring)).await;
            };
            let done = tokio::select! {
                _ = &mut controllers => true,
                () = changed => {
                    tracing::info!("shard ring changed: cancelling the controllers");
                    drop(controllers);
                    false
                }
                () = shutdown.as_mut() => {
                    tracing::info!("shutdown requested: finishing in-flight reconciles");
                    let _ = stop_tx.send(true);
                    let _ = controllers.await;
                    true
                }
            };
            counter.abort();
            self.owned.set(0);
            self.cached_children.set(0);
            ns_watch.abort();
            self.selectors.set(None);
            if done {
                return;
            }
        }
    }
}
