//! Drift that only the server's record reveals: a value changed under our own field manager
//! name, an integer beyond 2^53, and the repair report naming who changed what (through a
//! subresource too).

use idem_runtime::TenantKey;
use idem_runtime::apply::{Applier, ChildOutcome, DesiredChildren, Owner};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::common::*;

/// A ConfigMap child can't hold an integer; the Widget's Deployment template can:
/// `terminationGracePeriodSeconds` is an int64.
#[tokio::test]
async fn an_integer_above_2_pow_53_is_compared_exactly() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "int53").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(TenantKey::new(&ns))).expect("owner");
    let big: i64 = (1 << 53) + 1;
    let body = json!({"metadata": {"name": "big"}, "spec": {
        "selector": {"matchLabels": {"app": "big"}}, "replicas": 0,
        "template": {"metadata": {"labels": {"app": "big"}}, "spec": {
            "terminationGracePeriodSeconds": big,
            "containers": [{"name": "app", "image": "nginx:1.27"}]}}}});
    let deployment: k8s_openapi::api::apps::v1::Deployment =
        serde_json::from_value(body).expect("deployment");
    let mut desired = DesiredChildren::new();
    desired.add(&deployment).expect("add");
    let applier = Applier::new(client.clone());
    applier.reconcile(&owner, &desired).await.expect("create");
    // Someone applies under our own manager name (so ownership does not move) with the
    // neighbouring integer, equal to ours as an f64.
    let api: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), &ns);
    let mut tampered = desired.children()[0].stamped_body(&owner).expect("body");
    tampered["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(big - 1);
    api.patch(
        "big",
        &PatchParams::apply(Widget::FIELD_MANAGER).force(),
        &Patch::Apply(&tampered),
    )
    .await
    .expect("tamper");
    let report = applier.reconcile(&owner, &desired).await.expect("repair");
    assert_eq!(report.children[0].1, ChildOutcome::Applied, "{report:?}");
    let d = api.get("big").await.expect("get");
    let grace = d
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.termination_grace_period_seconds);
    assert_eq!(grace, Some(big));
    let report = applier
        .reconcile(&owner, &desired)
        .await
        .expect("converged");
    assert_eq!(report.children[0].1, ChildOutcome::Unchanged, "{report:?}");
}

#[tokio::test]
async fn a_repair_names_the_fields_and_the_manager_that_changed_them() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "repair-report").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    reconcile(&client, &w).await.expect("first reconcile");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..PatchParams::default()
    };
    cms.patch(
        "w-config",
        &pp,
        &Patch::Merge(&json!({"data": {"greeting": "tampered"}})),
    )
    .await
    .expect("tamper");
    let (report, _) = reconcile(&client, &w).await.expect("repair");
    assert_eq!(report.repaired.len(), 1, "{report:?}");
    assert_eq!(
        report.repaired[0].to_string(),
        format!(
            "ConfigMap/{ns}/w-config: .data.greeting changed by kubectl-edit (Update), restored"
        )
    );
    assert_eq!(report.repaired[0].managers(), ["kubectl-edit (Update)"]);
    // A change of our own desired body is not a repair.
    let (report, _) = reconcile(&client, &w).await.expect("converged");
    assert!(report.repaired.is_empty() && !report.wrote(), "{report:?}");
}

/// `kubectl scale` writes `.spec.replicas` through the `scale` subresource: the server records
/// that writer in an entry of the subresource, and the repair names it (not "removed").
#[tokio::test]
async fn a_repair_names_a_writer_through_the_scale_subresource() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "repair-scale").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    reconcile(&client, &w).await.expect("first reconcile");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let pp = PatchParams {
        field_manager: Some("kubectl-scale".into()),
        ..PatchParams::default()
    };
    deployments
        .patch_scale("w", &pp, &Patch::Merge(&json!({"spec": {"replicas": 5}})))
        .await
        .expect("scale");
    let (report, _) = reconcile(&client, &w).await.expect("repair");
    assert_eq!(report.repaired.len(), 1, "{report:?}");
    assert_eq!(
        report.repaired[0].to_string(),
        format!(
            "Deployment/{ns}/w: .spec.replicas changed by kubectl-scale (Update, scale), restored"
        )
    );
    let live = deployments.get("w").await.expect("get");
    assert_eq!(
        live.spec.and_then(|s| s.replicas),
        Some(widget_spec().replicas)
    );
}
