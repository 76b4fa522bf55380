//! Deleting the Tenant CRD (an uninstall, a botched upgrade) never deletes tenant namespaces or
//! the user data in them, even for a tenant whose `deletionPolicy` is `Delete`; meanwhile the
//! operator is not ready (`/readyz` 503) and its log names the missing CRD once, and it is ready
//! again once the CRD is back. In a test binary of its own: the CRD is deleted and installed
//! again.

mod common;

use common::{TIMEOUT, eventually, http_get, install_crds, shared_operator, tenants, why};
use idem_operator::resources::Tenant;
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{CustomResourceExt, ResourceExt};
use serde_json::json;

#[tokio::test]
async fn deleting_the_tenant_crd_keeps_every_tenant_namespace_and_the_data_in_it() {
    // The log lines (ERROR and above) of every thread of this test binary.
    let (subscriber, errors) = idem_tests::logs::subscriber(tracing::Level::ERROR);
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let operator = shared_operator().await;
    let client = shared().client();
    let doomed = unique_name("crd");
    let retained = unique_name("crdr");
    // Even the tenant that asked for its namespaces to be deleted with it keeps them.
    tenants::create(&client, &doomed, tenants::full_spec(&["a", "b"])).await;
    let mut spec = tenants::full_spec(&["a"]);
    spec.deletion_policy = idem_operator::resources::tenant::DeletionPolicy::Retain;
    tenants::create(&client, &retained, spec).await;
    let uids = [
        (
            doomed.clone(),
            tenants::wait_ready(&client, &doomed).await.uid().unwrap(),
        ),
        (
            retained.clone(),
            tenants::wait_ready(&client, &retained).await.uid().unwrap(),
        ),
    ];
    let data_ns = format!("{doomed}-a");
    Api::<ConfigMap>::namespaced(client.clone(), &data_ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "data"}, "data": {"k": "precious"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(Tenant::crd_name(), &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Tenant CRD gone", TIMEOUT, || async {
        match crds.get_opt(Tenant::crd_name()).await.map_err(why)? {
            None => Ok(()),
            Some(crd) => Err(format!("{:?}", crd.status.and_then(|s| s.conditions))),
        }
    })
    .await;

    for (tenant, uid) in &uids {
        let shorts: &[&str] = if tenant == &doomed {
            &["a", "b"]
        } else {
            &["a"]
        };
        for short in shorts {
            tenants::assert_retained(&client, &format!("{tenant}-{short}"), uid).await;
        }
        let note = tenants::wait_retained_note(&client, tenant, &format!("{tenant}-a")).await;
        assert!(note.contains("is being deleted"), "{note}");
    }
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &data_ns)
        .get_opt("data")
        .await
        .unwrap()
        .expect("the user's ConfigMap survives");
    assert_eq!(cm.data.unwrap_or_default()["k"], "precious");

    // Without the CRD the Tenant watch cannot be established: the operator is not ready
    // (controller-runtime: ready once the caches have synced; this cache cannot list).
    let addr = operator.addr;
    eventually(
        "/readyz to fail while the Tenant CRD is missing",
        TIMEOUT,
        || async {
            match http_get(addr, "/readyz").await? {
                (503, _) => Ok(()),
                (code, body) => Err(format!("{code} {body}")),
            }
        },
    )
    .await;
    // The log names the CRD, once however often the watch retries.
    let missing = format!(
        "its CustomResourceDefinition {} is not installed, or was deleted",
        Tenant::crd_name()
    );
    let said = || errors.text().matches(&missing).count();
    eventually("the log to name the missing CRD", TIMEOUT, || async {
        match said() {
            0 => Err(errors.text()),
            _ => Ok(()),
        }
    })
    .await;
    // Installed again, the watch lists again and the operator is ready again.
    install_crds(&client).await;
    eventually("/readyz to pass once the CRD is back", TIMEOUT, || async {
        match http_get(addr, "/readyz").await? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await;
    assert_eq!(said(), 1, "said once while the CRD was missing");
}
