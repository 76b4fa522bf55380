//! Objects in idem's way, against the real control plane: a foreign object that takes a
//! child's name (`ChildNotOwned`) is watched by itself and its deletion brings the owner back
//! at once, for a Tenant as for a TenantApp; those watches end with the controllers that
//! started them (a shard ring change restarts the controllers) and when the object is gone;
//! and objects forged to claim a Tenant cost one `NotPruned` Warning per set of them, however
//! many there are; apps outside tenant namespaces, looked at again now and then, cost one read
//! of their namespace per period, however many there are.
//!
//! The tests of this binary run one at a time: each starts and stops its own operator (with a
//! 10 min resync, so only a watch can bring an owner back within the waits).

mod common;
use common::users::client_as;

use std::time::Duration;

use common::{Operator, TIMEOUT, apps, eventually, install_crds, tenants, why};
use idem_operator::resources::Tenant;
use idem_operator::tenant::desired::OWNERS;
use idem_operator::tenant_app::desired::config_map_name;
use idem_runtime::apply::{MANAGED_BY_LABEL, OWNER_UID_LABEL, TENANT_LABEL};
use idem_runtime::shard::{Ring, fnv1a64};
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// The resync of the operators of these tests: longer than any wait.
const RESYNC: Duration = Duration::from_secs(600);

/// Sets `spec.paused` of tenant `name` and waits until the operator has seen it.
async fn set_paused(client: &kube::Client, name: &str, paused: bool) -> Tenant {
    tenants::api(client)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"paused": paused}})),
        )
        .await
        .unwrap();
    if paused {
        tenants::wait_condition(client, name, "Stalled", "Paused").await
    } else {
        tenants::api(client).get(name).await.unwrap()
    }
}

/// Deletes Tenant `name` and waits until the object is gone.
async fn delete_tenant(client: &kube::Client, name: &str) {
    tenants::api(client)
        .delete(name, &Default::default())
        .await
        .unwrap();
    tenants::wait_tenant_object_gone(client, name).await;
}

/// The value of gauge `name{controller="<controller>"}` in a `/metrics` text (0 when absent).
fn gauge_in(metrics: &str, name: &str, controller: &str) -> i64 {
    let label = format!("controller=\"{controller}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as i64)
        .sum()
}

/// The value of the unlabelled gauge `name` in a `/metrics` text.
fn plain_gauge(metrics: &str, name: &str) -> Option<i64> {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as i64)
}

