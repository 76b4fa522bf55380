//! Sharding on the real control plane, with the `ShardedListAndWatch` gate on and off: three
//! operator processes run with `--shards=auto`, every Tenant is written by exactly the replica
//! that owns its hash range (judged by the server's record: the `reportingInstance` of the
//! Events its writes leave), a replica killed with SIGKILL has its tenants taken over by the
//! others, and a replica that joins takes over about a quarter without any tenant written by
//! two replicas. With the gate on, the API server's own `shardSelector` filtering of Tenants
//! matches this side's FNV-1a hash exactly. Either way a replica's child caches hold only the
//! children of the Tenants and TenantApps it owns (its child watches select their bucket
//! labels), also after a replica leaves or joins, and a forged or removed bucket label is put
//! back by the owner without another replica writing.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::process::OperatorProcess;
use common::tenants::{self, full_spec};
use common::{apps, eventually, install_crds};
use idem_operator::resources::{Tenant, TenantPolicy};
use idem_operator::shard::NAMESPACE_BUCKET_LABEL;
use idem_runtime::apply::{MANAGED_BY_LABEL, SHARD_BUCKET_LABEL};
use idem_runtime::leader::{
    DEFAULT_LEASE_DURATION as LEASE_DURATION, DEFAULT_RETRY_PERIOD as RETRY_PERIOD,
};
use idem_runtime::shard::selector::with_selector;
use idem_runtime::shard::{BUCKETS, Ring, ShardField, bucket_of, fnv1a64};
use idem_tests::Options;
use idem_tests::{ControlPlane, unique_name};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, LimitRange, Namespace, ResourceQuota, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::api::{Patch, PatchParams};
use kube::{Client, ResourceExt};
use nix::sys::signal::Signal;

/// Tenants in each run.
const TENANTS: usize = 12;

/// Tenants the API server sent so far, by its own counts: the objects of lists (from etcd or
/// its watch cache) and the events of watches (the objects a streaming list starts with among
/// them).
fn tenants_sent(metrics: &str) -> i64 {
    let wanted = |line: &&str| {
        let of = |name: &str| {
            line.starts_with(&format!("{name}{{")) && line.contains("resource=\"tenants\"")
        };
        of("apiserver_watch_events_total")
            || of("apiserver_storage_list_returned_objects_total")
            || of("apiserver_cache_list_returned_objects_total")
    };
    (metrics.lines().filter(wanted))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as i64
}

/// One control plane at a time: each test starts its own (the gate is a start option).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn start_replica(cp: &ControlPlane, ns: &str, name: &str) -> OperatorProcess {
    OperatorProcess::spawn_with(cp.kubeconfig_path(), ns, name, |args| {
        args.into_iter()
            .filter(|a| a != "--leader-elect" && !a.starts_with("--shards"))
            .chain(["--shards=auto".to_string(), "--workers=2".to_string()])
            .collect()
    })
}

/// Per tenant uid: the replicas (`reportingInstance`) of its Events created after `since`
/// (an Event's `eventTime`, or its series' last observed time).
async fn writers(client: &Client, since: Timestamp) -> BTreeMap<String, BTreeSet<String>> {
    idem_tests::events::reporters(client, "Tenant", since)
        .await
        .expect("listing events")
}

/// The owner of `tenant` in the ring of `members`, by the hash of its uid.
fn owner(members: &[&str], tenant: &Tenant) -> String {
    let ring = Ring::new(members.iter().copied());
    let h = fnv1a64(tenant.uid().expect("a uid").as_bytes());
    ring.owner_of(h).expect("a non-empty ring").to_string()
}

