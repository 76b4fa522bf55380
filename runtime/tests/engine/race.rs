//! Concurrency: two reconciles of one object at once, and a child created by someone else
//! between our read and our create.

use idem_runtime::apply::{Applier, ChildOutcome, Labels, Owner};
use idem_runtime::{ObjectKey, TenantKey};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};

use crate::common::*;

/// What a Widget's reconcile produced, with names made relative to the widget.
#[derive(Debug, PartialEq)]
struct Outcome {
    config: Option<std::collections::BTreeMap<String, String>>,
    replicas: Option<i32>,
    image: Option<String>,
    quota_hard: Vec<(String, String)>,
    service_ports: Vec<(i32, String)>,
    conditions: Vec<(String, String, String, String)>,
    observed_generation: Option<i64>,
    children_with_our_label: usize,
}

async fn outcome(client: &kube::Client, ns: &str, name: &str) -> Outcome {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(&format!("{name}-config"))
        .await
        .expect("configmap");
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("deployment");
    let rq = Api::<ResourceQuota>::namespaced(client.clone(), ns)
        .get(&format!("{name}-quota"))
        .await
        .expect("quota");
    let svc = Api::<Service>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("service");
    let w = get_widget(client, ns, name).await;
    let uid = w.metadata.uid.clone().expect("uid");
    let lp = ListParams::default().labels(&format!("{}={uid}", Labels::of::<Widget>().owner_uid()));
    let mut labelled = 0;
    labelled += Api::<ConfigMap>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .expect("l")
        .items
        .len();
    labelled += Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .expect("l")
        .items
        .len();
    labelled += Api::<ResourceQuota>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .expect("l")
        .items
        .len();
    labelled += Api::<Service>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .expect("l")
        .items
        .len();
    let status = w.status.clone().unwrap_or_default();
    let spec = d.spec.expect("spec");
    Outcome {
        config: cm.data,
        replicas: spec.replicas,
        image: spec
            .template
            .spec
            .and_then(|s| s.containers[0].image.clone()),
        quota_hard: rq
            .spec
            .and_then(|s| s.hard)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect(),
        service_ports: svc
            .spec
            .and_then(|s| s.ports)
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.port, p.name.unwrap_or_default()))
            .collect(),
        conditions: status
            .conditions
            .into_iter()
            .map(|c| (c.type_, c.status, c.reason, c.message))
            .collect(),
        observed_generation: status.observed_generation,
        children_with_our_label: labelled,
    }
}

#[tokio::test]
async fn two_reconciles_at_once_end_like_two_in_a_row() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "concurrent").await;

    let a = create_widget(&client, &ns, "a", widget_spec()).await;
    let (r1, r2) = tokio::join!(reconcile(&client, &a), reconcile(&client, &a));
    let (r1, r2) = (r1.expect("first concurrent reconcile"), r2.expect("second"));
    // Every child was created by one of them and found converged (or applied) by the other.
    for ((k1, o1), (_, o2)) in r1.0.children.iter().zip(&r2.0.children) {
        let created = [o1, o2]
            .iter()
            .filter(|o| ***o == ChildOutcome::Created)
            .count();
        assert!(created <= 1, "{k1} created twice: {o1:?} {o2:?}");
        assert!(
            !matches!(o1, ChildOutcome::NotOwned { .. })
                && !matches!(o2, ChildOutcome::NotOwned { .. })
        );
    }

    let b = create_widget(&client, &ns, "b", widget_spec()).await;
    reconcile(&client, &b).await.expect("sequential 1");
    let b = get_widget(&client, &ns, "b").await;
    reconcile(&client, &b).await.expect("sequential 2");

    let oa = outcome(&client, &ns, "a").await;
    let ob = outcome(&client, &ns, "b").await;
    assert_eq!(oa, ob);
    assert_eq!(oa.children_with_our_label, 4, "no duplicate children");
    assert!(
        oa.conditions
            .iter()
            .any(|c| c.0 == "Ready" && c.1 == "True"),
        "{oa:?}"
    );
    assert_eq!(oa.observed_generation, Some(1));
}

