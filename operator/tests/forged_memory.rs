//! What objects that merely claim to be idem's children cost the operator: a tenant owner (who
//! holds `admin` in the tenant's namespaces) creates more than 100 MB of ConfigMaps and
//! RoleBindings labelled `app.kubernetes.io/managed-by=idem-operator`, with the owner-uid
//! label and the controller ownerReference of a TenantApp or of the Tenant (the strongest
//! forgery: everything but the owner's record of what it created). The operator runs as the
//! Deployment runs it (`--shards=auto`), as a process of its own, so its resident memory
//! (`VmRSS`) can be read: it must grow by less than [`BOUND_KIB`] once it has received them
//! all, the tenant and its app must keep converging, and an operator started again with those
//! objects present must stay under the same bound.
//!
//! Run: `cargo test -p idem-operator --test forged_memory -- --nocapture` (prints the figures).

mod common;
use common::users::client_as;

use common::process::OperatorProcess;
use common::{TIMEOUT, apps, eventually, install_crds, tenants, why};
use futures::{StreamExt, TryStreamExt};
use idem_operator::resources::{Tenant, TenantApp};
use idem_runtime::apply::{MANAGED_BY_LABEL, OWNER_UID_LABEL, TENANT_LABEL};
use idem_tests::{create_namespace, shared, unique_name};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

/// Forged ConfigMaps (a TenantApp's child kind) and the size of each one's data; etcd takes
/// requests of up to about 1.5 MB.
const CONFIGMAPS: usize = 110;
const CONFIGMAP_BYTES: usize = 950_000;
/// Forged RoleBindings (a Tenant's child kind), each with this many subjects of ~230 bytes.
const ROLEBINDINGS: usize = 4;
const SUBJECTS: usize = 3_500;
/// The most the operator's resident memory may grow by for all of them.
const BOUND_KIB: u64 = 5 * 1024;

/// Held by each test for its whole run: they count the API server's GETs of ConfigMaps and
/// Services (cluster-wide), which another test's operator would add to.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// The value of metric `name` (summed over its series) in an operator's `/metrics` text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until `op`'s child caches hold at least `objects` objects (the gauge is refreshed
/// every 2 s), and returns its metrics then.
async fn cached_at_least(op: &OperatorProcess, objects: f64) -> String {
    eventually(
        &format!("{objects} objects in the operator's child caches"),
        TIMEOUT,
        || async {
            let text = op.metrics().await.ok_or("no /metrics")?;
            let cached = metric(&text, "idem_shard_child_cache_objects");
            if cached >= objects {
                Ok(text)
            } else {
                Err(format!("{cached} cached\n{}", op.log_tail()))
            }
        },
    )
    .await
}

/// Waits until `op`'s child caches hold at least `more` stubs more than `before`
/// (`idem_shard_child_cache_stubs`, refreshed every 2 s).
async fn stubs_at_least(op: &OperatorProcess, before: f64, more: f64) {
    eventually(
        &format!("{more} more children kept as stubs"),
        TIMEOUT,
        || async {
            let text = op.metrics().await.ok_or("no /metrics")?;
            let stubs = metric(&text, "idem_shard_child_cache_stubs") - before;
            if stubs >= more {
                Ok(())
            } else {
                Err(format!("{stubs} stubs of {more}\n{}", op.log_tail()))
            }
        },
    )
    .await;
}

/// GET requests (reads of one object; lists and watches are counted apart) the API server
/// served on ConfigMaps and Services, two of the TenantApp's child kinds. RoleBindings are left
/// out: their counter also grows by reads that are not the operator's (seen while the forged
/// ones were created, before any reconcile could read them).
async fn child_gets() -> [u64; 2] {
    let text = shared().metrics().await.expect("apiserver /metrics");
    [("", "configmaps"), ("", "services")]
        .map(|(group, resource)| idem_tests::metrics::requests(&text, "GET", group, resource))
}

