//! Deleting and re-installing the TenantApp CRD (an uninstall, a botched upgrade) never
//! deletes an app's ConfigMap, Deployment or Service: the garbage collector, once the CRD is
//! back, finds no owner to delete them for — nor a user's object the app owns without idem's
//! labels. In a test binary of its own: the CRD is deleted.

mod common;

use common::{TIMEOUT, apps, eventually, install_crds, shared_operator, tenants, why};
use idem_operator::resources::TenantApp;
use idem_operator::tenant_app::desired::config_map_name;
use idem_tests::{shared, unique_name};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{CustomResourceExt, ResourceExt};
use serde_json::json;

/// Checks that `meta` (of `what`) no longer refers to the uid `uid`.
fn assert_released(what: &str, meta: &ObjectMeta, uid: &str) {
    let refs = meta.owner_references.clone().unwrap_or_default();
    assert!(
        refs.iter().all(|r| r.uid != uid),
        "{what} still refers to the deleted TenantApp {uid}: {refs:?}"
    );
}

#[tokio::test]
async fn deleting_and_reinstalling_the_tenant_app_crd_keeps_every_app_child() {
    shared_operator().await;
    let client = shared().client();
    let ns = tenants::ready_apps_namespace(&client, "crdapp").await;
    apps::create(&client, &ns, "web", apps::spec(1, "greeting = 'hi'")).await;
    let uid = apps::wait_ready(&client, &ns, "web").await.uid().unwrap();
    // A user's ConfigMap the app owns (a plain ownerReference, no idem label): the garbage
    // collector would delete it with the app, so uninstalling must keep it too.
    let notes = json!({
        "metadata": {"name": "notes", "ownerReferences": [{
            "apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "TenantApp", "name": "web",
            "uid": uid,
        }]},
        "data": {"k": "precious"},
    });
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(notes).unwrap(),
        )
        .await
        .unwrap();

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(TenantApp::crd_name(), &DeleteParams::default())
        .await
        .unwrap();
    eventually("the TenantApp CRD gone", TIMEOUT, || async {
        match crds.get_opt(TenantApp::crd_name()).await.map_err(why)? {
            None => Ok(()),
            Some(crd) => Err(format!("{:?}", crd.status.and_then(|s| s.conditions))),
        }
    })
    .await;

    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let check = || async {
        let cm = config_maps.get(&config_map_name("web")).await.unwrap();
        assert_released("ConfigMap", &cm.metadata, &uid);
        let deployment = deployments.get("web").await.unwrap();
        assert_released("Deployment", &deployment.metadata, &uid);
        let service = services.get("web").await.unwrap();
        assert_released("Service", &service.metadata, &uid);
        let notes = config_maps
            .get_opt("notes")
            .await
            .unwrap()
            .expect("the user's ConfigMap owned by the app was deleted");
        assert_released("the user's ConfigMap", &notes.metadata, &uid);
    };
    check().await;
    let note = eventually("a Retained event on the app", TIMEOUT, || async {
        Api::<Event>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .map_err(why)?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("Retained")
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("TenantApp")
            })
            .and_then(|e| e.note)
            .ok_or_else(|| "none yet".to_string())
    })
    .await;
    assert!(note.contains("is being deleted"), "{note}");
    assert!(note.contains("Deployment/web"), "{note}");

    // Re-install the CRD. A canary whose owner is a TenantApp that does not exist is deleted
    // by the garbage collector once it knows the kind again: after that, the app's children
    // would have gone too, had they still referred to the deleted app.
    install_crds(&client).await;
    let canary = format!("canary-{}", unique_name("c"));
    let body = json!({
        "metadata": {"name": canary, "ownerReferences": [{
            "apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "TenantApp", "name": "ghost",
            "uid": "00000000-0000-0000-0000-000000000001", "controller": true,
        }]},
    });
    config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
    eventually(
        "the garbage collector deletes the canary",
        TIMEOUT,
        || async {
            match config_maps.get_opt(&canary).await.map_err(why)? {
                None => Ok(()),
                Some(_) => Err("still there".to_string()),
            }
        },
    )
    .await;
    check().await;
}