#[tokio::test]
async fn child_created_between_read_and_create_is_handled_as_apply() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "create-race").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(TenantKey::new(&ns))).expect("owner");
    let desired = desired_children(&w);
    let child = &desired.children()[0];
    assert_eq!(
        child.key(),
        &ObjectKey {
            namespace: None,
            ..ObjectKey::namespaced("ConfigMap", "x", "w-config")
        }
    );

    // We read "absent"; meanwhile another replica of the operator creates the child.
    reconcile(&client, &w).await.expect("the other replica");
    let applier = Applier::new(client.clone());
    let outcome = applier.apply_observed(&owner, child, None).await;
    assert_eq!(outcome.expect("not a failure"), ChildOutcome::Unchanged);

    // Same race, but the creator is not us: not adopted, not modified, not an error.
    let x = create_widget(&client, &ns, "x", widget_spec()).await;
    let x_owner = Owner::new(&x, Widget::FIELD_MANAGER, Some(TenantKey::new(&ns))).expect("owner");
    let x_desired = desired_children(&x);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let theirs = cms
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("x-config".into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .expect("foreign create");
    let outcome = applier
        .apply_observed(&x_owner, &x_desired.children()[0], None)
        .await
        .expect("not a failure");
    assert!(
        matches!(outcome, ChildOutcome::NotOwned { .. }),
        "{outcome:?}"
    );
    let after = cms.get("x-config").await.expect("get");
    assert_eq!(
        after.metadata.resource_version,
        theirs.metadata.resource_version
    );
}

#[tokio::test]
async fn stale_observation_is_applied_without_conflict_and_a_replaced_child_is_never_adopted() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.write().await;
    let ns = namespace(&client, "stale-child").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    reconcile(&client, &w).await.expect("first reconcile");
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(TenantKey::new(&ns))).expect("owner");
    let cms: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::api::ApiResource::erase::<ConfigMap>(&()),
    );
    let typed: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    // Our observation, then a rival write that moves the resourceVersion on and changes a
    // field of ours: the apply carries no resourceVersion, so it is one write, no 409.
    let stale = cms.get("w-config").await.expect("get");
    let rival = serde_json::json!({"data": {"greeting": "drifted"}});
    let pp = kube::api::PatchParams {
        field_manager: Some("rival".into()),
        ..kube::api::PatchParams::default()
    };
    typed
        .patch("w-config", &pp, &kube::api::Patch::Merge(&rival))
        .await
        .expect("rival");
    let observed = cms.get("w-config").await.expect("get");
    let before = counts("", "configmaps").await;
    let desired = desired_children(&w);
    let outcome = Applier::new(client.clone())
        .apply_observed(&owner, &desired.children()[0], Some(observed.clone()))
        .await
        .expect("applied");
    let after = counts("", "configmaps").await;
    assert_eq!(outcome, ChildOutcome::Applied);
    assert_eq!(after.conflicts - before.conflicts, 0, "no 409");
    assert_eq!(after.writes - before.writes, 1, "one change, one write");
    let cm = typed.get("w-config").await.expect("get");
    assert_eq!(cm.data.unwrap_or_default()["greeting"], "hello");

    // The child is deleted and someone else creates an object of the same name: our stale
    // observation (old uid, our ownerReference) must not make us write into theirs.
    typed
        .delete("w-config", &kube::api::DeleteParams::default())
        .await
        .expect("delete");
    let theirs = typed
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("w-config".into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .expect("foreign create");
    let mut drifted = stale;
    drifted.data["data"]["greeting"] = serde_json::json!("other");
    let outcome = Applier::new(client.clone())
        .apply_observed(&owner, &desired.children()[0], Some(drifted))
        .await
        .expect("not an error");
    assert!(
        matches!(outcome, ChildOutcome::NotOwned { .. }),
        "{outcome:?}"
    );
    let after = typed.get("w-config").await.expect("get");
    assert_eq!(
        after.metadata.resource_version, theirs.metadata.resource_version,
        "untouched"
    );
}
