//! TenantApp against the real control plane (kube-scheduler and kwok nodes make its pods
//! really Ready): convergence, rollout on a config change, repair, and the stall outside a
//! tenant namespace.

mod common;

use std::collections::BTreeMap;

use common::{TIMEOUT, apps, eventually, shared_operator, tenants, why};
use idem_operator::resources::TenantApp;
use idem_operator::tenant_app::desired::{APP_LABEL, CONFIG_HASH_ANNOTATION, config_map_name};
use idem_tests::{shared, unique_name};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The config-hash annotation of the Deployment's pod template.
fn template_hash(deployment: &Deployment) -> Option<String> {
    deployment
        .spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(CONFIG_HASH_ANNOTATION)
        .cloned()
}

/// Checks that `meta` is controlled by `app` (one controller reference, to its uid).
fn assert_controlled_by(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    app: &TenantApp,
) {
    let controllers: Vec<_> = meta
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.controller == Some(true))
        .collect();
    assert_eq!(controllers.len(), 1, "{:?}", meta.name);
    assert_eq!(
        Some(&controllers[0].uid),
        app.uid().as_ref(),
        "{:?}",
        meta.name
    );
}

#[tokio::test]
async fn a_tenant_app_becomes_ready_rolls_on_config_changes_and_is_repaired() {
    shared_operator().await;
    let client = shared().client();
    let ns = tenants::ready_apps_namespace(&client, "app").await;
    apps::create(&client, &ns, "web", apps::spec(2, "greeting = 'hi'")).await;

    let app = apps::wait_ready(&client, &ns, "web").await;
    assert_eq!(app.status.as_ref().unwrap().available_replicas, 2);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let config = config_maps.get(&config_map_name("web")).await.unwrap();
    assert_eq!(
        config.data.clone().unwrap_or_default(),
        BTreeMap::from([("app.toml".to_string(), "greeting = 'hi'".to_string())])
    );
    assert_controlled_by(&config.metadata, &app);
    let deployment = deployments.get("web").await.unwrap();
    assert_controlled_by(&deployment.metadata, &app);
    assert_eq!(deployment.spec.as_ref().unwrap().replicas, Some(2));
    let status = deployment.status.clone().unwrap_or_default();
    assert_eq!(status.available_replicas, Some(2), "pods really available");
    let service = services.get("web").await.unwrap();
    assert_controlled_by(&service.metadata, &app);
    let service_spec = service.spec.unwrap();
    assert_eq!(service_spec.ports.unwrap()[0].port, 8080);
    assert_eq!(
        service_spec
            .selector
            .unwrap()
            .get(APP_LABEL)
            .map(String::as_str),
        Some("web")
    );
    let first_hash = template_hash(&deployment).expect("a config hash on the pod template");

    // A config change rolls the Deployment: new template hash, new pods, Ready again.
    let apps_api: Api<TenantApp> = Api::namespaced(client.clone(), &ns);
    apps_api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"config": {"app.toml": "greeting = 'hello'"}}})),
        )
        .await
        .unwrap();
    let rolled = eventually("the Deployment to roll", TIMEOUT, || async {
        let d = deployments.get("web").await.map_err(why)?;
        match template_hash(&d) {
            Some(h) if h != first_hash => Ok(d),
            other => Err(format!("hash {other:?}")),
        }
    })
    .await;
    assert_eq!(
        rolled.metadata.uid, deployment.metadata.uid,
        "rolled, not replaced"
    );
    let app = apps::wait_ready(&client, &ns, "web").await;
    assert_eq!(app.status.as_ref().unwrap().available_replicas, 2);
    let config = config_maps.get(&config_map_name("web")).await.unwrap();
    assert_eq!(
        config
            .data
            .unwrap_or_default()
            .get("app.toml")
            .map(String::as_str),
        Some("greeting = 'hello'")
    );
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let new_hash = template_hash(&rolled).unwrap();
    eventually("every pod on the new config", TIMEOUT, || async {
        let list = pods
            .list(&ListParams::default().labels(&format!("{APP_LABEL}=web")))
            .await
            .map_err(why)?;
        let hashes: Vec<Option<String>> = list
            .items
            .iter()
            .map(|p| p.annotations().get(CONFIG_HASH_ANNOTATION).cloned())
            .collect();
        if hashes.len() == 2
            && hashes
                .iter()
                .all(|h| h.as_deref() == Some(new_hash.as_str()))
        {
            Ok(())
        } else {
            Err(format!("{hashes:?}"))
        }
    })
    .await;

    // Deleting the Deployment by hand: it is recreated and the app is Ready again.
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Deployment recreated", TIMEOUT, || async {
        match deployments.get_opt("web").await.map_err(why)? {
            Some(d) if d.uid() != rolled.uid() && d.metadata.deletion_timestamp.is_none() => Ok(()),
            other => Err(format!("{:?}", other.map(|d| d.metadata.uid))),
        }
    })
    .await;
    let app = apps::wait_ready(&client, &ns, "web").await;
    assert_eq!(app.status.as_ref().unwrap().available_replicas, 2);
    let recreated = deployments.get("web").await.unwrap();
    assert_eq!(template_hash(&recreated), Some(new_hash));
    // The app says it made the Deployment again, in an Event of its own (not a count on the
    // first creation's), naming the new object's uid.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let again = eventually("a Created Event saying 'again'", TIMEOUT, || async {
        let again = (events
            .list(&ListParams::default())
            .await
            .map_err(why)?
            .items)
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("Created")
                    && e.regarding.as_ref().and_then(|r| r.uid.clone()) == app.uid()
                    && e.note.as_deref().is_some_and(|n| n.contains(" again: "))
            })
            .collect::<Vec<_>>();
        if again.is_empty() {
            Err("none yet".to_string())
        } else {
            Ok(again)
        }
    })
    .await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(
        again[0].related.as_ref().and_then(|r| r.uid.clone()),
        recreated.uid()
    );
}

