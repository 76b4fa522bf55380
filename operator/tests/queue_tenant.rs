//! The fair-queue tenant of a TenantApp is the Tenant that controls its namespace (by the
//! namespace's controller ownerReference, from the operator's namespace cache), never what
//! the app says about itself: apps in a namespace no Tenant controls (one retained after its
//! Tenant was deleted, say) are queued under one fallback tenant, whatever their own
//! `tenancy.idem.dev/tenant` label says, and make no tenant of their labels or of their
//! namespace's name. Once a Tenant controls the namespace, the app's work is that Tenant's.
//! Judged by the TenantApp controller's `idem_tenant_dispatches_total` on `/metrics`.

mod common;

use common::{TIMEOUT, apps, eventually, shared_operator, tenants, why};
use idem_operator::resources::{TENANT_LABEL, TenantApp};
use idem_runtime::apply::MANAGED_BY_LABEL;
use idem_runtime::controller::UNRESOLVED_TENANT;
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// The TenantApp controller's dispatches of `tenant`'s keys so far; `None` without a series.
fn app_dispatches(metrics: &str, tenant: &str) -> Option<u64> {
    let tenant = format!("tenant=\"{tenant}\"");
    let values: Vec<u64> = metrics
        .lines()
        .filter(|l| l.starts_with("idem_tenant_dispatches_total{"))
        .filter(|l| l.contains("name=\"tenantapp\"") && l.contains(&tenant))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Creates TenantApp `name` in `ns` with `labels`.
async fn create_app(client: &kube::Client, ns: &str, name: &str, labels: serde_json::Value) {
    let mut app = TenantApp::new(name, apps::spec(1, "a = 1"));
    app.metadata.labels = serde_json::from_value(labels).unwrap();
    Api::<TenantApp>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &app)
        .await
        .unwrap_or_else(|e| panic!("creating app {ns}/{name}: {e}"));
}

/// Waits until app `ns/name` was reconciled and found outside a tenant namespace.
async fn wait_not_in_tenant_namespace(client: &kube::Client, ns: &str, name: &str) {
    let apps: Api<TenantApp> = Api::namespaced(client.clone(), ns);
    eventually(
        &format!("app {ns}/{name} NotInTenantNamespace"),
        TIMEOUT,
        || async {
            let app = apps.get(name).await.map_err(why)?;
            let status = app.status.clone().unwrap_or_default();
            let hit = status
                .conditions
                .iter()
                .any(|c| c.reason == "NotInTenantNamespace");
            (hit && status.observed_generation == app.metadata.generation)
                .then_some(())
                .ok_or_else(|| format!("{status:?}"))
        },
    )
    .await;
}

#[tokio::test]
async fn apps_outside_a_tenant_namespace_are_charged_to_one_fallback_tenant_not_to_their_labels() {
    let operator = shared_operator().await;
    let client = shared().client();
    // A real tenant whose name the apps claim.
    let victim = unique_name("qvictim");
    tenants::create(&client, &victim, tenants::full_spec(&["x"])).await;
    tenants::wait_ready(&client, &victim).await;
    // A namespace that looks like a tenant's (labelled, managed-by: in the operator's
    // namespace cache) but that no Tenant controls: what a deleted Tenant leaves with Retain.
    let ns = unique_name("qretained");
    let gone = unique_name("qgone");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns, "labels": {
                TENANT_LABEL: gone, MANAGED_BY_LABEL: "idem-operator"}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let fakes: Vec<String> = (0..3).map(|i| unique_name(&format!("qfake{i}"))).collect();
    let mut names = Vec::new();
    for i in 0..2 {
        let name = format!("claims-victim-{i}");
        create_app(&client, &ns, &name, json!({TENANT_LABEL: victim})).await;
        names.push(name);
    }
    for (i, fake) in fakes.iter().enumerate() {
        let name = format!("claims-fake-{i}");
        create_app(&client, &ns, &name, json!({TENANT_LABEL: fake})).await;
        names.push(name);
    }
    create_app(&client, &ns, "unlabelled", json!({})).await;
    names.push("unlabelled".into());
    for name in &names {
        wait_not_in_tenant_namespace(&client, &ns, name).await;
    }

    let metrics = operator.metrics().await;
    assert_eq!(
        app_dispatches(&metrics, &victim),
        None,
        "apps charged to tenant {victim} by their own label"
    );
    for t in fakes.iter().chain([&ns, &gone]) {
        assert_eq!(
            app_dispatches(&metrics, t),
            None,
            "a tenant {t} made of an app's label, its namespace or that namespace's label"
        );
    }
    let fallback = app_dispatches(&metrics, UNRESOLVED_TENANT).unwrap_or(0);
    assert!(
        fallback >= names.len() as u64,
        "every app dispatched under {UNRESOLVED_TENANT}: {fallback}"
    );
}

#[tokio::test]
async fn an_apps_queue_tenant_becomes_the_tenant_that_controls_its_namespace() {
    let operator = shared_operator().await;
    let client = shared().client();
    let owner = unique_name("qowner");
    let tenant = tenants::create(&client, &owner, tenants::full_spec(&["x"])).await;
    tenants::wait_ready(&client, &owner).await;
    // An app in a namespace no Tenant controls yet.
    let ns = unique_name("qlater");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    create_app(&client, &ns, "web", json!({})).await;
    wait_not_in_tenant_namespace(&client, &ns, "web").await;
    assert_eq!(
        app_dispatches(&operator.metrics().await, &owner),
        None,
        "tenant {owner} has no app yet"
    );
    // The Tenant comes to control the namespace (a cluster admin sets what only those who
    // may update Namespaces can: its controller ownerReference, with the tenant label).
    let patch = json!({"metadata": {
        "labels": {TENANT_LABEL: owner, MANAGED_BY_LABEL: "idem-operator"},
        "ownerReferences": [{"apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "Tenant",
            "name": owner, "uid": tenant.uid().unwrap(), "controller": true}]}});
    namespaces
        .patch(&ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let patched = std::time::Instant::now();
    // The app's next reconcile finds it in a tenant namespace ...
    let apps_api: Api<TenantApp> = Api::namespaced(client.clone(), &ns);
    eventually(
        "the app reconciled in a tenant namespace",
        TIMEOUT,
        || async {
            let app = apps_api.get("web").await.map_err(why)?;
            let status = app.status.clone().unwrap_or_default();
            let outside = status
                .conditions
                .iter()
                .any(|c| c.reason == "NotInTenantNamespace");
            (!outside && status.observed_generation == app.metadata.generation)
                .then_some(())
                .ok_or_else(|| format!("{status:?}"))
        },
    )
    .await;
    // ... woken by the namespace's change, not by the poll of apps outside a tenant namespace
    // (its last look was just before the patch, so the poll would come almost a period later).
    let poll = idem_operator::tenant_app::reconcile::NOT_IN_TENANT_NAMESPACE_POLL;
    assert!(
        patched.elapsed() < poll / 2,
        "the app was reconciled {:?} after its namespace became a tenant's (the poll is {poll:?})",
        patched.elapsed()
    );
    // ... as the work of the Tenant that controls it, not of a tenant fixed when it was
    // first queued.
    let metrics = operator.metrics().await;
    let charged = app_dispatches(&metrics, &owner).unwrap_or(0);
    assert!(
        charged > 0,
        "the app's reconcile in {owner}'s namespace was not charged to {owner}"
    );
    assert_eq!(
        app_dispatches(&metrics, &ns),
        None,
        "a tenant named after the namespace"
    );
}
