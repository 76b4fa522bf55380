//! Forged ownership against the real control plane: a tenant owner (who holds `admin` in the
//! tenant's namespaces) creates objects of their own that carry the Tenant's (or a
//! TenantApp's) controller ownerReference and idem's labels, even under idem's field manager.
//! The prune must never delete them — it deletes only children recorded in the owner's status
//! as created by the operator — and the owner reports them (`NotPruned` Warning). A genuinely
//! obsolete child is still pruned, also by an operator started after the spec changed.
//!
//! The tests of this binary run one at a time: each starts and stops its own operator.

mod common;
use common::users::client_as;

use std::time::Duration;

use common::{Operator, TIMEOUT, apps, eventually, install_crds, tenants, why};
use idem_operator::resources::{Tenant, TenantApp};
use idem_runtime::apply::{MANAGED_BY_LABEL, OWNER_UID_LABEL, TENANT_LABEL};
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// Metadata claiming `owner` as idem would: its controller ownerReference and idem's labels.
fn claiming<K: Resource<DynamicType = ()>>(owner: &K, name: &str, tenant: &str) -> Value {
    json!({
        "name": name,
        "labels": {
            MANAGED_BY_LABEL: "idem-operator",
            OWNER_UID_LABEL: owner.uid().unwrap(),
            TENANT_LABEL: tenant,
        },
        "ownerReferences": [{
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "name": owner.name_any(),
            "uid": owner.uid().unwrap(),
            "controller": true,
        }],
    })
}

/// Creates `obj` as `user` under field manager `idem-operator` (a client names its own field
/// manager, so `managedFields` cannot tell who wrote an object).
async fn create_as<K>(user: &str, ns: &str, obj: Value) -> K
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let pp = PostParams {
        field_manager: Some("idem-operator".into()),
        ..PostParams::default()
    };
    let obj: K = serde_json::from_value(obj).unwrap();
    Api::<K>::namespaced(client_as(user), ns)
        .create(&pp, &obj)
        .await
        .unwrap_or_else(|e| panic!("{user} creates {}: {e}", K::kind(&())))
}

/// Waits for a `NotPruned` Warning on the owner (`kind`/`name`) naming `child`, while `exists`
/// holds throughout (a deleted object fails at once, not at the timeout).
async fn wait_not_pruned<F, Fut>(kind: &str, name: &str, child: &str, exists: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let client = shared().client();
    eventually(
        "a NotPruned event naming the forged object",
        TIMEOUT,
        || async {
            assert!(
                exists().await,
                "the operator deleted {child}, a tenant's own object"
            );
            let events = Api::<k8s_openapi::api::events::v1::Event>::all(client.clone())
                .list(&Default::default())
                .await
                .map_err(why)?;
            events
                .items
                .iter()
                .find(|e| {
                    e.reason.as_deref() == Some("NotPruned")
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().is_some_and(|r| {
                            r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                        })
                        && e.note.as_deref().is_some_and(|n| n.contains(child))
                })
                .map(|_| ())
                .ok_or_else(|| "none yet".to_string())
        },
    )
    .await;
    assert!(
        exists().await,
        "the operator deleted {child}, a tenant's own object"
    );
}

