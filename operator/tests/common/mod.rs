//! Helpers shared by the operator's end-to-end tests: CRD installation, an in-process operator
//! with its own tokio runtime (so it can be stopped gracefully or killed like a process),
//! reading its `/metrics`, and polling the real control plane until a condition holds.
//!
//! Each test binary uses a subset of these helpers, hence `dead_code` is allowed here.
#![allow(dead_code)]

pub mod apps;
pub mod controller_manager;
pub mod deployed;
pub mod process;
pub mod tenants;
pub mod users;

use std::fmt::Debug;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use idem_operator::resources;
use idem_runtime::manager::{ManagerError, ManagerOptions};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OnceCell, oneshot};

/// How long any wait in these tests may take before it fails: generous, because the machine
/// has two cores and other builds run beside the tests.
pub const TIMEOUT: Duration = Duration::from_secs(180);

/// How often [`eventually`] looks again.
pub const POLL: Duration = Duration::from_millis(250);

/// Polls `check` every [`POLL`] until it returns `Ok`, and returns that value.
///
/// `check` returns `Err(why)` while the condition does not hold yet; `why` (the last one seen)
/// is in the panic message.
///
/// # Panics
/// When `timeout` passes first, naming `what` and the last `why`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(why) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "timed out after {timeout:?} waiting for {what}; last state: {why}"
                );
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Turns any error into the `Err(String)` [`eventually`] expects.
pub fn why<E: Debug>(e: E) -> String {
    format!("{e:?}")
}

/// Installs (server-side applies) the operator's CRDs and waits until each is `Established`.
///
/// # Panics
/// When the API server rejects a CRD or it is not established within [`TIMEOUT`].
pub async fn install_crds(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply("idem-e2e").force();
    for crd in resources::crds() {
        let name = crd.metadata.name.clone().expect("CRDs are named");
        crds.patch(&name, &pp, &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("installing CRD {name}: {e}"));
        eventually(&format!("CRD {name} Established"), TIMEOUT, || async {
            let got = crds.get(&name).await.map_err(why)?;
            let conditions = got.status.and_then(|s| s.conditions).unwrap_or_default();
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
                .ok_or_else(|| format!("{conditions:?}"))
        })
        .await;
    }
}

pub use idem_tests::ports::free_addr;

/// Sends `GET path` to `addr` and returns `(status code, body)`.
///
/// # Errors
/// When the connection fails or the reply is not HTTP.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.map_err(why)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(why)?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.map_err(why)?;
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not HTTP: {reply:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((code, body.to_string()))
}

