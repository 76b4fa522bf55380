//! A manager's watches start with streaming lists on the real control plane: the example's
//! `BaseTenant` manager (runtime/examples/base_tenant.rs), started beside a Ready BaseTenant,
//! sends no LIST of its kind or of any child kind (the API server's own counts): each watch
//! starts with the objects (`sendInitialEvents`), as client-go's informers do.

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;

use std::time::Duration;

use base_tenant::{BaseTenant, BaseTenantSpec, BaseTenants};
use idem_runtime::manager::{Manager, ManagerOptions, Reconciles};
use idem_tests::metrics::requests;
use idem_tests::ports::free_addr;
use idem_tests::{eventually, shared, unique_name};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::oneshot;

const TIMEOUT: Duration = Duration::from_secs(120);

/// The kinds the example's manager watches: (API group, plural).
const WATCHED: [(&str, &str); 5] = [
    ("example.idem.dev", "basetenants"),
    ("", "namespaces"),
    ("", "resourcequotas"),
    ("", "limitranges"),
    ("rbac.authorization.k8s.io", "rolebindings"),
];

/// Runs the example's manager until its BaseTenant `name` is Ready (it installs the CRD) and
/// returns once it stopped.
async fn run_until_ready(name: &str) {
    let options = ManagerOptions {
        kubeconfig: Some(shared().kubeconfig_path().to_path_buf()),
        metrics_addr: free_addr(),
        health_addr: free_addr(),
        ..ManagerOptions::default()
    };
    let manager = Manager::new("base-tenant", options)
        .add(Reconciles::new(BaseTenants))
        .installing_crds();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(manager.run_until(async move {
        let _ = stopped.await;
    }));
    let tenants: Api<BaseTenant> = Api::all(shared().client());
    eventually("the BaseTenant Ready", || async {
        let t = tenants.get(name).await.map_err(|e| e.to_string())?;
        let status = t.status.clone().unwrap_or_default();
        let ready = (status.conditions.iter()).any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(()).ok_or(format!("{status:?}"))
    })
    .await;
    let _ = stop.send(());
    let stopped = tokio::time::timeout(TIMEOUT, task).await;
    stopped.expect("stops in time").expect("no panic").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managers_watches_start_without_a_list() {
    let client = shared().client();
    base_tenant::install_crd(&client).await.expect("install");
    let name = unique_name("lists");
    let spec = BaseTenantSpec {
        owners: vec!["alice".into()],
        cpu: "1".into(),
        memory: "1Gi".into(),
    };
    Api::<BaseTenant>::all(client.clone())
        .create(&PostParams::default(), &BaseTenant::new(&name, spec))
        .await
        .expect("create the BaseTenant");
    // A first run makes the children; the second starts on them (a restart).
    for run in ["first", "restart"] {
        let before = shared().metrics().await.expect("metrics");
        run_until_ready(&name).await;
        let after = shared().metrics().await.expect("metrics");
        for (group, plural) in WATCHED {
            let lists =
                requests(&after, "LIST", group, plural) - requests(&before, "LIST", group, plural);
            assert_eq!(lists, 0, "{run}: LIST {plural}");
        }
    }
}