/// Whether NetworkPolicy `ns/name` exists.
async fn policy_exists(ns: &str, name: &str) -> bool {
    Api::<NetworkPolicy>::namespaced(shared().client(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .is_some()
}

/// The `createdChildren` record of tenant `name`, as `Kind/namespace/name` strings.
async fn record_of(client: &kube::Client, name: &str) -> Vec<String> {
    let tenant: Tenant = tenants::api(client).get(name).await.unwrap();
    tenant
        .status
        .map(|s| s.created_children)
        .unwrap_or_default()
        .iter()
        .map(|c| c.key().to_string())
        .collect()
}

/// Waits until namespace `ns` is gone or being deleted.
async fn wait_pruned(client: &kube::Client, ns: &str) {
    eventually("the obsolete namespace to be pruned", TIMEOUT, || async {
        match Api::<Namespace>::all(client.clone())
            .get_opt(ns)
            .await
            .map_err(why)?
        {
            None => Ok(()),
            Some(n) if n.metadata.deletion_timestamp.is_some() => Ok(()),
            Some(_) => Err(format!("{ns} still there")),
        }
    })
    .await;
}

#[tokio::test]
async fn an_object_a_tenant_owner_forges_to_claim_the_tenant_is_never_pruned() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let operator = Operator::start(Duration::from_secs(600)).await;
    let name = unique_name("forge");
    tenants::create(&client, &name, tenants::full_spec(&["a", "b"])).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    let (ns_a, ns_b) = (format!("{name}-a"), format!("{name}-b"));
    let record = record_of(&client, &name).await;
    assert!(
        record.contains(&format!("Namespace/{ns_b}"))
            && record.contains(&format!("NetworkPolicy/{ns_a}/idem-isolation")),
        "the status records what the operator created: {record:?}"
    );

    // alice (tenant owner, `admin` in the tenant's namespaces) makes a policy of her own that
    // claims the Tenant exactly as idem's children do.
    let forged = "alices-policy";
    let mut meta = claiming(&tenant, forged, &name);
    meta["namespace"] = json!(ns_a);
    create_as::<NetworkPolicy>(
        "alice",
        &ns_a,
        json!({"metadata": meta, "spec": {"podSelector": {"matchLabels": {"app": "mine"}}}}),
    )
    .await;
    // Its watch event reconciles the Tenant; that reconcile reports it instead of deleting it.
    wait_not_pruned("Tenant", &name, forged, || policy_exists(&ns_a, forged)).await;

    // A genuinely obsolete child is still pruned: namespace b leaves the spec.
    tenants::api(&client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"namespaces": ["a"]}})),
        )
        .await
        .unwrap();
    wait_pruned(&client, &ns_b).await;
    tenants::wait_ready(&client, &name).await;
    assert!(
        policy_exists(&ns_a, forged).await,
        "the forged policy survives the prune that removed namespace {ns_b}"
    );
    eventually("the record to drop namespace b", TIMEOUT, || async {
        let record = record_of(&client, &name).await;
        if record.iter().any(|k| k.contains(&ns_b)) {
            Err(format!("{record:?}"))
        } else {
            Ok(())
        }
    })
    .await;
    delete_tenant(&client, &name).await;
    operator.stop().await;
}

/// The notes of the `NotPruned` Warnings on Tenant `name`.
async fn not_pruned_notes(client: &kube::Client, name: &str) -> Vec<String> {
    let events = tenants::events_about(client, name, "NotPruned").await;
    events.into_iter().filter_map(|e| e.note).collect()
}

#[tokio::test]
async fn an_object_in_another_tenants_namespace_claiming_a_tenant_is_not_reported_on_it() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let operator = Operator::start(Duration::from_secs(600)).await;
    let (one, two) = (unique_name("forge-one"), unique_name("forge-two"));
    tenants::create(&client, &one, tenants::full_spec(&["a"])).await;
    tenants::create(&client, &two, tenants::full_spec(&["a"])).await;
    tenants::wait_ready(&client, &one).await;
    let tenant_two = tenants::wait_ready(&client, &two).await;
    let (ns_one, ns_two) = (format!("{one}-a"), format!("{two}-a"));

    // alice, owner of both, forges a claim on Tenant two in tenant one's namespace, then one
    // in tenant two's own. The watch delivers them in that order, so the pass that reports
    // the second has seen the first.
    let policy = |meta: Value| json!({"metadata": meta, "spec": {"podSelector": {"matchLabels": {"app": "mine"}}}});
    let mut elsewhere = claiming(&tenant_two, "elsewhere", &two);
    elsewhere["namespace"] = json!(ns_one);
    create_as::<NetworkPolicy>("alice", &ns_one, policy(elsewhere)).await;
    let mut at_home = claiming(&tenant_two, "at-home", &two);
    at_home["namespace"] = json!(ns_two);
    create_as::<NetworkPolicy>("alice", &ns_two, policy(at_home)).await;
    wait_not_pruned("Tenant", &two, "at-home", || {
        policy_exists(&ns_two, "at-home")
    })
    .await;

    let notes = not_pruned_notes(&client, &two).await;
    assert!(
        notes
            .iter()
            .all(|n| !n.contains("elsewhere") && !n.contains(" objects claim")),
        "only the claim in tenant two's own namespace is reported on it: {notes:#?}"
    );
    assert!(policy_exists(&ns_one, "elsewhere").await);
    assert!(not_pruned_notes(&client, &one).await.is_empty());
    delete_tenant(&client, &one).await;
    delete_tenant(&client, &two).await;
    operator.stop().await;
}

