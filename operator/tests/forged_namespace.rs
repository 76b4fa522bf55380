//! A namespace that claims a Tenant by its label and by a controller ownerReference naming the
//! Tenant, but with another uid, is nobody's: the operator judges the reference by its uid, as
//! the garbage collector does. The collector deletes such a namespace (and the apps in it) soon
//! after; it is stopped here to hold that window open, in which the operator did take the
//! namespace for the named tenant's.
//!
//! Run: `cargo test -p idem-operator --test forged_namespace`.

mod common;

use common::{TIMEOUT, apps, controller_manager, eventually, shared_operator, tenants, why};
use idem_operator::resources::{FIELD_MANAGER, TENANT_LABEL, TenantApp};
use idem_runtime::apply::MANAGED_BY_LABEL;
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

/// Creates namespace `name` as an administrator would, labelled as tenant `tenant`'s and the
/// operator's, with a controller ownerReference to Tenant `tenant` carrying `uid`.
async fn claiming_namespace(client: &kube::Client, name: &str, tenant: &str, uid: &str) {
    let body = json!({"metadata": {
        "name": name,
        "labels": {TENANT_LABEL: tenant, MANAGED_BY_LABEL: FIELD_MANAGER},
        "ownerReferences": [{"apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "Tenant",
            "name": tenant, "uid": uid, "controller": true}],
    }});
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_whose_controller_reference_has_another_uid_names_no_tenant() {
    shared_operator().await;
    let client = shared().client();
    let tenant = unique_name("claimed");
    tenants::create(&client, &tenant, tenants::full_spec(&["a"])).await;
    let uid = tenants::wait_ready(&client, &tenant)
        .await
        .uid()
        .expect("a uid");

    let paused = controller_manager::stop();
    let forged = unique_name("forged-uid");
    let exact = unique_name("exact-uid");
    claiming_namespace(
        &client,
        &forged,
        &tenant,
        "00000000-0000-4000-8000-00000000dead",
    )
    .await;
    claiming_namespace(&client, &exact, &tenant, &uid).await;
    for ns in [&forged, &exact] {
        apps::create(&client, ns, "web", apps::spec(1, "c")).await;
    }

    let app =
        apps::wait_condition(&client, &forged, "web", "Stalled", "NotInTenantNamespace").await;
    let status = app.status.unwrap_or_default();
    let message = &(status.conditions.iter())
        .find(|c| c.type_ == "Stalled")
        .unwrap()
        .message;
    assert!(message.contains("no Tenant controls it"), "{message}");
    assert!(
        status.created_children.is_empty(),
        "the forged namespace's app made children: {:?}",
        status.created_children
    );

    // The same claim with the Tenant's own uid (what the garbage collector keeps) is the
    // tenant's: the app is judged and its children made, not stalled outside a tenant.
    let apps_api = Api::<TenantApp>::namespaced(client.clone(), &exact);
    let judged = eventually("the exact-uid app judged", TIMEOUT, || async {
        let app = apps_api.get("web").await.map_err(why)?;
        let status = app.status.clone().unwrap_or_default();
        let current = status.observed_generation == app.metadata.generation;
        if current && !status.conditions.is_empty() {
            Ok(status)
        } else {
            Err(format!("{status:?}"))
        }
    })
    .await;
    assert!(
        !judged
            .conditions
            .iter()
            .any(|c| c.reason == "NotInTenantNamespace"),
        "{judged:?}"
    );
    assert!(
        !judged.created_children.is_empty(),
        "the app made no children in its tenant's namespace: {judged:?}"
    );

    drop(paused);
    let namespaces = Api::<Namespace>::all(client.clone());
    for ns in [&forged, &exact] {
        let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    }
}