#[tokio::test]
async fn a_tenant_app_outside_a_tenant_namespace_is_stalled_and_creates_nothing() {
    shared_operator().await;
    let client = shared().client();
    let ns = unique_name("plain");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    apps::create(&client, &ns, "stray", apps::spec(1, "x")).await;
    let app = apps::wait_condition(&client, &ns, "stray", "Stalled", "NotInTenantNamespace").await;
    let conditions = &app.status.as_ref().unwrap().conditions;
    let ready = conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert!(
        Api::<Deployment>::namespaced(client.clone(), &ns)
            .get_opt("stray")
            .await
            .unwrap()
            .is_none(),
        "no Deployment outside a tenant namespace"
    );
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get_opt(&config_map_name("stray"))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn an_app_blocked_by_a_foreign_deployment_recovers_when_it_is_deleted_and_never_reports_its_replicas()
 {
    shared_operator().await;
    let client = shared().client();
    let ns = tenants::ready_apps_namespace(&client, "clash").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    // Someone's own Deployment `clash`, with a replica really available.
    let foreign: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "clash"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"who": "someone"}},
                 "template": {"metadata": {"labels": {"who": "someone"}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    eventually("the foreign Deployment available", TIMEOUT, || async {
        let d = deployments.get("clash").await.map_err(why)?;
        match d.status.and_then(|s| s.available_replicas) {
            Some(1) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    apps::create(&client, &ns, "clash", apps::spec(2, "x")).await;
    let blocked = apps::wait_condition(&client, &ns, "clash", "Stalled", "ChildNotOwned").await;
    assert_eq!(
        blocked.status.unwrap().available_replicas,
        0,
        "the foreign Deployment's replicas are not the app's"
    );

    deployments
        .delete("clash", &DeleteParams::default())
        .await
        .unwrap();
    // No resync for 10 minutes and no poll: only the watch of the blocking object brings the
    // app back.
    let app = apps::wait_ready(&client, &ns, "clash").await;
    assert_eq!(app.status.as_ref().unwrap().available_replicas, 2);
    let ours = deployments.get("clash").await.unwrap();
    assert_controlled_by(&ours.metadata, &app);
}

#[tokio::test]
async fn a_deployment_that_cannot_create_pods_makes_the_app_stalled_with_the_reason() {
    shared_operator().await;
    let client = shared().client();
    let tenant = unique_name("rf");
    let mut spec = tenants::full_spec(&["apps"]);
    spec.quota = Some(idem_operator::resources::tenant::Quota {
        hard: tenants::quantities(&[("pods", "0")]),
        ..Default::default()
    });
    tenants::create(&client, &tenant, spec).await;
    tenants::wait_ready(&client, &tenant).await;
    let ns = format!("{tenant}-apps");
    apps::create(&client, &ns, "web", apps::spec(1, "x")).await;
    let app = apps::wait_condition(&client, &ns, "web", "Stalled", "ReplicaFailure").await;
    let status = app.status.unwrap();
    let stalled = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Stalled")
        .unwrap();
    assert!(
        stalled.message.contains("FailedCreate") && stalled.message.contains("exceeded quota"),
        "{}",
        stalled.message
    );
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "False");
}

#[tokio::test]
async fn an_app_that_leaves_its_replicas_to_an_autoscaler_never_takes_them_back() {
    shared_operator().await;
    let client = shared().client();
    let ns = tenants::ready_apps_namespace(&client, "scaled").await;
    let mut spec = apps::spec(1, "greeting = 'hi'");
    spec.replicas = None;
    apps::create(&client, &ns, "web", spec).await;
    let app = apps::wait_ready(&client, &ns, "web").await;
    assert_eq!(app.spec.replicas, None, "stored without a count");
    assert_eq!(app.status.as_ref().unwrap().available_replicas, 1);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = deployments.get("web").await.unwrap();
    assert_eq!(
        deployment.spec.as_ref().unwrap().replicas,
        Some(1),
        "the Deployment's own default"
    );

    // Scaled as a HorizontalPodAutoscaler does: through the scale subresource, as another
    // field manager.
    let scaler = PatchParams {
        field_manager: Some("test-autoscaler".into()),
        ..PatchParams::default()
    };
    deployments
        .patch_scale(
            "web",
            &scaler,
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    // The app follows the Deployment's count: Ready once its 3 pods are available, which the
    // operator judges from a reconcile that saw the new count and did not take it back.
    let apps_api: Api<TenantApp> = Api::namespaced(client.clone(), &ns);
    eventually("the app Ready with 3 of 3 replicas", TIMEOUT, || async {
        let app = apps_api.get("web").await.map_err(why)?;
        let status = app.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| (c.status.clone(), c.message.clone()));
        match ready {
            Some((s, m)) if s == "True" && m == "3 of 3 replicas available" => Ok(()),
            other => Err(format!(
                "{other:?}, {} available",
                status.available_replicas
            )),
        }
    })
    .await;
    let deployment = deployments.get("web").await.unwrap();
    assert_eq!(deployment.spec.as_ref().unwrap().replicas, Some(3));
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let repaired: Vec<Option<String>> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("DriftRepaired"))
        .map(|e| e.note)
        .collect();
    assert!(
        repaired.is_empty(),
        "the count was taken back: {repaired:?}"
    );
}

#[tokio::test]
async fn an_object_with_forged_marks_of_the_app_is_not_adopted() {
    // Someone else's ConfigMap at the app's ConfigMap's name blocks the app. The tenant owner
    // then forges what a child of the app that lost its ownerReference would carry: the
    // app's owner-uid label, the managed-by label, and an `Apply` entry under idem's field
    // manager. The app has a record of its children, which this object is not in: it stays
    // someone else's (not adopted, not overwritten, not recorded, so never deleted with the
    // app).
    shared_operator().await;
    let client = shared().client();
    let ns = tenants::ready_apps_namespace(&client, "forge").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let theirs: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": config_map_name("victim")},
        "data": {"app.toml": "bob's own settings"}
    }))
    .unwrap();
    let post = PostParams {
        field_manager: Some("bob".into()),
        ..PostParams::default()
    };
    let theirs = config_maps.create(&post, &theirs).await.unwrap();
    let theirs_uid = theirs.uid().unwrap();
    apps::create(&client, &ns, "victim", apps::spec(0, "x")).await;
    let app = apps::wait_condition(&client, &ns, "victim", "Stalled", "ChildNotOwned").await;
    let app_uid = app.uid().unwrap();

    let forged = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": config_map_name("victim"), "labels": {
            idem_runtime::apply::MANAGED_BY_LABEL: idem_operator::resources::FIELD_MANAGER,
            idem_runtime::apply::OWNER_UID_LABEL: app_uid,
        }},
    });
    Api::<ConfigMap>::namespaced(common::users::client_as("alice"), &ns)
        .patch(
            &config_map_name("victim"),
            &PatchParams::apply(idem_operator::resources::FIELD_MANAGER),
            &Patch::Apply(&forged),
        )
        .await
        .expect("the tenant owner may write ConfigMaps in their namespace");
    // Any change of the app makes its controller judge the object again.
    Api::<TenantApp>::namespaced(client.clone(), &ns)
        .patch(
            "victim",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"config": {"app.toml": "changed"}}})),
        )
        .await
        .unwrap();
    let app = apps::wait_condition(&client, &ns, "victim", "Stalled", "ChildNotOwned").await;
    let now = config_maps.get(&config_map_name("victim")).await.unwrap();
    assert_eq!(now.uid().as_deref(), Some(theirs_uid.as_str()));
    assert!(
        !now.owner_references()
            .iter()
            .any(|r| r.uid == app_uid && r.controller == Some(true)),
        "adopted on forged marks: {:?}",
        now.owner_references()
    );
    assert_eq!(
        now.data
            .unwrap_or_default()
            .get("app.toml")
            .map(String::as_str),
        Some("bob's own settings"),
        "overwritten on forged marks"
    );
    let recorded = app.status.unwrap_or_default().created_children;
    assert!(
        recorded.iter().all(|c| c.uid != theirs_uid),
        "recorded on forged marks: {recorded:?}"
    );
}

