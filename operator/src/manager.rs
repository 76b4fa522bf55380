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
use k8s_openapi::api::core::v1::Namespace;
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Config};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::context::Context;
use crate::fence::FenceLayer;
use crate::leader::{Fence, Leadership};
use crate::resources::FIELD_MANAGER;
use crate::{http, tenant, tenant_app};

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
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

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

/// A client whose writes pass only while `fence` is valid ([`crate::fence`]), with the
/// operator's retry of transient failures ([`crate::client`]: a `POST` only on 429) outside
/// the fence, so every attempt is fenced.
fn fenced_client(mut config: Config, fence: Arc<Fence>) -> anyhow::Result<Client> {
    config.default_retry = false;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&FenceLayer::new(fence))
        .with_layer(&tower::buffer::BufferLayer::new(1024))
        .with_layer(&tower::retry::RetryLayer::new(
            crate::client::IdempotentRetry::default(),
        ))
        .build())
}

fn identity(options: &ManagerOptions) -> String {
    options.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    })
}

/// Runs both controllers until `shutdown` resolves, then shuts down gracefully; or until
/// leadership is lost, then cancels every reconcile at once and returns an error.
///
/// `/readyz` does not depend on leadership (controller-runtime's convention): with
/// `leader_elect` a standby is ready once it takes part in the election, so every replica of
/// a Deployment is Ready; without it, once every controller's caches have synced.
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
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let drift = idem_runtime::apply::DriftMetrics::new(&mut registry);
    let leader_status = Gauge::default();
    let identity = identity(&options);
    let mut leadership = options.leader_elect.then(|| {
        let ns = options
            .leader_elect_namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        tracing::info!(%identity, namespace = %ns, "waiting to become leader");
        Leadership::start(lease_client, &ns, &identity, leader_status.clone())
    });
    let fence = leadership
        .as_ref()
        .map_or_else(Fence::open, Leadership::fence);
    if leadership.is_none() {
        leader_status.set(1);
    }
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
    let client = fenced_client(kube_config, Arc::clone(&fence))?;
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

    if let Some(lease) = leadership.as_mut() {
        // A standby is ready: readiness does not depend on leadership.
        let _ = ready_tx.send(true);
        tokio::select! {
            () = lease.acquired() => tracing::info!(%identity, "became leader"),
            () = &mut shutdown => {
                if let Some(lease) = leadership.take() {
                    lease.release().await;
                }
                let _ = stop_tx.send(true);
                return Ok(());
            }
        }
    }

    // The operator's namespaces, cached, to find a TenantApp's tenant without an API call.
    let (store, writer) = reflector::store::<Namespace>();
    let ns_config =
        watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}"));
    let ns_watch = tokio::spawn(
        watcher(Api::<Namespace>::all(client.clone()), ns_config)
            .default_backoff()
            .reflect(writer)
            .for_each(|_| futures::future::ready(())),
    );
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(identity.clone()),
        },
    );
    let ctx = Context::new(client.clone(), recorder, store, drift);
    let config = |name: &str| ControllerConfig {
        name: Some(name.into()),
        workers: options.workers,
        per_tenant_cap: (options.tenant_concurrency > 0).then_some(options.tenant_concurrency),
        resync_period: options.resync_period,
        shutdown_grace: options.shutdown_grace,
        ..ControllerConfig::default()
    };
    let (tenant_synced, mut tenant_ready) = watch::channel(false);
    let (app_synced, mut app_ready) = watch::channel(false);
    let tenants = tenant::source::controller(&client, config("tenant"))
        .with_child_caches(ctx.caches.clone())
        .with_metrics(metrics.clone())
        .with_synced_signal(tenant_synced);
    let apps = tenant_app::source::controller(&client, &ctx, config("tenantapp"), tenants.store())
        .with_child_caches(ctx.caches.clone())
        .with_metrics(metrics)
        .with_synced_signal(app_synced);
    tokio::spawn(async move {
        let _ = tenant_ready.wait_for(|s| *s).await;
        let _ = app_ready.wait_for(|s| *s).await;
        let _ = ready_tx.send(true);
        tracing::info!("all caches synced");
    });

    let stopping = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut controllers = Box::pin(futures::future::join(
        tenants.run(
            tenant::reconcile::reconcile,
            Arc::clone(&ctx),
            stopping(stop_rx.clone()),
        ),
        apps.run(
            tenant_app::reconcile::reconcile,
            Arc::clone(&ctx),
            stopping(stop_rx.clone()),
        ),
    ));
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
