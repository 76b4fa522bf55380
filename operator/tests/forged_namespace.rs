//! A namespace that claims a Tenant by its label and a controller ownerReference to it is
//! nobody's unless the Tenant made it: its record of what it created (in its status, which
//! only the operator writes) must hold the namespace's uid. So neither a reference with another
//! uid (which the garbage collector deletes soon after; it is stopped here to hold that window
//! open) nor one with the Tenant's own uid (which it keeps: the uid is on every namespace of
//! the Tenant) makes a namespace the Tenant's; the Tenant's own namespace is. Such a namespace's
//! apps wait for it in the Tenant's record for `RECORD_WAIT` (2 minutes) after its creation,
//! which this test waits out.
//!
//! Run: `cargo test -p idem-operator --test forged_namespace`.

mod common;

use common::{TIMEOUT, apps, controller_manager, eventually, shared_operator, tenants, why};
use idem_operator::resources::{FIELD_MANAGER, TENANT_LABEL, TenantApp, TenantAppStatus};
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

/// Waits until app `web` in `ns` has a status for its generation with a condition, and
/// returns it.
async fn judged(client: &kube::Client, ns: &str) -> TenantAppStatus {
    let apps_api = Api::<TenantApp>::namespaced(client.clone(), ns);
    eventually(&format!("the app in {ns} judged"), TIMEOUT, || async {
        let app = apps_api.get("web").await.map_err(why)?;
        let status = app.status.clone().unwrap_or_default();
        let current = status.observed_generation == app.metadata.generation;
        if current && !status.conditions.is_empty() {
            Ok(status)
        } else {
            Err(format!("{status:?}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_its_tenant_did_not_create_names_no_tenant_whatever_its_reference() {
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
    let own = format!("{tenant}-a");
    for ns in [&forged, &exact, &own] {
        apps::create(&client, ns, "web", apps::spec(1, "c")).await;
    }

    // Waited for (it may be a namespace the Tenant has just made, its record not here yet),
    // then, once older than RECORD_WAIT, not in a tenant namespace; nothing made meanwhile.
    for ns in [&forged, &exact] {
        let app = apps::wait_condition(&client, ns, "web", "Reconciling", "WaitingForTenant").await;
        let status = app.status.unwrap_or_default();
        assert!(status.created_children.is_empty(), "{ns}: {status:?}");
    }
    for ns in [&forged, &exact] {
        let app = apps::wait_condition(&client, ns, "web", "Stalled", "NotInTenantNamespace").await;
        let status = app.status.unwrap_or_default();
        let message = &(status.conditions.iter())
            .find(|c| c.type_ == "Stalled")
            .unwrap()
            .message;
        assert!(message.contains("did not create it"), "{ns}: {message}");
        assert!(
            status.created_children.is_empty(),
            "the app in {ns} made children: {:?}",
            status.created_children
        );
    }

    // The Tenant's own namespace is its: the app is judged and its children made.
    let status = judged(&client, &own).await;
    assert!(
        !(status.conditions.iter())
            .any(|c| c.reason == "NotInTenantNamespace" || c.reason == "ReconcileFailed"),
        "{status:?}"
    );
    assert!(
        !status.created_children.is_empty(),
        "the app made no children in its tenant's namespace: {status:?}"
    );

    drop(paused);
    let namespaces = Api::<Namespace>::all(client.clone());
    for ns in [&forged, &exact] {
        let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    }
}