/// Sum of `controller_runtime_reconcile_total` for `controller` (every result) in the text of
/// an operator's `/metrics`.
pub fn reconciles_in(metrics: &str, controller: &str) -> u64 {
    let label = format!("controller=\"{controller}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("controller_runtime_reconcile_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The idem operator, run in-process by its manager's `run_until` on a tokio runtime of its own, so
/// that [`Operator::kill`] can drop everything it runs at once, like a killed process.
pub struct Operator {
    /// Where it serves `/metrics`, `/healthz` and `/readyz`.
    pub addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    task: Option<tokio::task::JoinHandle<Result<(), ManagerError>>>,
    stop: Option<oneshot::Sender<()>>,
}

impl Operator {
    /// Starts an operator (see [`Operator::spawn`]) and waits until `/readyz` says its caches
    /// are synced.
    ///
    /// # Panics
    /// When it exits or is not ready within [`TIMEOUT`].
    pub async fn start(resync_period: Duration) -> Self {
        Self::start_with(resync_period, None).await
    }

    /// [`Operator::start`] with optional leader election (see [`Operator::spawn_with`]).
    pub async fn start_with(resync_period: Duration, lease: Option<(&str, &str)>) -> Self {
        let mut operator = Self::spawn_with(resync_period, lease);
        operator.wait_ready().await;
        operator
    }

    /// Starts an operator against the shared control plane with two workers, the given
    /// anti-entropy `resync_period`, and no leader election; returns at once.
    pub fn spawn(resync_period: Duration) -> Self {
        Self::spawn_with(resync_period, None)
    }

    /// [`Operator::spawn`], with leader election on a Lease in namespace `lease.0` as identity
    /// `lease.1` when `lease` is given.
    pub fn spawn_with(resync_period: Duration, lease: Option<(&str, &str)>) -> Self {
        Self::spawn_configured(resync_period, lease, |_| {})
    }

    /// [`Operator::spawn_with`], with `configure` changing the options before it starts.
    pub fn spawn_configured(
        resync_period: Duration,
        lease: Option<(&str, &str)>,
        configure: impl FnOnce(&mut ManagerOptions),
    ) -> Self {
        let addr = free_addr();
        let mut options = ManagerOptions {
            kubeconfig: Some(idem_tests::shared().kubeconfig_path().to_path_buf()),
            workers: 2,
            tenant_concurrency: 1,
            resync_period,
            metrics_addr: addr,
            health_addr: addr,
            leader_elect: lease.is_some(),
            leader_elect_namespace: lease.map(|(ns, _)| ns.to_string()),
            identity: Some(lease.map_or_else(
                || format!("e2e-{}", std::process::id()),
                |(_, id)| id.to_string(),
            )),
            shutdown_grace: Duration::from_secs(10),
            shards: false,
            ..ManagerOptions::default()
        };
        configure(&mut options);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("operator")
            .enable_all()
            .build()
            .expect("an operator runtime");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = runtime.spawn(idem_operator::manager(options).run_until(async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            runtime: Some(runtime),
            task: Some(task),
            stop: Some(stop),
        }
    }

    /// Waits until `/readyz` answers 200 (caches synced; with leader election a standby is
    /// ready too, see `idem_runtime::manager::Manager::run_until`).
    pub async fn wait_ready(&mut self) {
        let addr = self.addr;
        let task = self.task.as_ref().expect("running");
        eventually("the operator's /readyz", TIMEOUT, || async {
            assert!(!task.is_finished(), "the operator exited while starting");
            match http_get(addr, "/readyz").await? {
                (200, _) => Ok(()),
                (code, body) => Err(format!("{code} {body}")),
            }
        })
        .await;
    }

    /// The text of its `/metrics`.
    ///
    /// # Panics
    /// When it does not answer 200.
    pub async fn metrics(&self) -> String {
        match http_get(self.addr, "/metrics").await {
            Ok((200, body)) => body,
            other => panic!("operator /metrics: {other:?}"),
        }
    }

    /// Reconciles made so far by `controller` (`tenant` or `tenantapp`), from its `/metrics`.
    pub async fn reconciles(&self, controller: &str) -> u64 {
        reconciles_in(&self.metrics().await, controller)
    }

    /// Graceful shutdown: resolves the shutdown future and waits for `run` to return `Ok`.
    ///
    /// # Panics
    /// When `run` fails or does not return within [`TIMEOUT`].
    pub async fn stop(mut self) {
        let _ = self.stop.take().expect("running").send(());
        let task = self.task.take().expect("running");
        let result = tokio::time::timeout(TIMEOUT, task)
            .await
            .expect("the operator stops within the timeout")
            .expect("the operator task does not panic");
        result.expect("the operator stops cleanly");
    }

    /// Abrupt stop: drops every task of the operator's runtime mid-flight, as if the process
    /// were killed (in-flight requests are cut, nothing is cleaned up).
    pub fn kill(mut self) {
        self.task.take();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The one operator of this test binary (with a 10 min resync), started on first use after
/// the CRDs are installed; it lives as long as the binary. Tests that need to stop, kill or
/// count the operator's work start their own [`Operator`] in a binary of their own instead.
pub async fn shared_operator() -> &'static Operator {
    static OPERATOR: OnceCell<Operator> = OnceCell::const_new();
    OPERATOR
        .get_or_init(|| async {
            install_crds(&idem_tests::shared().client()).await;
            // As deployed: only the operator, once a cleanup is marked done, removes a
            // Tenant's (or TenantApp's) finalizer, so every deletion path is tried under it.
            deployed::apply_manifest("08-cleanup-guard");
            Operator::start(Duration::from_secs(600)).await
        })
        .await
}