/// Changes the app's replicas and the tenant's quota, and waits until both are Ready at their
/// new generation.
async fn both_converge(client: &kube::Client, tenant: &str, ns: &str, app: &str, round: i32) {
    let pods = (20 + round).to_string();
    let patch = json!({"spec": {"quota": {"hard": {"pods": pods}}}});
    tenants::api(client)
        .patch(tenant, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patching the tenant");
    let patch = json!({"spec": {"replicas": 1 + round % 2}});
    Api::<TenantApp>::namespaced(client.clone(), ns)
        .patch(app, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patching the app");
    tenants::wait_ready(client, tenant).await;
    apps::wait_ready(client, ns, app).await;
}

/// Converges the tenant and app on a change (round `round`, see [`both_converge`]), waits for
/// the operator's allocator release after that work (`idem_memory_releases_total`, once per
/// burst), and returns its resident memory then: what it keeps, not what the burst held.
async fn rss_after_work(
    op: &OperatorProcess,
    client: &kube::Client,
    (tenant, ns, app): (&str, &str, &str),
    round: i32,
) -> u64 {
    let releases = || async {
        let text = op.metrics().await.ok_or("no /metrics")?;
        Ok::<f64, String>(metric(&text, "idem_memory_releases_total"))
    };
    let before = eventually("the operator's /metrics", TIMEOUT, releases).await;
    both_converge(client, tenant, ns, app, round).await;
    eventually("a memory release after the work", TIMEOUT, || async {
        let now = releases().await?;
        if now > before {
            Ok(())
        } else {
            Err(format!("{now} releases"))
        }
    })
    .await;
    op.rss_kib()
}

/// Creates the forged objects as the tenant owner `alice`; returns their bytes of payload.
async fn forge(tenant: &Tenant, app: &TenantApp, ns: &str) -> usize {
    let owner = client_as("alice");
    let pp = PostParams {
        field_manager: Some("idem-operator".into()),
        ..PostParams::default()
    };
    let name = tenant.name_any();
    let configmaps: Api<ConfigMap> = Api::namespaced(owner.clone(), ns);
    let blob = "x".repeat(CONFIGMAP_BYTES);
    futures::stream::iter(0..CONFIGMAPS)
        .map(|i| {
            let obj = json!({
                "metadata": claiming(app, &format!("forged-{i}"), &name),
                "data": {"blob": blob},
            });
            let (configmaps, pp) = (&configmaps, &pp);
            async move {
                let cm: ConfigMap = serde_json::from_value(obj).unwrap();
                configmaps.create(pp, &cm).await.map(|_| ())
            }
        })
        .buffer_unordered(4)
        .try_collect::<Vec<()>>()
        .await
        .unwrap_or_else(|e| panic!("alice creates a ConfigMap: {e}"));
    let bindings: Api<RoleBinding> = Api::namespaced(owner, ns);
    let subjects: Vec<Value> = (0..SUBJECTS)
        .map(|i| json!({"kind": "User", "name": format!("u{i:05}-{}", "y".repeat(200))}))
        .collect();
    for i in 0..ROLEBINDINGS {
        let obj = json!({
            "metadata": claiming(tenant, &format!("forged-{i}"), &name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": subjects,
        });
        let rb: RoleBinding = serde_json::from_value(obj).unwrap();
        bindings
            .create(&pp, &rb)
            .await
            .unwrap_or_else(|e| panic!("alice creates a RoleBinding: {e}"));
    }
    CONFIGMAPS * CONFIGMAP_BYTES + ROLEBINDINGS * serde_json::to_vec(&subjects).unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_children_cost_the_operator_a_bounded_amount_of_memory() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let lease_ns = create_namespace(&client, "memlease").await.unwrap();
    let op = OperatorProcess::spawn(&lease_ns, "idem-operator-mem-a");

    let name = unique_name("mem");
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    let ns = format!("{name}-a");
    apps::create(&client, &ns, "web", apps::spec(1, "x = 1")).await;
    let app = apps::wait_ready(&client, &ns, "web").await;
    // The tenant's five children and the app's three.
    let genuine = 8.0;
    let before = cached_at_least(&op, genuine).await;
    both_converge(&client, &name, &ns, "web", 1).await;
    let rss_before = op.rss_kib();
    let received_before = metric(&before, "idem_received_bytes_total");

    let payload = forge(&tenant, &app, &ns).await;
    let forged = (CONFIGMAPS + ROLEBINDINGS) as f64;
    let after = cached_at_least(&op, genuine + forged).await;
    let received = metric(&after, "idem_received_bytes_total") - received_before;
    assert!(
        received >= payload as f64,
        "the operator received the forged objects: {received} B of {payload} B"
    );
    let rss_after = op.rss_kib();
    println!(
        "forged {} objects, {:.1} MB of payload ({:.1} MB received): operator RSS {rss_before} KiB → {rss_after} KiB ({:+} KiB)",
        CONFIGMAPS + ROLEBINDINGS,
        payload as f64 / 1e6,
        received / 1e6,
        rss_after as i64 - rss_before as i64,
    );
    assert!(
        rss_after < rss_before + BOUND_KIB,
        "{:.1} MB of forged children grew the operator's RSS from {rss_before} KiB to {rss_after} KiB",
        payload as f64 / 1e6
    );
    both_converge(&client, &name, &ns, "web", 2).await;
    for cm in 0..CONFIGMAPS {
        let got = Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get_opt(&format!("forged-{cm}"))
            .await
            .map_err(why)
            .unwrap();
        assert!(
            got.is_some(),
            "the operator deleted forged-{cm}, alice's own"
        );
    }

    // Started again with the forged objects present: its first lists bring them all at once.
    drop(op);
    let gets_before = child_gets().await;
    let op = OperatorProcess::spawn(&lease_ns, "idem-operator-mem-b");
    cached_at_least(&op, genuine + forged).await;
    both_converge(&client, &name, &ns, "web", 3).await;
    // Its own children came whole from its first lists (the records were listed first), and
    // the forged objects, at names it does not desire, are never read.
    assert_eq!(
        child_gets().await,
        gets_before,
        "GETs of ConfigMaps and Services by the restarted operator"
    );
    let rss_restarted = op.rss_kib();
    println!(
        "restarted with them present: operator RSS {rss_restarted} KiB ({:+} KiB against the first operator's {rss_before} KiB)",
        rss_restarted as i64 - rss_before as i64
    );
    assert!(
        rss_restarted < rss_before + BOUND_KIB,
        "restarted with {:.1} MB of forged children present, the operator's RSS is {rss_restarted} KiB (first operator: {rss_before} KiB)",
        payload as f64 / 1e6
    );
    // Its child watches streamed their lists (the server serves them): no list was held whole.
    let log = std::fs::read_to_string(&op.log).unwrap_or_default();
    assert!(
        !log.contains("streaming lists refused"),
        "{}",
        op.log_tail()
    );
    tenants::api(&client)
        .delete(&name, &Default::default())
        .await
        .expect("deleting the tenant");
    // Gone before the next test: their stubs would leave its count of stubs meanwhile.
    tenants::wait_gone(&client, &name).await;
}

/// The operator as its own process (its shard ring in a namespace of its own) and a Ready
/// Tenant named after `prefix` with namespace `a`: how the padding tests start.
async fn operator_and_tenant(prefix: &str) -> (OperatorProcess, kube::Client, String) {
    let client = shared().client();
    install_crds(&client).await;
    let lease_ns = create_namespace(&client, &format!("{prefix}lease"))
        .await
        .unwrap();
    let op = OperatorProcess::spawn(&lease_ns, &format!("idem-operator-{prefix}"));
    let name = unique_name(prefix);
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;
    tenants::wait_ready(&client, &name).await;
    (op, client, name)
}

/// Sets app `i`'s config to `x = <i + base>` for every app, and waits until all are Ready.
async fn change_every_app(client: &kube::Client, ns: &str, apps: &[String], base: usize) {
    for (i, app) in apps.iter().enumerate() {
        let patch = json!({"spec": {"config": {"app.toml": format!("x = {}", i + base)}}});
        Api::<TenantApp>::namespaced(client.clone(), ns)
            .patch(app, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patching an app");
    }
    for app in apps {
        apps::wait_ready(client, ns, app).await;
    }
}

/// Deletes Tenant `name` and waits until it and its namespaces are gone.
async fn delete_tenant(client: &kube::Client, name: &str) {
    tenants::api(client)
        .delete(name, &Default::default())
        .await
        .expect("deleting the tenant");
    tenants::wait_gone(client, name).await;
}

/// Apps whose children a tenant owner pads in [`padded_own_children_cost_a_bounded_amount`].
const PADDED_APPS: usize = 12;
/// What the owner adds to each app's ConfigMap (a `data` key; a ConfigMap holds up to 1 MiB), and
/// to other children (an annotation; the API server takes 256 kB of annotations).
const PAD_DATA_BYTES: usize = 1_000_000;
const PAD_ANNOTATION_BYTES: usize = 200_000;
/// The most the operator's resident memory may grow by for what the owner adds: with the
/// caches' bound it grew by 3.3–4.1 MB in runs with 10 apps (buffers of the ~1 MB reads and
/// events, whatever the number of padded children), and by 10.7 MB without it.
const PADDED_BOUND_KIB: u64 = 7 * 1024;

/// Adds `body` to `name` of kind `K` in `ns` as the tenant owner `alice`, under a field manager
/// of her own; returns the bytes added.
async fn pad<K>(ns: &str, name: &str, body: Value) -> usize
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client_as("alice"), ns);
    let pp = PatchParams {
        field_manager: Some("alice-pad".into()),
        ..PatchParams::default()
    };
    api.patch(name, &pp, &Patch::Merge(&body))
        .await
        .unwrap_or_else(|e| panic!("alice pads {} {ns}/{name}: {e}", K::kind(&())));
    serde_json::to_vec(&body).unwrap().len()
}

/// What a tenant owner adds to idem's own children (a large key in an app's ConfigMap,
/// annotations on its Deployment and Service, on the namespace's `idem-owners` RoleBinding and
/// `idem-isolation` NetworkPolicy, supplemental groups inside one Deployment's pod security
/// context, which idem's create left empty) is theirs: idem leaves it in place, and its caches
/// keep each such child as a stub (`idem_shard_child_cache_stubs`), so the operator's memory
/// stays bounded while every app and the tenant keep converging, a pass reading a padded child
/// from the API server only once it or its desired body changed since it was judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn padded_own_children_cost_a_bounded_amount() {
    let _alone = ONE_AT_A_TIME.lock().await;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::networking::v1::NetworkPolicy;

    let (op, client, name) = operator_and_tenant("pad").await;
    let ns = format!("{name}-a");
    let apps: Vec<String> = (0..PADDED_APPS).map(|i| format!("web-{i}")).collect();
    for app in &apps {
        apps::create(&client, &ns, app, apps::spec(1, "x = 1")).await;
    }
    for app in &apps {
        apps::wait_ready(&client, &ns, app).await;
    }
    // The tenant's five children and each app's three.
    let genuine = (5 + 3 * PADDED_APPS) as f64;
    let before = cached_at_least(&op, genuine).await;
    let stubs_before = metric(&before, "idem_shard_child_cache_stubs");
    let rss_before = rss_after_work(&op, &client, (&name, &ns, &apps[0]), 1).await;

    let note =
        |n: usize| json!({"metadata": {"annotations": {"alice.example/pad": "p".repeat(n)}}});
    let mut payload = 0;
    for (i, app) in apps.iter().enumerate() {
        let data = json!({"data": {"pad": "d".repeat(PAD_DATA_BYTES)}});
        payload += pad::<ConfigMap>(&ns, &format!("{app}-config"), data).await;
        let deployment = if i == 0 {
            // Inside a struct the create's entry owns as an empty leaf.
            let groups = vec![1_000_000_007_u64; PAD_ANNOTATION_BYTES / 11];
            let sc = json!({"supplementalGroups": groups});
            json!({"spec": {"template": {"spec": {"securityContext": sc}}}})
        } else {
            note(PAD_ANNOTATION_BYTES)
        };
        payload += pad::<Deployment>(&ns, app, deployment).await;
        payload += pad::<Service>(&ns, app, note(PAD_ANNOTATION_BYTES)).await;
    }
    payload += pad::<RoleBinding>(&ns, "idem-owners", note(PAD_ANNOTATION_BYTES)).await;
    payload += pad::<NetworkPolicy>(&ns, "idem-isolation", note(PAD_ANNOTATION_BYTES)).await;
    let padded = (3 * PADDED_APPS + 2) as f64;
    stubs_at_least(&op, stubs_before, padded).await;
    let rss_after = rss_after_work(&op, &client, (&name, &ns, &apps[0]), 2).await;
    println!(
        "padded {padded} of idem's children with {:.1} MB: operator RSS {rss_before} KiB → {rss_after} KiB ({:+} KiB)",
        payload as f64 / 1e6,
        rss_after as i64 - rss_before as i64,
    );
    assert!(
        rss_after < rss_before + PADDED_BOUND_KIB,
        "{:.1} MB added to idem's own children grew the operator's RSS from {rss_before} KiB to {rss_after} KiB",
        payload as f64 / 1e6
    );
    // Every app converges on a change, its padded children read from the API server, and
    // what alice added is hers: still there.
    let [configmaps, services] = child_gets().await;
    change_every_app(&client, &ns, &apps, 2).await;
    // Counted before this test's own reads of the ConfigMaps below.
    let [configmaps_now, services_now] = child_gets().await;
    for (i, app) in apps.iter().enumerate() {
        let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get(&format!("{app}-config"))
            .await
            .expect("reading the app's ConfigMap");
        let data = cm.data.unwrap_or_default();
        assert_eq!(data.get("pad").map(String::len), Some(PAD_DATA_BYTES));
        assert_eq!(
            data.get("app.toml").map(String::as_str),
            Some(format!("x = {}", i + 2).as_str())
        );
    }
    assert!(
        configmaps_now >= configmaps + PADDED_APPS as u64,
        "each app's padded ConfigMap read by GET: {} GETs ({} of Services)",
        configmaps_now - configmaps,
        services_now - services
    );
    // Once judged converged at a version, a stub is not read again while it and its desired
    // body stay as they are: a second change of every app reads each padded ConfigMap (its
    // desired body changed) and none of the Services (unchanged, judged since the padding).
    let [configmaps, services] = child_gets().await;
    change_every_app(&client, &ns, &apps, 100).await;
    let [configmaps_now, services_now] = child_gets().await;
    assert!(
        configmaps_now >= configmaps + PADDED_APPS as u64 && services_now == services,
        "a changed app's padded ConfigMap read, its unchanged padded Service not: {} and {} GETs",
        configmaps_now - configmaps,
        services_now - services
    );
    let rb = Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .get("idem-owners")
        .await
        .expect("reading idem-owners");
    assert!(rb.annotations().contains_key("alice.example/pad"));
    delete_tenant(&client, &name).await;
}

/// A child kept as a stub keeps only its controller ownerReference; released (its namespace
/// taken out of the spec under `deletionPolicy: Retain`) it keeps every other ownerReference
/// on it: the release works from the object as the API server has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_padded_child_released_keeps_its_other_owner_references() {
    let _alone = ONE_AT_A_TIME.lock().await;
    use idem_operator::resources::tenant::DeletionPolicy;
    use idem_operator::tenant::desired::OWNERS;

    let client = shared().client();
    install_crds(&client).await;
    let lease_ns = create_namespace(&client, "padrelease").await.unwrap();
    let op = OperatorProcess::spawn(&lease_ns, "idem-operator-padrelease");
    let name = unique_name("padrel");
    let mut spec = tenants::full_spec(&["a", "b"]);
    spec.deletion_policy = DeletionPolicy::Retain;
    let tenant = tenants::create(&client, &name, spec).await;
    tenants::wait_ready(&client, &name).await;
    let before = cached_at_least(&op, 9.0).await;
    let stubs_before = metric(&before, "idem_shard_child_cache_stubs");

    // Alice's own ConfigMap becomes a second owner of `idem-owners`, which she pads.
    let kept = format!("{name}-b");
    let data: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "data"}, "data": {"k": "v"}})).unwrap();
    let data = Api::<ConfigMap>::namespaced(client_as("alice"), &kept)
        .create(&PostParams::default(), &data)
        .await
        .expect("alice's ConfigMap");
    let reference = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "data",
                           "uid": data.uid().unwrap()});
    Api::<RoleBinding>::namespaced(client_as("alice"), &kept)
        .patch(
            OWNERS,
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {
                "ownerReferences": [reference],
                "annotations": {"alice.example/pad": "p".repeat(PAD_ANNOTATION_BYTES)},
            }})),
        )
        .await
        .expect("alice pads idem-owners");
    stubs_at_least(&op, stubs_before, 1.0).await;

    tenants::api(&client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"namespaces": ["a"]}})),
        )
        .await
        .expect("taking namespace b out of the spec");
    let uid = tenant.uid().unwrap();
    let owners = eventually("idem-owners released from the Tenant", TIMEOUT, || async {
        let rb = Api::<RoleBinding>::namespaced(client.clone(), &kept)
            .get(OWNERS)
            .await
            .map_err(why)?;
        let refs = rb.metadata.owner_references.clone().unwrap_or_default();
        if refs.iter().any(|r| r.uid == uid) {
            Err(format!("{refs:?}"))
        } else {
            Ok(rb)
        }
    })
    .await;
    let refs = owners.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        refs.iter().any(|r| Some(&r.uid) == data.uid().as_ref()),
        "alice's ownerReference is kept: {refs:?}"
    );
    assert!(owners.annotations().contains_key("alice.example/pad"));
    tenants::api(&client)
        .delete(&name, &Default::default())
        .await
        .expect("deleting the tenant");
    tenants::wait_tenant_object_gone(&client, &name).await;
    // Both namespaces are kept (Retain): removed here, and gone before the next test.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for short in ["a", "b"] {
        let _ = namespaces
            .delete(&format!("{name}-{short}"), &Default::default())
            .await;
    }
    eventually("the kept namespaces gone", TIMEOUT, || async {
        let mut left = Vec::new();
        for short in ["a", "b"] {
            let ns = format!("{name}-{short}");
            if namespaces.get_opt(&ns).await.map_err(why)?.is_some() {
                left.push(ns);
            }
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
}

/// A write under idem's field manager name into a child idem created and never applied to (a
/// merge patch with `fieldManager=idem-operator` merges into the create's `Update` entry) is
/// not kept for good: more than the server's defaults beyond the desired body in that entry
/// is judged never applied, and the fold and apply that follow remove it. Kept, the caches
/// would hold it whole (they count that entry as idem's) and no pass would see it as drift.
/// Nor does rewriting `managedFields` so that idem's entry claims `data` whole hide what the
/// tenant wrote in it: the apply makes idem's entry list its own keys again, and the tenant's
/// key, kept, makes the child a stub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_under_idems_name_into_its_create_record_is_removed() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (op, client, name) = operator_and_tenant("padname").await;
    let ns = format!("{name}-a");
    apps::create(&client, &ns, "web", apps::spec(1, "x = 1")).await;
    apps::wait_ready(&client, &ns, "web").await;

    let configmaps = Api::<ConfigMap>::namespaced(client_as("alice"), &ns);
    let under_our_name = PatchParams {
        field_manager: Some("idem-operator".into()),
        ..PatchParams::default()
    };
    let padded = configmaps
        .patch(
            "web-config",
            &under_our_name,
            &Patch::Merge(&json!({"data": {"pad": "d".repeat(PAD_ANNOTATION_BYTES)}})),
        )
        .await
        .expect("alice writes under idem's name");
    let entries = padded.metadata.managed_fields.clone().unwrap_or_default();
    assert!(
        entries
            .iter()
            .all(|e| e.operation.as_deref() == Some("Update")),
        "the write merged into the create's record, never applied to: {entries:?}"
    );
    eventually("the write under idem's name removed", TIMEOUT, || async {
        let cm = configmaps.get("web-config").await.map_err(why)?;
        let data = cm.data.unwrap_or_default();
        match (data.get("pad"), data.get("app.toml")) {
            (None, Some(config)) if config == "x = 1" => Ok(()),
            (pad, config) => Err(format!(
                "pad: {:?} bytes, app.toml: {config:?}",
                pad.map(String::len)
            )),
        }
    })
    .await;
    apps::wait_ready(&client, &ns, "web").await;

    // The same, hidden: alice pads under her own name, then rewrites `managedFields` to hold
    // only idem's entry, claiming `data` whole (`"f:data": {}`), so the check sees only idem's
    // key and the caches count nothing inside.
    let stubs_before = metric(
        &op.metrics().await.expect("operator /metrics"),
        "idem_shard_child_cache_stubs",
    );
    apps::create(&client, &ns, "web2", apps::spec(1, "y = 1")).await;
    apps::wait_ready(&client, &ns, "web2").await;
    pad::<ConfigMap>(
        &ns,
        "web2-config",
        json!({"data": {"pad": "d".repeat(PAD_ANNOTATION_BYTES)}}),
    )
    .await;
    let cm = configmaps
        .get("web2-config")
        .await
        .expect("reading web2-config");
    let mut ours: Vec<Value> = (cm.metadata.managed_fields.clone().unwrap_or_default())
        .into_iter()
        .filter(|e| e.manager.as_deref() == Some("idem-operator"))
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    assert_eq!(ours.len(), 1, "idem's create record alone: {ours:?}");
    ours[0]["fieldsV1"]["f:data"] = json!({});
    configmaps
        .patch(
            "web2-config",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"managedFields": ours}})),
        )
        .await
        .expect("alice rewrites managedFields");
    let claims_whole = |cm: &ConfigMap| {
        cm.metadata.managed_fields.iter().flatten().any(|e| {
            e.manager.as_deref() == Some("idem-operator")
                && e.fields_v1.as_ref().map(|f| &f.0["f:data"]) == Some(&json!({}))
        })
    };
    let now = configmaps
        .get("web2-config")
        .await
        .expect("reading web2-config");
    assert!(
        claims_whole(&now),
        "the rewrite took: {:?}",
        now.metadata.managed_fields
    );
    let after = eventually(
        "idem's entry no longer claims data whole",
        TIMEOUT,
        || async {
            let cm = configmaps.get("web2-config").await.map_err(why)?;
            if claims_whole(&cm) {
                Err(format!("{:?}", cm.metadata.managed_fields))
            } else {
                Ok(cm)
            }
        },
    )
    .await;
    // What alice wrote is hers, owned by no entry now: kept, and counted, so the child is a
    // stub in the caches.
    let data = after.data.clone().unwrap_or_default();
    assert_eq!(data.get("pad").map(String::len), Some(PAD_ANNOTATION_BYTES));
    assert_eq!(data.get("app.toml").map(String::as_str), Some("y = 1"));
    stubs_at_least(&op, stubs_before, 1.0).await;
    apps::wait_ready(&client, &ns, "web2").await;
    delete_tenant(&client, &name).await;
}