/// Changes every tenant's spec (one more namespace, `tag`) from `since`, waits until all are
/// Ready again, and returns, per tenant, the replicas whose Events show they wrote it since.
async fn change_all(
    client: &Client,
    names: &[String],
    tag: &str,
) -> (Vec<Tenant>, BTreeMap<String, BTreeSet<String>>) {
    let since = Timestamp::now();
    for name in names {
        let patch = serde_json::json!({"spec": {"namespaces": ["a", tag]}});
        tenants::api(client)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patching a tenant");
    }
    let mut ready = Vec::new();
    for name in names {
        ready.push(tenants::wait_ready(client, name).await);
    }
    // The "Created" Event of the new namespace is written just before the status.
    let w = eventually(
        "an Event of every tenant's change",
        common::TIMEOUT,
        || async {
            let w = writers(client, since).await;
            let missing: Vec<String> = ready
                .iter()
                .filter(|t| !w.contains_key(&t.uid().unwrap_or_default()))
                .map(ResourceExt::name_any)
                .collect();
            if missing.is_empty() {
                Ok(w)
            } else {
                Err(format!("no Event yet of {missing:?}"))
            }
        },
    )
    .await;
    (ready, w)
}

/// Asserts each tenant was written by exactly its owner in the ring of `members`.
fn assert_written_by_owners(
    tenants: &[Tenant],
    writers: &BTreeMap<String, BTreeSet<String>>,
    members: &[&str],
    when: &str,
) -> BTreeMap<String, String> {
    let mut owners = BTreeMap::new();
    for t in tenants {
        let uid = t.uid().unwrap();
        let expected = owner(members, t);
        let got = writers.get(&uid).cloned().unwrap_or_default();
        assert_eq!(
            got,
            BTreeSet::from([expected.clone()]),
            "{when}: tenant {} must be written by its owner only",
            t.name_any()
        );
        owners.insert(t.name_any(), expected);
    }
    owners
}

/// With the gate on: the server's `shardSelector` on Tenants selects exactly the tenants whose
/// FNV-1a hash of the uid this side puts in those ranges.
async fn server_filters_like_this_side(client: &Client, tenants: &[Tenant], members: &[&str]) {
    let ring = Ring::new(members.iter().copied());
    for m in members {
        let ranges = ring.ranges_of(m);
        let selector = ranges.selector(ShardField::Uid).unwrap();
        let uri = with_selector(
            &"/apis/tenancy.idem.dev/v1alpha1/tenants".parse().unwrap(),
            &selector,
        );
        let req = http::Request::get(uri.to_string())
            .body(Vec::new())
            .unwrap();
        let list: serde_json::Value = client.request(req).await.expect("a sharded list");
        let got: BTreeSet<String> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        let want: BTreeSet<String> = tenants
            .iter()
            .filter(|t| ranges.contains(fnv1a64(t.uid().unwrap().as_bytes())))
            .map(|t| t.name_any())
            .collect();
        assert_eq!(got, want, "the server's shard of {m}");
    }
    // Built-in kinds echo the selector.
    let uri = with_selector(
        &"/api/v1/namespaces".parse().unwrap(),
        &ring
            .ranges_of(members[0])
            .selector(ShardField::Uid)
            .unwrap(),
    );
    let req = http::Request::get(uri.to_string())
        .body(Vec::new())
        .unwrap();
    let list: serde_json::Value = client.request(req).await.unwrap();
    assert!(
        list["metadata"]["shardInfo"]["selector"].is_string(),
        "{}",
        list["metadata"]
    );
}

/// The owner of namespace `ns`, and so of the TenantApps in it, in the ring of `members`, by
/// the hash of its name.
fn namespace_owner(members: &[&str], ns: &str) -> String {
    let ring = Ring::new(members.iter().copied());
    let h = fnv1a64(ns.as_bytes());
    ring.owner_of(h).expect("a non-empty ring").to_string()
}