#[tokio::test]
async fn an_obsolete_child_is_pruned_by_an_operator_started_after_the_spec_changed() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let operator = Operator::start(Duration::from_secs(600)).await;
    let name = unique_name("restart");
    tenants::create(&client, &name, tenants::full_spec(&["a", "b"])).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    let (ns_a, ns_b) = (format!("{name}-a"), format!("{name}-b"));
    // A forged object, so this test also fails where the prune trusts the ownerReference.
    let forged = "alices-policy";
    let mut meta = claiming(&tenant, forged, &name);
    meta["namespace"] = json!(ns_b);
    create_as::<NetworkPolicy>(
        "alice",
        &ns_b,
        json!({"metadata": meta, "spec": {"podSelector": {}}}),
    )
    .await;
    wait_not_pruned("Tenant", &name, forged, || policy_exists(&ns_b, forged)).await;
    operator.stop().await;

    // While no operator runs, namespace b leaves the spec; the record is all the next
    // operator has to tell what it created.
    tenants::api(&client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"namespaces": ["a"]}})),
        )
        .await
        .unwrap();
    let operator = Operator::start(Duration::from_secs(600)).await;
    wait_pruned(&client, &ns_b).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    assert_eq!(tenant.status.unwrap().namespaces, [ns_a]);
    delete_tenant(&client, &name).await;
    operator.stop().await;
}

#[tokio::test]
async fn an_object_forged_to_claim_a_tenant_app_is_never_pruned() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let operator = Operator::start(Duration::from_secs(600)).await;
    let name = unique_name("fapp");
    tenants::create(&client, &name, tenants::full_spec(&["x"])).await;
    tenants::wait_ready(&client, &name).await;
    let ns = format!("{name}-x");
    apps::create(&client, &ns, "web", apps::spec(0, "hello")).await;
    let app: TenantApp = apps::wait_ready(&client, &ns, "web").await;

    let forged = "alices-data";
    let mut meta = claiming(&app, forged, &name);
    meta["namespace"] = json!(ns);
    create_as::<ConfigMap>(
        "alice",
        &ns,
        json!({"metadata": meta, "data": {"precious": "yes"}}),
    )
    .await;
    let configs = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    wait_not_pruned("TenantApp", "web", forged, || async {
        configs.get_opt(forged).await.unwrap().is_some()
    })
    .await;
    let record: Vec<String> = apps::wait_ready(&client, &ns, "web")
        .await
        .status
        .unwrap()
        .created_children
        .iter()
        .map(|c| c.name.clone())
        .collect();
    assert!(
        record.contains(&"web-config".to_string()) && !record.contains(&forged.to_string()),
        "{record:?}"
    );
    delete_tenant(&client, &name).await;
    operator.stop().await;
}

/// Deletes Tenant `name` and waits until the object is gone.
async fn delete_tenant(client: &kube::Client, name: &str) {
    tenants::api(client)
        .delete(name, &Default::default())
        .await
        .unwrap();
    tenants::wait_tenant_object_gone(client, name).await;
}