#[tokio::test]
async fn a_tenant_blocked_by_a_foreign_role_binding_recovers_as_soon_as_it_is_deleted() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let operator = Operator::start(RESYNC).await;
    let name = unique_name("rbclash");
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;
    tenants::wait_ready(&client, &name).await;
    let ns = format!("{name}-a");
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);

    // While the tenant is paused, idem's `idem-owners` is replaced by someone's own binding of
    // that name, without idem's labels (so no owned-child watch sees it).
    set_paused(&client, &name, true).await;
    bindings
        .delete(OWNERS, &DeleteParams::default())
        .await
        .unwrap();
    eventually("idem-owners gone", TIMEOUT, || async {
        match bindings.get_opt(OWNERS).await.map_err(why)? {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
    let foreign: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": OWNERS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    }))
    .unwrap();
    bindings
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    set_paused(&client, &name, false).await;
    tenants::wait_condition(&client, &name, "Stalled", "ChildNotOwned").await;

    // Its deletion brings the tenant back: no resync for 10 minutes and no poll.
    bindings
        .delete(OWNERS, &DeleteParams::default())
        .await
        .unwrap();
    let tenant = tenants::wait_ready(&client, &name).await;
    let ours = bindings.get(OWNERS).await.unwrap();
    tenants::assert_owned(&ours.metadata, &tenant);
    assert_eq!(ours.role_ref.name, "admin", "idem's binding is back");
    delete_tenant(&client, &name).await;
    operator.stop().await;
}

/// An operator with `--shards=auto` as `identity`, its member Lease in `lease_ns`.
async fn sharded_operator(lease_ns: &str, identity: &str) -> Operator {
    let mut operator = Operator::spawn_configured(RESYNC, None, |o| {
        o.shards = true;
        o.leader_elect_namespace = Some(lease_ns.to_string());
        o.identity = Some(identity.to_string());
    });
    operator.wait_ready().await;
    operator
}

/// Waits until `operator` works on a ring of `members` members.
async fn wait_ring(operator: &Operator, members: i64) {
    eventually(&format!("a ring of {members} members"), TIMEOUT, || async {
        let m = operator.metrics().await;
        let seen = (
            plain_gauge(&m, "idem_shard_members"),
            plain_gauge(&m, "idem_shard_working"),
        );
        if seen == (Some(members), Some(1)) {
            Ok(())
        } else {
            Err(format!("members, working: {seen:?}"))
        }
    })
    .await
}

/// Waits until `operator` made `n` more TenantApp reconciles than `since`, then until its
/// blocked-object watches of the TenantApp controller are exactly `watches`.
async fn wait_watches(operator: &Operator, since: u64, n: u64, watches: i64) {
    eventually("the apps reconciled on the new ring", TIMEOUT, || async {
        let done = operator.reconciles("tenantapp").await;
        (done >= since + n)
            .then_some(())
            .ok_or_else(|| format!("{done} reconciles, since {since}"))
    })
    .await;
    eventually(
        &format!("{watches} blocked-object watches"),
        TIMEOUT,
        || async {
            let m = operator.metrics().await;
            let got = gauge_in(&m, "idem_blocked_object_watches", "tenantapp");
            (got == watches)
                .then_some(())
                .ok_or_else(|| format!("{got} watches"))
        },
    )
    .await;
}

#[tokio::test]
async fn blocked_object_watches_end_with_the_shard_epoch_that_started_them() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let lease_ns = unique_name("ring");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": lease_ns}})).unwrap(),
        )
        .await
        .unwrap();
    let (id_a, id_b) = (unique_name("ra"), unique_name("rb"));
    // A tenant whose app namespace replica a keeps when b joins, so that a reconciles the
    // apps in every ring.
    let both = Ring::new([id_a.as_str(), id_b.as_str()]);
    let name = std::iter::repeat_with(|| unique_name("wring"))
        .find(|t| both.owner_of(fnv1a64(format!("{t}-apps").as_bytes())) == Some(id_a.as_str()))
        .unwrap();
    let ns = format!("{name}-apps");
    let a = sharded_operator(&lease_ns, &id_a).await;
    tenants::create(&client, &name, tenants::full_spec(&["apps"])).await;
    tenants::wait_ready(&client, &name).await;

    // Three apps, each blocked by someone's ConfigMap under its config's name.
    const APPS: usize = 3;
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let names: Vec<String> = (0..APPS).map(|i| format!("web{i}")).collect();
    for app in &names {
        let foreign: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": config_map_name(app)}, "data": {"mine": "yes"}
        }))
        .unwrap();
        configs
            .create(&PostParams::default(), &foreign)
            .await
            .unwrap();
        apps::create(&client, &ns, app, apps::spec(0, "x")).await;
    }
    for app in &names {
        apps::wait_condition(&client, &ns, app, "Stalled", "ChildNotOwned").await;
    }
    wait_ring(&a, 1).await;
    wait_watches(&a, 0, 0, APPS as i64).await;

    // b joins: a's controllers stop and start again on the new ring (and reconcile the apps
    // again); the watches of the stopped ones end with them.
    let since = a.reconciles("tenantapp").await;
    let b = sharded_operator(&lease_ns, &id_b).await;
    wait_ring(&a, 2).await;
    wait_watches(&a, since, APPS as u64, APPS as i64).await;

    // b leaves: the same again.
    let since = a.reconciles("tenantapp").await;
    b.stop().await;
    wait_ring(&a, 1).await;
    wait_watches(&a, since, APPS as u64, APPS as i64).await;

    // The blocked condition ends: the watches end, the apps converge.
    for app in &names {
        configs
            .delete(&config_map_name(app), &DeleteParams::default())
            .await
            .unwrap();
    }
    for app in &names {
        apps::wait_ready(&client, &ns, app).await;
    }
    eventually("no blocked-object watch left", TIMEOUT, || async {
        let got = gauge_in(
            &a.metrics().await,
            "idem_blocked_object_watches",
            "tenantapp",
        );
        (got == 0).then_some(()).ok_or_else(|| format!("{got}"))
    })
    .await;
    delete_tenant(&client, &name).await;
    a.stop().await;
}

/// Metadata claiming `owner` as idem would: its controller ownerReference and idem's labels.
fn claiming<K: Resource<DynamicType = ()>>(owner: &K, name: &str, ns: &str) -> serde_json::Value {
    json!({
        "name": name,
        "namespace": ns,
        "labels": {
            MANAGED_BY_LABEL: "idem-operator",
            OWNER_UID_LABEL: owner.uid().unwrap(),
            TENANT_LABEL: owner.name_any(),
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

/// How many times a `NotPruned` Warning was published about Tenant `name` (each Event counts
/// its series), and the notes.
async fn not_pruned(client: &kube::Client, name: &str) -> (i32, Vec<String>) {
    let events: Vec<Event> = tenants::events_about(client, name, "NotPruned").await;
    let count = events
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    let notes = events.iter().filter_map(|e| e.note.clone()).collect();
    (count, notes)
}

/// Changes tenant `name`'s weight (a spec change: one more reconcile) and waits for it.
async fn reconcile_again(client: &kube::Client, name: &str, weight: i32) {
    tenants::api(client)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"weight": weight}})),
        )
        .await
        .unwrap();
    tenants::wait_ready(client, name).await;
}

