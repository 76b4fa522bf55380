//! `Reconciles::configure` and `Reconciles::with_driver_config` under a `Manager`, against the
//! real control plane: what the closure sets on the controller's `ControllerConfig` is what the
//! controller runs with (here its name and its number of workers, both visible in the
//! metrics), not replaced by the manager's options afterwards; the driver's tunables are the
//! ones given.

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;

use std::net::SocketAddr;
use std::time::Duration;

use base_tenant::{BaseTenant, BaseTenantSpec, BaseTenants};
use idem_runtime::manager::{Manager, ManagerError, ManagerOptions, Reconciles};
use idem_runtime::reconciler::DriverConfig;
use idem_tests::ports::free_addr;
use idem_tests::{shared, unique_name};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Held by each test for its whole run: a manager reconciles every BaseTenant of the cluster,
/// so one test's manager would make the other's BaseTenant Ready (or Stalled) meanwhile.
static ONE_MANAGER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Longest wait for any condition (two cores, other builds beside the tests).
const TIMEOUT: Duration = Duration::from_secs(180);

/// The value of `series` (name and labels, as printed) in a `/metrics` text.
fn value(metrics: &str, series: &str) -> Option<f64> {
    (metrics.lines())
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn ready(t: &BaseTenant) -> bool {
    t.status.as_ref().is_some_and(|s| {
        s.observed_generation == t.metadata.generation
            && (s.conditions.iter()).any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// A manager of BaseTenants running on the shared control plane, with one BaseTenant of its
/// own.
struct Run {
    addr: SocketAddr,
    tenants: Api<BaseTenant>,
    tenant: String,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), ManagerError>>,
}

impl Run {
    /// Starts a manager named from `prefix` with `reconciles` and `options` (its addresses and
    /// kubeconfig filled in), then creates a BaseTenant.
    async fn start(
        prefix: &str,
        options: ManagerOptions,
        reconciles: Reconciles<BaseTenants>,
    ) -> Self {
        let client = shared().client();
        base_tenant::install_crd(&client).await.unwrap();
        let addr = free_addr();
        let options = ManagerOptions {
            kubeconfig: Some(shared().kubeconfig_path().to_path_buf()),
            metrics_addr: addr,
            health_addr: addr,
            shutdown_grace: Duration::from_secs(10),
            ..options
        };
        let manager = Manager::new(unique_name(prefix), options).add(reconciles);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(manager.run_until(async move {
            let _ = stopped.await;
        }));
        let tenants = Api::<BaseTenant>::all(client);
        let tenant = unique_name(prefix);
        let spec = BaseTenantSpec {
            owners: vec!["alice".into()],
            cpu: "1".into(),
            memory: "1Gi".into(),
        };
        tenants
            .create(&PostParams::default(), &BaseTenant::new(&tenant, spec))
            .await
            .unwrap();
        Self {
            addr,
            tenants,
            tenant,
            stop,
            task,
        }
    }

    /// Stops the manager and deletes the BaseTenant.
    async fn stop(self) {
        let _ = self.stop.send(());
        let result = tokio::time::timeout(TIMEOUT, self.task).await;
        result.expect("stops in time").expect("no panic").unwrap();
        self.tenants
            .delete(&self.tenant, &DeleteParams::default())
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_configure_sets_on_the_controller_config_is_what_the_controller_runs_with() {
    let _alone = ONE_MANAGER.lock().await;
    let options = ManagerOptions {
        workers: 2,
        tenant_concurrency: 2,
        resync_period: Duration::from_secs(1_234),
        ..ManagerOptions::default()
    };
    let reconciles = Reconciles::new(BaseTenants).configure(|controller| {
        let mut config = controller.config().clone();
        // The manager's options are in place when the closure runs.
        let options = (
            config.workers,
            config.per_tenant_cap,
            config.resync_period,
            config.shutdown_grace,
        );
        let expected = (
            2,
            Some(2),
            Duration::from_secs(1_234),
            Duration::from_secs(10),
        );
        assert_eq!(options, expected, "the manager's options");
        config.name = Some("configured".into());
        config.workers = 3;
        controller.with_config(config)
    });
    let run = Run::start("configure", options, reconciles).await;
    let workers = r#"controller_runtime_max_concurrent_reconciles{controller="configured"}"#;
    let reconciled =
        r#"controller_runtime_reconcile_total{controller="configured",result="success"}"#;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        assert!(!run.task.is_finished(), "the manager exited");
        let converged = run.tenants.get(&run.tenant).await.is_ok_and(|t| ready(&t));
        let text = idem_tests::metrics::scrape(run.addr)
            .await
            .unwrap_or_default();
        // Counted after the reconcile that wrote the status returns: read until it is.
        if converged && value(&text, reconciled).is_some_and(|n| n >= 1.0) {
            assert_eq!(value(&text, workers), Some(3.0), "{text}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "BaseTenant {} not Ready and counted under the configured name within \
             {TIMEOUT:?}:\n{text}",
            run.tenant
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_config_given_is_the_one_the_manager_runs() {
    let _alone = ONE_MANAGER.lock().await;
    // No pass can finish within a zero timeout, and one failure stalls: the default (two
    // minutes, five failures) would make the tenant Ready instead.
    let reconciles = Reconciles::new(BaseTenants).with_driver_config(DriverConfig {
        stalled_after: 1,
        timeout: Some(Duration::ZERO),
        ..DriverConfig::default()
    });
    let options = ManagerOptions {
        workers: 2,
        ..ManagerOptions::default()
    };
    let run = Run::start("driver", options, reconciles).await;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        assert!(!run.task.is_finished(), "the manager exited");
        let tenant = run.tenants.get(&run.tenant).await.unwrap();
        let stalled = (tenant.status.as_ref()).and_then(|s| {
            (s.conditions.iter()).find(|c| c.type_ == "Stalled" && c.status == "True")
        });
        if let Some(c) = stalled {
            assert_eq!(c.reason, "ReconcileFailed", "{c:?}");
            break;
        }
        assert!(
            !ready(&tenant),
            "Ready: the driver's timeout was not applied"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "BaseTenant {} not Stalled within {TIMEOUT:?}: {:?}",
            run.tenant,
            tenant.status
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    run.stop().await;
}
