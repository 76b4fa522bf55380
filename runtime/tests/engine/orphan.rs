//! Children whose claim on their owner is not what it seems. An owner deleted with
//! `propagationPolicy: Orphan`: the garbage collector removes the ownerReferences of its
//! children so that they stay, and a reconcile working from a cache that has not seen the
//! deletion yet must not put them back (the collector would then delete the children with the
//! owner after all). And an object that copies the owner's controller ownerReference without
//! being in its record, which the server refuses to make as desired: not the owner's.

use std::time::{Duration, Instant};

use idem_runtime::TenantKey;
use idem_runtime::apply::{Applier, ChildOutcome, DesiredChildren, Owner};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use serde_json::json;

use crate::common::*;

const HOLD: &str = "test.idem.dev/hold";

#[tokio::test]
async fn a_removed_owner_reference_is_not_restored_while_the_owner_is_being_orphan_deleted() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "orphan").await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    create_widget(&client, &ns, "w", widget_spec()).await;
    // A finalizer of the test's own keeps the deleted Widget readable after the collector has
    // orphaned its children.
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": [HOLD]}})),
        )
        .await
        .expect("add the test's finalizer");
    let stale = get_widget(&client, &ns, "w").await;
    let mut desired = DesiredChildren::new();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "data"},
        "data": {"k": "v"}}))
    .unwrap();
    desired.add(&cm).expect("add");
    let owner = Owner::new(&stale, Widget::FIELD_MANAGER, Some(TenantKey::new(&ns))).unwrap();
    let applier = Applier::new(client.clone());
    let report = applier.reconcile(&owner, &desired).await.expect("create");
    assert_eq!(report.children[0].1, ChildOutcome::Created, "{report:?}");
    let owner = owner.with_record(&report.created);

    widgets
        .delete(
            "w",
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Orphan),
                ..DeleteParams::default()
            },
        )
        .await
        .expect("delete with propagationPolicy Orphan");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let refs = |cm: &ConfigMap| cm.metadata.owner_references.clone().unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !refs(&configmaps.get("data").await.expect("get")).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the garbage collector never orphaned the child"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A reconcile of the Widget as it was before the deletion (what a lagging cache shows).
    let report = applier
        .reconcile(&owner, &desired)
        .await
        .expect("reconcile");
    assert_eq!(report.children[0].1, ChildOutcome::Unchanged, "{report:?}");
    let live = configmaps.get("data").await.expect("get");
    assert!(
        refs(&live).is_empty(),
        "the orphaned child got its ownerReference back: {:?}",
        refs(&live)
    );

    // The owner goes; nothing refers to it, so the collector keeps the child.
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("remove the test's finalizer");
    let deadline = Instant::now() + Duration::from_secs(60);
    while widgets.get_opt("w").await.expect("get").is_some() {
        assert!(Instant::now() < deadline, "the Widget was never deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(configmaps.get_opt("data").await.expect("get").is_some());
}

/// A tenant owner's object at a desired name, with the owner's controller ownerReference
/// copied onto it but not in the owner's record, that the server refuses to change (an
/// immutable ConfigMap): it stays theirs and is reported as not owned — not a terminal error
/// that would keep the owner from ever creating its own once the object is deleted.
#[tokio::test]
async fn an_unrecorded_object_claiming_the_owner_that_cannot_be_made_as_desired_is_not_owned() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "claim").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let forged: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "data", "ownerReferences": [{
            "apiVersion": "test.idem.dev/v1", "kind": "Widget", "name": "w",
            "uid": w.metadata.uid.clone().unwrap(), "controller": true,
        }]},
        "immutable": true,
        "data": {"k": "theirs"},
    }))
    .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    configmaps
        .create(&Default::default(), &forged)
        .await
        .expect("the forged ConfigMap");
    let mut desired = DesiredChildren::new();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "data"},
        "data": {"k": "v"}}))
    .unwrap();
    desired.add(&cm).expect("add");
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(TenantKey::new(&ns)))
        .unwrap()
        .with_record(&[]);
    let report = Applier::new(client.clone())
        .reconcile(&owner, &desired)
        .await
        .expect("an object that is not ours is not an error");
    assert!(
        matches!(&report.children[0].1, ChildOutcome::NotOwned { reason } if reason.contains("not created by it")),
        "{report:?}"
    );
    assert!(report.created.is_empty(), "{report:?}");
    let live = configmaps.get("data").await.expect("get");
    assert_eq!(live.data.unwrap_or_default()["k"], "theirs");
}