#[tokio::test]
async fn objects_forged_to_claim_a_tenant_cost_one_warning_per_set_whatever_their_count() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let operator = Operator::start(RESYNC).await;
    let name = unique_name("storm");
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;
    tenants::wait_ready(&client, &name).await;
    let ns = format!("{name}-a");

    // alice (tenant owner) makes many policies of her own that claim the Tenant as idem's
    // children do; the tenant is paused meanwhile, so one reconcile sees them all.
    const FORGED: usize = 30;
    let tenant = set_paused(&client, &name, true).await;
    let policies: Api<NetworkPolicy> = Api::namespaced(client_as("alice"), &ns);
    for i in 0..FORGED {
        let policy: NetworkPolicy = serde_json::from_value(json!({
            "metadata": claiming(&tenant, &format!("alices-{i}"), &ns),
            "spec": {"podSelector": {"matchLabels": {"app": "mine"}}},
        }))
        .unwrap();
        policies
            .create(&PostParams::default(), &policy)
            .await
            .unwrap();
    }
    set_paused(&client, &name, false).await;
    // Ready at the new generation: the reconcile's Events are published before its status.
    tenants::wait_ready(&client, &name).await;
    let (count, notes) = not_pruned(&client, &name).await;
    assert_eq!(
        count, 1,
        "one NotPruned Warning for the {FORGED} objects, not one per object: {notes:#?}"
    );
    assert!(
        notes[0].contains(&format!("{FORGED} objects")) && notes[0].contains("alices-"),
        "the Warning counts them and names some: {}",
        notes[0]
    );

    // Another reconcile with the same objects says nothing new.
    reconcile_again(&client, &name, 2).await;
    reconcile_again(&client, &name, 3).await;
    assert_eq!(
        not_pruned(&client, &name).await.0,
        1,
        "the set did not change"
    );

    // One more: the set changed, one more Warning.
    let policy: NetworkPolicy = serde_json::from_value(json!({
        "metadata": claiming(&tenant, "alices-last", &ns),
        "spec": {"podSelector": {}},
    }))
    .unwrap();
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let notes = eventually("a Warning for the new set", TIMEOUT, || async {
        let (count, notes) = not_pruned(&client, &name).await;
        if notes
            .iter()
            .any(|n| n.contains(&format!("{} objects", FORGED + 1)))
        {
            Ok((count, notes))
        } else {
            Err(format!("{count}: {notes:?}"))
        }
    })
    .await;
    assert_eq!(notes.0, 2, "{:#?}", notes.1);
    let left = Api::<NetworkPolicy>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(
        left.items
            .iter()
            .filter(|p| p.name_any().starts_with("alices-"))
            .count(),
        FORGED + 1,
        "none of alice's objects is deleted"
    );
    delete_tenant(&client, &name).await;
    operator.stop().await;
}

/// GET requests the API server served on core `resource`, from its own metrics.
async fn gets(resource: &str) -> u64 {
    let text = shared().metrics().await.expect("apiserver /metrics");
    idem_tests::metrics::requests(&text, "GET", "", resource)
}

#[tokio::test]
async fn apps_outside_tenant_namespaces_cost_one_read_per_namespace_whatever_their_count() {
    // Anyone who may create TenantApps in some namespace can create many outside tenant
    // namespaces. Each is looked at again every 30 s (its namespace may become a tenant's);
    // the namespace is read from the API server at most once per period for all of them,
    // not once per app.
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let operator = Operator::start(RESYNC).await;
    let ns = idem_tests::create_namespace(&client, "outside")
        .await
        .unwrap();
    const APPS: u64 = 20;
    for i in 0..APPS {
        apps::create(&client, &ns, &format!("a{i}"), apps::spec(0, "x")).await;
    }
    for i in 0..APPS {
        let name = format!("a{i}");
        apps::wait_condition(&client, &ns, &name, "Stalled", "NotInTenantNamespace").await;
    }
    let since = operator.reconciles("tenantapp").await;
    let before = gets("namespaces").await;
    // A full round of looks: every app reconciled once more.
    eventually("every app looked at again", TIMEOUT, || async {
        let done = operator.reconciles("tenantapp").await;
        (done >= since + APPS)
            .then_some(())
            .ok_or_else(|| format!("{done} reconciles, since {since}"))
    })
    .await;
    let read = gets("namespaces").await - before;
    println!("{APPS} apps outside tenant namespaces looked at again: {read} GET namespaces");
    assert!(
        read <= 2,
        "{APPS} apps in one namespace read it {read} times in one round of looks"
    );
    operator.stop().await;
}