/// Per member of `members`: how many children (every kind the Tenant and TenantApp controllers
/// own, labelled as the operator's) belong to a Tenant or TenantApp it owns, by the child's
/// controller ownerReference (not by its labels): a Tenant's by its uid, a TenantApp's by its
/// namespace; and the total.
async fn children_per_owner(
    client: &Client,
    tenants: &[Tenant],
    members: &[&str],
) -> (BTreeMap<String, i64>, i64) {
    /// The (owner kind, owner uid, namespace) of each child of kind `K`.
    async fn owners<K>(client: &Client) -> Vec<(String, String, Option<String>)>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let lp = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}=idem-operator"));
        Api::<K>::all(client.clone())
            .list(&lp)
            .await
            .expect("listing children")
            .items
            .iter()
            .filter_map(|c| {
                let r = (c.meta().owner_references.iter().flatten())
                    .find(|r| r.controller == Some(true))?;
                Some((r.kind.clone(), r.uid.clone(), c.namespace()))
            })
            .collect()
    }
    let by_uid: BTreeMap<String, String> = tenants
        .iter()
        .map(|t| (t.uid().unwrap(), owner(members, t)))
        .collect();
    let mut children = owners::<Namespace>(client).await;
    children.extend(owners::<ResourceQuota>(client).await);
    children.extend(owners::<LimitRange>(client).await);
    children.extend(owners::<RoleBinding>(client).await);
    children.extend(owners::<NetworkPolicy>(client).await);
    children.extend(owners::<TenantPolicy>(client).await);
    children.extend(owners::<ConfigMap>(client).await);
    children.extend(owners::<Deployment>(client).await);
    children.extend(owners::<Service>(client).await);
    let mut counts: BTreeMap<String, i64> = members.iter().map(|m| (m.to_string(), 0)).collect();
    let mut total = 0;
    for (kind, uid, ns) in &children {
        let member = match (kind.as_str(), ns) {
            ("Tenant", _) => by_uid.get(uid).cloned(),
            ("TenantApp", Some(ns)) => Some(namespace_owner(members, ns)),
            _ => continue,
        };
        total += 1;
        if let Some(m) = member {
            *counts.get_mut(&m).unwrap() += 1;
        }
    }
    (counts, total)
}

/// Each replica's child caches (`idem_shard_child_cache_objects`, from its own metrics) hold
/// exactly the children of the Tenants and TenantApps it owns: its child watches never
/// received the others'.
async fn child_caches_hold_only_owned_children(
    client: &Client,
    replicas: &[OperatorProcess],
    tenants: &[Tenant],
    members: &[&str],
) {
    let (want, total) = children_per_owner(client, tenants, members).await;
    for r in replicas {
        let want = want[r.name.as_str()];
        assert!(
            want < total,
            "{} owns every child: {want} of {total}",
            r.name
        );
        eventually(
            "a replica's child caches holding exactly its tenants' children",
            common::TIMEOUT,
            || async {
                let m = r.metrics().await.unwrap_or_default();
                let got = m
                    .lines()
                    .find_map(|l| l.strip_prefix("idem_shard_child_cache_objects "))
                    .and_then(|v| v.trim().parse::<i64>().ok());
                (got == Some(want)).then_some(()).ok_or(format!(
                    "{}: {got:?} cached, {want} of {total} children are its tenants'",
                    r.name
                ))
            },
        )
        .await;
    }
}