#[tokio::test]
async fn a_deployment_moved_to_a_sibling_app_is_given_back_and_recreated() {
    // The tenant owner points app `p1`'s Deployment at app `p2` (its controller
    // ownerReference), then deletes it. Nothing of `p1` changed, yet `p1` is the one that
    // created it (its record): it is reconciled and makes the Deployment again.
    shared_operator().await;
    let client = shared().client();
    let ns = tenants::ready_apps_namespace(&client, "moved").await;
    for app in ["p1", "p2"] {
        apps::create(&client, &ns, app, apps::spec(1, "x")).await;
        apps::wait_ready(&client, &ns, app).await;
    }
    let p2 = Api::<TenantApp>::namespaced(client.clone(), &ns)
        .get("p2")
        .await
        .unwrap();
    let alice = common::users::client_as("alice");
    let deployments: Api<Deployment> = Api::namespaced(alice, &ns);
    let before = deployments.get("p1").await.unwrap();
    let moved = json!([{"op": "replace", "path": "/metadata/ownerReferences", "value": [{
        "apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "TenantApp", "name": "p2",
        "uid": p2.uid().unwrap(), "controller": true}]}]);
    deployments
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(moved).unwrap()),
        )
        .await
        .expect("the tenant owner may edit Deployments in their namespace");
    deployments
        .delete("p1", &DeleteParams::default())
        .await
        .expect("delete");
    let admin: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    eventually("p1's Deployment made again by p1", TIMEOUT, || async {
        let d = admin.get_opt("p1").await.map_err(why)?;
        let mine = d.as_ref().is_some_and(|d| {
            d.uid() != before.uid()
                && d.owner_references()
                    .iter()
                    .any(|r| r.name == "p1" && r.controller == Some(true))
        });
        mine.then_some(())
            .ok_or_else(|| format!("{:?}", d.map(|d| (d.uid(), d.owner_references().to_vec()))))
    })
    .await;
}
