//! Against the real control plane: the watch of a blocking object. The example `BaseTenant`
//! (runtime/examples/base_tenant.rs) run by the [`Driver`] finds its RoleBinding's name taken
//! by someone's own binding (`ChildNotOwned`); the controller watches that one object, the
//! watch ends when the controller stops (a new run starts its own), and the binding's deletion
//! brings the owner back without a resync or a poll.

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;

use std::time::Duration;

use base_tenant::{BaseTenant, BaseTenantSpec, BaseTenants};
use idem_runtime::controller::ControllerConfig;
use idem_runtime::metrics::Metrics;
use idem_runtime::queue::ShutdownReport;
use idem_runtime::reconciler::Driver;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, ResourceExt};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Generous: a loaded two-core machine.
const WAIT: Duration = Duration::from_secs(120);

/// A running controller of BaseTenants (resync off: only watches bring an owner back).
struct Running {
    stop: oneshot::Sender<()>,
    run: JoinHandle<Result<ShutdownReport, idem_runtime::controller::ControllerError>>,
}

fn start(client: &Client, metrics: &Metrics) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = base_tenant::controller(client)
        .with_config(ControllerConfig {
            resync_period: Duration::ZERO,
            ..ControllerConfig::default()
        })
        .with_metrics(metrics.clone());
    let run = tokio::spawn(
        Driver::new(client.clone(), BaseTenants).run(controller, async {
            let _ = stopped.await;
        }),
    );
    Running { stop, run }
}

impl Running {
    async fn stop(self) {
        self.stop.send(()).unwrap();
        let report = self.run.await.unwrap().expect("run");
        assert!(report.drained(), "{report:?}");
    }
}

/// The `Ready` condition's (status, reason) of BaseTenant `name`.
async fn ready(client: &Client, name: &str) -> Option<(String, String)> {
    let t = Api::<BaseTenant>::all(client.clone())
        .get(name)
        .await
        .ok()?;
    let c = t
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status, c.reason))
}

async fn wait<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match done().await {
            Ok(()) => return,
            Err(last) => assert!(
                tokio::time::Instant::now() < deadline,
                "waited {WAIT:?} for {what}; last: {last}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_ready(client: &Client, name: &str, want: (&str, &str)) {
    wait(&format!("Ready={want:?}"), || async {
        match ready(client, name).await {
            Some((s, r)) if (s.as_str(), r.as_str()) == want => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

async fn wait_gauge(gauge: &Gauge, want: i64) {
    wait(&format!("{want} blocked-object watches"), || async {
        match gauge.get() {
            n if n == want => Ok(()),
            n => Err(format!("{n}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_blocking_object_is_watched_while_the_controller_runs_and_its_deletion_brings_the_owner_back()
 {
    let client = idem_tests::shared().client();
    base_tenant::install_crd(&client)
        .await
        .expect("install the CRD");
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let gauge = metrics.blocked_watches("basetenant");
    let name = idem_tests::unique_name("bt-blocked");
    let tenants: Api<BaseTenant> = Api::all(client.clone());
    let spec = BaseTenantSpec {
        owners: vec!["erin".into()],
        cpu: "1".into(),
        memory: "1Gi".into(),
    };
    let running = start(&client, &metrics);
    tenants
        .create(&PostParams::default(), &BaseTenant::new(&name, spec))
        .await
        .unwrap();
    wait_ready(&client, &name, ("True", "Reconciled")).await;
    running.stop().await;

    // While no controller runs, the owners binding is replaced by someone's own, without the
    // managed-by label (the child watches do not see it).
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &name);
    bindings
        .delete("owners", &DeleteParams::default())
        .await
        .unwrap();
    wait("the binding gone", || async {
        match bindings.get_opt("owners").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let foreign: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "owners"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "erin"}],
    }))
    .unwrap();
    bindings
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();

    let running = start(&client, &metrics);
    wait_ready(&client, &name, ("False", "ChildNotOwned")).await;
    wait_gauge(&gauge, 1).await;
    // The watch is the controller's: it ends when the controller stops.
    running.stop().await;
    wait_gauge(&gauge, 0).await;

    let running = start(&client, &metrics);
    wait_gauge(&gauge, 1).await;
    bindings
        .delete("owners", &DeleteParams::default())
        .await
        .unwrap();
    // No resync, no poll: only the watch of the blocking object brings the owner back.
    wait_ready(&client, &name, ("True", "Reconciled")).await;
    let ours = bindings.get("owners").await.unwrap();
    assert_eq!(ours.role_ref.name, "edit", "the owner's binding is back");
    assert!(
        ours.labels()
            .contains_key(idem_runtime::apply::MANAGED_BY_LABEL)
    );
    wait_gauge(&gauge, 0).await;
    running.stop().await;
}