/// Two more ways a tenant owner could hide what they add from the caches' count, or make idem
/// write on every pass, stay bounded:
/// - paths that lead to nothing, written into the record of idem's create (2,000 annotation
///   paths the object does not have), count by their text: above 16 KiB the child is judged
///   never applied, and the fold and apply leave idem's entry with its own fields;
/// - a key written into an app's `data` that idem desires empty (an app without config, whose
///   apply records `data` whole) is the tenant's, not drift: more app passes make no write to
///   the ConfigMap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_to_nothing_and_keys_in_an_empty_config_cost_no_writes_and_bounded_memory() {
    let _alone = ONE_AT_A_TIME.lock().await;
    use k8s_openapi::api::core::v1::Service;

    let (op, client, name) = operator_and_tenant("padjunk").await;
    let ns = format!("{name}-a");
    let mut bare = apps::spec(1, "");
    bare.config.clear();
    apps::create(&client, &ns, "bare", bare).await;
    apps::wait_ready(&client, &ns, "bare").await;
    let stubs = || async {
        let text = op.metrics().await.expect("operator /metrics");
        metric(&text, "idem_shard_child_cache_stubs")
    };

    // Paths to nothing under idem's name, in the Service's managedFields.
    let services = Api::<Service>::namespaced(client_as("alice"), &ns);
    let svc = services.get("bare").await.expect("reading the Service");
    let junk: serde_json::Map<String, Value> = (0..2_000)
        .map(|i| (format!("f:alice.example/j{i:05}"), json!({})))
        .collect();
    let mut entries: Vec<Value> = (svc.metadata.managed_fields.clone().unwrap_or_default())
        .into_iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    let ours = entries
        .iter_mut()
        .find(|e| e["manager"] == "idem-operator")
        .expect("idem's entry on its Service");
    // Beside what the entry lists (the fingerprint annotation included, so it is still the
    // record of idem's create).
    let annotations = ours["fieldsV1"]["f:metadata"]["f:annotations"]
        .as_object_mut()
        .expect("idem's entry lists its annotations");
    annotations.extend(junk);
    let before = stubs().await;
    let written = services
        .patch(
            "bare",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"managedFields": entries}})),
        )
        .await
        .expect("alice writes paths to nothing under idem's name");
    let junk_in = |svc: &Service| {
        serde_json::to_string(&svc.metadata.managed_fields)
            .unwrap()
            .contains("alice.example/j01999")
    };
    assert!(junk_in(&written), "the server keeps paths to nothing");
    // More than the server's defaults beyond the desired body: judged never applied, and the
    // fold and apply leave idem's entry with its own fields only.
    eventually("the paths to nothing gone", TIMEOUT, || async {
        let svc = services.get("bare").await.map_err(why)?;
        if junk_in(&svc) {
            Err("still there".to_owned())
        } else {
            Ok(())
        }
    })
    .await;

    // A key in the ConfigMap whose `data` idem desires empty.
    pad::<ConfigMap>(
        &ns,
        "bare-config",
        json!({"data": {"pad": "d".repeat(PAD_ANNOTATION_BYTES)}}),
    )
    .await;
    stubs_at_least(&op, before, 1.0).await;
    let writes = || async {
        let text = shared().metrics().await.expect("apiserver /metrics");
        idem_tests::metrics::writes(&text, "", "configmaps")
    };
    let written = writes().await;
    for replicas in [2, 1] {
        Api::<TenantApp>::namespaced(client.clone(), &ns)
            .patch(
                "bare",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"replicas": replicas}})),
            )
            .await
            .expect("patching the app");
        apps::wait_ready(&client, &ns, "bare").await;
    }
    assert_eq!(
        writes().await,
        written,
        "writes to ConfigMaps while the app converged twice"
    );
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("bare-config")
        .await
        .expect("reading bare-config");
    assert_eq!(
        cm.data.unwrap_or_default().get("pad").map(String::len),
        Some(PAD_ANNOTATION_BYTES)
    );
    delete_tenant(&client, &name).await;
}