/// Label `label` of `api`'s `name` forged to `forged`, then removed: the child's owner puts
/// `right` back each time.
async fn forged_label_comes_back<K>(
    api: &Api<K>,
    name: &str,
    label: &str,
    right: &str,
    forged: &str,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let label_is = || async {
        eventually("the bucket label put back", common::TIMEOUT, || async {
            let child = api.get(name).await.map_err(|e| e.to_string())?;
            let got = child.labels().get(label).cloned();
            (got.as_deref() == Some(right))
                .then_some(())
                .ok_or(format!("{name}: label {label} {got:?}, want {right}"))
        })
        .await;
    };
    let forge = serde_json::json!({"metadata": {"labels": {label: forged}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&forge))
        .await
        .expect("forging the bucket label");
    label_is().await;
    let remove = serde_json::json!({"metadata": {"labels": {label: null}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&remove))
        .await
        .expect("removing the bucket label");
    label_is().await;
}

/// A bucket not `me`'s in the ring of `members`.
fn bucket_of_another(members: &[&str], me: &str) -> String {
    let ring = Ring::new(members.iter().copied());
    (0..BUCKETS)
        .find(|b| ring.owner_of((*b as u64) << 56) != Some(me))
        .unwrap()
        .to_string()
}

/// A bucket label forged to another member's bucket, then removed, on the owners'
/// RoleBinding of `tenant` and on the ConfigMap of the app in its namespace `a`: their owners
/// put the right label back each time, and no tenant is written by a replica other than its
/// owner meanwhile.
async fn forged_bucket_labels_are_repaired(client: &Client, tenant: &Tenant, members: &[&str]) {
    let me = owner(members, tenant);
    let right = bucket_of(fnv1a64(tenant.uid().unwrap().as_bytes())).to_string();
    let ns = tenant.status.as_ref().unwrap().namespaces[0].clone();
    let since = Timestamp::now();
    let api = Api::<RoleBinding>::namespaced(client.clone(), &ns);
    let forged = bucket_of_another(members, &me);
    forged_label_comes_back(&api, "idem-owners", SHARD_BUCKET_LABEL, &right, &forged).await;
    let app_ns = format!("{}-a", tenant.name_any());
    let api = Api::<ConfigMap>::namespaced(client.clone(), &app_ns);
    let right = bucket_of(fnv1a64(app_ns.as_bytes())).to_string();
    let forged = bucket_of_another(members, &namespace_owner(members, &app_ns));
    forged_label_comes_back(&api, "app-config", NAMESPACE_BUCKET_LABEL, &right, &forged).await;
    let w = writers(client, since).await;
    for (uid, who) in &w {
        if uid == &tenant.uid().unwrap() {
            assert!(
                who.iter().all(|r| *r == me),
                "repaired by {who:?}, owner {me}"
            );
        }
    }
}

async fn scenario(gate: bool) {
    let _serial = SERIAL.lock().await;
    let options = Options {
        feature_gates: if gate {
            vec!["ShardedListAndWatch=true".into()]
        } else {
            Vec::new()
        },
        ..Options::default()
    };
    let cp = tokio::task::block_in_place(|| ControlPlane::start_with(options))
        .expect("starting a control plane");
    let client = cp.client();
    install_crds(&client).await;
    let ns = idem_tests::create_namespace(&client, "shards")
        .await
        .unwrap();
    let names = ["shard-a", "shard-b", "shard-c", "shard-d"];
    let mut replicas: Vec<OperatorProcess> = names[..3]
        .iter()
        .map(|n| start_replica(&cp, &ns, n))
        .collect();

    // At least TENANTS, and more until the ring of the three gives shard-a one (12 uids all
    // outside its buckets happen about once in 130 runs): ownership is the ring's hash of the
    // uid, which the server chooses.
    let ring = Ring::new(&names[..3]);
    let mut tenant_names: Vec<String> = Vec::new();
    let mut shard_a_owns = false;
    while tenant_names.len() < TENANTS || !shard_a_owns {
        assert!(tenant_names.len() < 64, "64 uids none of them shard-a's");
        let name = unique_name(&format!("sh{}", tenant_names.len()));
        let created = tenants::create(&client, &name, full_spec(&["a"])).await;
        let uid = created.metadata.uid.as_deref().unwrap_or_default();
        shard_a_owns |= ring.owner_of(fnv1a64(uid.as_bytes())) == Some("shard-a");
        tenant_names.push(name);
    }
    let count = tenant_names.len();
    let mut ready = Vec::new();
    for name in &tenant_names {
        ready.push(tenants::wait_ready(&client, name).await);
    }
    // A TenantApp in each tenant's namespace `a` (kept by every change below): its children
    // belong to the replica that owns the namespace's bucket, whatever its Tenant's.
    let mut app_namespaces = Vec::new();
    for t in &ready {
        let ns = format!("{}-a", t.name_any());
        apps::create(&client, &ns, "app", apps::spec(1, "x")).await;
        app_namespaces.push(ns);
    }
    for ns in &app_namespaces {
        apps::wait_ready(&client, ns, "app").await;
    }
    for r in &replicas {
        let m = r.metrics().await.unwrap_or_default();
        let on = m
            .lines()
            .find_map(|l| l.strip_prefix("idem_shard_server_side "));
        assert_eq!(on, Some(if gate { "1" } else { "0" }), "{}", r.name);
    }
    if gate {
        server_filters_like_this_side(&client, &ready, &names[..3]).await;
    }
    let epoch = Timestamp::from_second(0).unwrap();
    let w = writers(&client, epoch).await;
    let owners3 = assert_written_by_owners(&ready, &w, &names[..3], "three replicas");
    let owned_by_a = owners3.values().filter(|o| *o == "shard-a").count();
    assert!(
        owned_by_a > 0,
        "shard-a owns some of {count} tenants: {owners3:?}"
    );
    child_caches_hold_only_owned_children(&client, &replicas, &ready, &names[..3]).await;
    let victim = ready
        .iter()
        .find(|t| owners3[&t.name_any()] == "shard-a")
        .unwrap();
    forged_bucket_labels_are_repaired(&client, victim, &names[..3]).await;
    child_caches_hold_only_owned_children(&client, &replicas, &ready, &names[..3]).await;

    // SIGKILL shard-a: the others take its tenants over once its Lease expires.
    let killed = Instant::now();
    replicas[0].signal(Signal::SIGKILL);
    for r in &replicas[1..] {
        eventually(
            "the survivors working on a ring of two",
            common::TIMEOUT,
            || async {
                let m = r.metrics().await.unwrap_or_default();
                let gauge = |name: &str| {
                    m.lines()
                        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                        .map(str::trim)
                        .map(str::to_owned)
                };
                let (members, working) = (gauge("idem_shard_members"), gauge("idem_shard_working"));
                (members.as_deref() == Some("2") && working.as_deref() == Some("1"))
                    .then_some(())
                    .ok_or(format!("members {members:?}, working {working:?}"))
            },
        )
        .await;
    }
    let takeover = killed.elapsed();
    let (ready, w) = change_all(&client, &tenant_names, "b").await;
    let owners2 = assert_written_by_owners(&ready, &w, &names[1..3], "after the kill");
    // The survivors went on from their child caches: each holds exactly its new share.
    child_caches_hold_only_owned_children(&client, &replicas[1..], &ready, &names[1..3]).await;
    println!(
        "gate={gate}: shard-a owned {owned_by_a}/{count}; working on a ring of two after {takeover:?}; all reconciled after {:?}",
        killed.elapsed()
    );
    assert!(
        takeover <= LEASE_DURATION + 4 * RETRY_PERIOD + Duration::from_secs(10),
        "takeover took {takeover:?}"
    );

    // A fourth replica joins: about a quarter of the tenants move, each written by one replica.
    // The two earlier replicas go on from their caches: without the gate (every replica keeps
    // every Tenant) the API server sends the Tenants to the new replica only, by its own
    // counts (each earlier replica listing them again would make it three times as many).
    let tenants_before = tenants_sent(&cp.metrics().await.unwrap());
    replicas.push(start_replica(&cp, &ns, names[3]));
    let live = [names[1], names[2], names[3]];
    child_caches_hold_only_owned_children(&client, &replicas[1..], &ready, &live).await;
    let sent = tenants_sent(&cp.metrics().await.unwrap()) - tenants_before;
    println!("gate={gate}: Tenants sent at the join: {sent} ({count} Tenants)");
    if !gate {
        assert!(
            sent < 2 * count as i64,
            "{sent} Tenants sent at the join of a replica: the earlier replicas listed theirs again"
        );
    }
    for r in &replicas[1..] {
        eventually("three members working", common::TIMEOUT, || async {
            let m = r.metrics().await.unwrap_or_default();
            let members = m
                .lines()
                .find_map(|l| l.strip_prefix("idem_shard_members "))
                .map(str::trim);
            (members == Some("3"))
                .then_some(())
                .ok_or(format!("{members:?}"))
        })
        .await;
    }
    let (ready, w) = change_all(&client, &tenant_names, "c").await;
    let owners3b = assert_written_by_owners(&ready, &w, &live, "after a replica joined");
    child_caches_hold_only_owned_children(&client, &replicas[1..], &ready, &live).await;
    let moved = owners3b.iter().filter(|(t, o)| owners2[*t] != **o).count();
    println!("gate={gate}: {moved}/{count} tenants moved to the new replica or between others");
    assert!(
        moved < count,
        "not everything moves: {owners2:?} → {owners3b:?}"
    );
    for r in &mut replicas[1..] {
        assert!(r.exited().is_none(), "{} exited:\n{}", r.name, r.log_tail());
    }
    drop(replicas);
    tokio::task::block_in_place(|| cp.stop());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_without_the_gate_filter_on_the_client() {
    scenario(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_with_the_gate_are_filtered_by_the_server() {
    scenario(true).await;
}
