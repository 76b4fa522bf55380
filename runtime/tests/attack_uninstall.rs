//! What an uninstall does to the users of the example `BaseTenant`
//! (runtime/examples/base_tenant.rs), the README's "adding a resource", run by its `Manager`:
//! a careless admin deletes the CRD while BaseTenants exist. The namespaces the BaseTenants
//! made hold their users' data (here a ConfigMap a user wrote); an uninstall must delete none
//! of it (README: the retention protocol keeps children when the CRD is being deleted).
//!
//! In a test binary of its own: the CRD is deleted.

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;

use std::time::Duration;

use base_tenant::{BaseTenant, BaseTenants};
use idem_runtime::manager::{Manager, ManagerOptions, Reconciles};
use idem_tests::ports::free_addr;
use idem_tests::{eventually, shared};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, CustomResourceExt};
use serde_json::json;
use tokio::sync::oneshot;

const TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_base_tenant_crd_deletes_no_users_data() {
    let client = shared().client();
    base_tenant::install_crd(&client).await.expect("install");
    let options = ManagerOptions {
        kubeconfig: Some(shared().kubeconfig_path().to_path_buf()),
        metrics_addr: free_addr(),
        health_addr: free_addr(),
        ..ManagerOptions::default()
    };
    let manager = Manager::new("base-tenant", options).add(Reconciles::new(BaseTenants));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(manager.run_until(async move {
        let _ = stopped.await;
    }));

    let name = idem_tests::unique_name("uninstall");
    let tenants: Api<BaseTenant> = Api::all(client.clone());
    let spec = json!({"owners": ["alice"], "cpu": "1", "memory": "1Gi"});
    tenants
        .create(
            &PostParams::default(),
            &BaseTenant::new(&name, serde_json::from_value(spec).unwrap()),
        )
        .await
        .expect("create the BaseTenant");
    eventually("the BaseTenant Ready", || async {
        let t = tenants.get(&name).await.map_err(|e| e.to_string())?;
        let status = t.status.clone().unwrap_or_default();
        let ready = (status.conditions.iter()).any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(()).ok_or(format!("{status:?}"))
    })
    .await;
    // A user's data in the tenant's namespace.
    let data: Api<ConfigMap> = Api::namespaced(client.clone(), &name);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "orders"}, "data": {"1": "a user's order"},
    }))
    .unwrap();
    data.create(&PostParams::default(), &cm)
        .await
        .expect("the user's ConfigMap");

    // The careless admin: the CRD goes, and with it every BaseTenant.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(BaseTenant::crd_name(), &DeleteParams::default())
        .await
        .expect("delete the CRD");
    eventually("the CRD gone", || async {
        match crds.get_opt(BaseTenant::crd_name()).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Every BaseTenant is gone with its CRD. What is left must not be the garbage
    // collector's to delete: a child still referring to the deleted BaseTenant's uid is
    // deleted by the collector once the kind resolves again (the CRD installed again, an
    // upgrade), with the user's data in it (see `idem_runtime::reconciler::retention`).
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = namespaces.get_opt(&name).await.expect("get the namespace");
    let _ = stop.send(());
    let _ = tokio::time::timeout(TIMEOUT, task).await;
    let left = ns.as_ref().map(|n| {
        let refs: Vec<String> = (n.metadata.owner_references.iter().flatten())
            .filter(|r| r.kind == "BaseTenant")
            .map(|r| format!("{} {} (uid {})", r.kind, r.name, r.uid))
            .collect();
        (n.metadata.deletion_timestamp.is_some(), refs)
    });
    assert_eq!(
        left,
        Some((false, Vec::new())),
        "after the BaseTenant CRD is deleted the tenant's namespace (and the user's data in it) \
         is (deleting, still owned by the deleted BaseTenant): the garbage collector's to delete"
    );
    assert!(data.get_opt("orders").await.expect("get").is_some());
}
