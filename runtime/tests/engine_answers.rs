//! The server's answers (`apply::answers`) under a running controller and against a tenant's
//! writes: kept across passes (the Driver's passes share the controller's caches), so a
//! converged child the convergence check cannot judge alone (a StatefulSet's volume claim
//! template, which the server defaults inside a value we own whole) costs no request per pass; a forged `managedFields` entry costs at most one
//! dry-run; a key someone adds under our field manager's name is removed and reported.

mod common;

use std::time::Duration;

use idem_runtime::IdempotentResource;
use idem_runtime::apply::DesiredChildren;
use idem_runtime::controller::{Controller, ControllerConfig};
use idem_runtime::reconciler::{ChildKinds, Driver, ReconcileError, Reconciler};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::oneshot;

/// A vault: one StatefulSet with a volume claim template (no replicas).
#[derive(CustomResource, IdempotentResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "test.idem.dev",
    version = "v1",
    kind = "Vault",
    namespaced,
    status = "VaultStatus"
)]
#[idempotent(tenant = namespace, prune = owner_references)]
pub struct VaultSpec {
    /// The secret's value.
    pub value: String,
}

/// Status of a [`Vault`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VaultStatus {
    /// The generation the conditions describe.
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling, Stalled.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

struct Vaults;

impl Reconciler for Vaults {
    type Resource = Vault;
    fn children() -> ChildKinds<Vault> {
        ChildKinds::new().owns::<StatefulSet>()
    }
    fn desired(&self, v: &Vault) -> Result<DesiredChildren, ReconcileError> {
        let sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": v.name_any(), "namespace": v.namespace()},
            "spec": {
                "serviceName": v.name_any(), "replicas": 0,
                "selector": {"matchLabels": {"app": "vault"}},
                "template": {
                    "metadata": {"labels": {"app": "vault"},
                        "annotations": {"test.idem.dev/value": v.spec.value}},
                    "spec": {"containers": [{"name": "vault", "image": "vault:1"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}]},
        }))
        .map_err(|e| ReconcileError::terminal("InvalidSpec", e.to_string()))?;
        let mut children = DesiredChildren::new();
        children.add(&sts)?;
        Ok(children)
    }
}

/// Held by the tests that apply ConfigMaps: one counts the dry-runs on ConfigMaps in the whole
/// cluster, and the other's repair pass makes one.
static CONFIG_MAPS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// (dry-run requests, other requests) on `resource` of the core group, as the API server
/// counts them, but for lists and watches.
async fn requests(resource: &str) -> (u64, u64) {
    let text = idem_tests::shared().metrics().await.expect("metrics");
    let mut counts = (0, 0);
    for line in text.lines() {
        let Some((labels, value)) = line
            .strip_prefix("apiserver_request_total{")
            .and_then(|rest| rest.rsplit_once("} "))
        else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split("\",")
                .filter_map(|kv| kv.split_once("=\""))
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.trim_end_matches('"'))
        };
        if label("resource") != Some(resource)
            || label("group") != Some("")
            || matches!(label("verb"), Some("LIST" | "WATCH"))
        {
            continue;
        }
        let v = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        if label("dry_run").is_some_and(|d| !d.is_empty()) {
            counts.0 += v;
        } else {
            counts.1 += v;
        }
    }
    counts
}

/// A Vault `web` in a fresh namespace, and the owner its children get.
async fn vault_owner(client: &kube::Client, prefix: &str) -> (String, idem_runtime::apply::Owner) {
    common::install_crd(client, Vault::crd()).await;
    let ns = common::namespace(client, prefix).await;
    let vaults: Api<Vault> = Api::namespaced(client.clone(), &ns);
    let v = vaults
        .create(
            &PostParams::default(),
            &Vault::new("web", VaultSpec { value: "x".into() }),
        )
        .await
        .unwrap();
    let owner = idem_runtime::apply::Owner::new(
        &v,
        Vault::FIELD_MANAGER,
        Some(idem_runtime::TenantKey::new(&ns)),
    )
    .unwrap();
    (ns, owner)
}

fn ready(v: &Vault) -> bool {
    v.status.as_ref().is_some_and(|s| {
        s.observed_generation == v.metadata.generation
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_converged_child_the_check_cannot_judge_costs_no_dry_run_per_pass() {
    let admin = idem_tests::shared().client();
    common::install_crd(&admin, Vault::crd()).await;
    let ns = common::namespace(&admin, "answers-driver").await;
    // The controller runs as a user of its own, whose requests the API server counts apart
    // (the StatefulSet controller writes the child's status meanwhile).
    let user = common::user::CountedUser::create(&admin, "answers").await;
    let client = user.client();
    let vaults: Api<Vault> = Api::namespaced(client.clone(), &ns);
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = idem_runtime::metrics::Metrics::new(&mut registry);
    let controller = Controller::for_derived(vaults.clone(), watcher::Config::default())
        .owns(
            Api::<StatefulSet>::namespaced(client.clone(), &ns),
            Driver::<Vaults>::children_config(),
        )
        .with_config(ControllerConfig {
            // Resyncs: a pass of the converged object every ~200 ms.
            resync_period: Duration::from_millis(200),
            ..ControllerConfig::default()
        })
        .with_metrics(metrics);
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(Driver::new(client.clone(), Vaults).run(controller, async {
        let _ = stopped.await;
    }));
    vaults
        .create(
            &PostParams::default(),
            &Vault::new(
                "v",
                VaultSpec {
                    value: "s3cret".into(),
                },
            ),
        )
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if vaults.get("v").await.map(|v| ready(&v)).unwrap_or(false) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "Vault not Ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The child is converged: count from before a pass starts until five more have ended.
    let passes = r#"controller_runtime_reconcile_total{controller="vault",result="success"}"#;
    let scrape = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(passes)?
                    .strip_prefix(' ')?
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    let before = user.requests().await;
    let done = scrape();
    common::wait_until(
        "five more converged passes",
        Duration::from_secs(60),
        || scrape() >= done + 5.0,
    )
    .await;
    let after = user.requests().await;
    eprintln!("5 converged passes: {} requests", after - before);
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    assert_eq!(
        after - before,
        0,
        "converged passes of a running controller asked the API server (a dry-run per pass?)"
    );
}

/// A tenant who may update a child rewrites its `managedFields` (any writer may: a valid
/// list replaces the stored one) so that our entry no longer owns one desired key, value
/// unchanged. The check reports the key as owned by no one; the server's answer says an apply
/// changes nothing, so the child is `Unchanged` — asked once, then kept with the caches the
/// Driver's passes share, not asked again on every pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_managed_fields_entry_costs_one_dry_run_not_one_per_pass() {
    use idem_runtime::apply::Applier;
    use k8s_openapi::api::core::v1::ConfigMap;
    let client = idem_tests::shared().client();
    let _counting = CONFIG_MAPS.lock().await;
    let (ns, owner) = vault_owner(&client, "answers-mf").await;
    let config: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "web-config"}, "data": {"a.txt": "1", "b.txt": "2"}
    }))
    .unwrap();
    let mut desired = DesiredChildren::new();
    desired.add(&config).unwrap();
    Applier::new(client.clone())
        .reconcile(&owner, &desired)
        .await
        .expect("create");
    // The tenant's one write: our entry loses `data.a.txt` (value unchanged).
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let live = cms.get("web-config").await.unwrap();
    let mut mf = serde_json::to_value(live.metadata.managed_fields.clone().unwrap()).unwrap();
    for e in mf.as_array_mut().unwrap() {
        if e["manager"] == Vault::FIELD_MANAGER {
            e["fieldsV1"]["f:data"]
                .as_object_mut()
                .unwrap()
                .remove("f:a.txt");
        }
    }
    cms.patch(
        "web-config",
        &PatchParams {
            field_manager: Some("tenant".into()),
            ..PatchParams::default()
        },
        &Patch::Merge(&json!({"metadata": {"managedFields": mf}})),
    )
    .await
    .expect("rewrite managedFields");
    let forged = cms.get("web-config").await.unwrap();
    eprintln!(
        "managedFields now: {}",
        serde_json::to_string(&forged.metadata.managed_fields).unwrap()
    );
    // The Driver's passes each build an applier on the controller's caches, which keep the
    // server's answers: the same here.
    let caches = idem_runtime::apply::ChildCaches::new();
    let mut per_pass = Vec::new();
    for _ in 0..4 {
        let before = requests("configmaps").await;
        let report = Applier::new(client.clone())
            .with_caches(caches.clone())
            .reconcile(&owner, &desired)
            .await
            .expect("pass");
        let n = requests("configmaps").await.0 - before.0;
        eprintln!(
            "pass: {:?}, {} repaired, dry-runs {n}",
            report.children[0].1,
            report.repaired.len()
        );
        per_pass.push(n);
    }
    assert!(
        per_pass[0] <= 1 && per_pass[1..] == [0, 0, 0],
        "one forged managedFields write costs at most one dry-run, not one per pass: {per_pass:?}"
    );
}

/// A tenant applies to a child under our field manager's name (a client names its own
/// `fieldManager`), adding a key. The next pass removes it and reports it: a field our entry
/// owns that the desired body lacks (`Stale`) is drift when the apply removed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_added_under_our_manager_name_is_removed_and_reported() {
    use idem_runtime::apply::{Applier, ChildOutcome};
    use k8s_openapi::api::core::v1::ConfigMap;
    let client = idem_tests::shared().client();
    let _counting = CONFIG_MAPS.lock().await;
    let (ns, owner) = vault_owner(&client, "answers-stale").await;
    let config = |data: serde_json::Value| -> DesiredChildren {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "web-config"}, "data": data}))
                .unwrap();
        let mut d = DesiredChildren::new();
        d.add(&cm).unwrap();
        d
    };
    let desired = config(json!({"a.txt": "1"}));
    let applier = Applier::new(client.clone());
    applier.reconcile(&owner, &desired).await.expect("create");
    // Move our create's entry to an Apply entry (a desired-body change and back).
    applier
        .reconcile(&owner, &config(json!({"a.txt": "2"})))
        .await
        .unwrap();
    applier.reconcile(&owner, &desired).await.unwrap();
    // The tenant: every field we apply, plus a key of theirs, under our manager name.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let live = cms.get("web-config").await.unwrap();
    let mut body = serde_json::to_value(&live).unwrap();
    body["metadata"].as_object_mut().unwrap().retain(|k, _| {
        matches!(
            k.as_str(),
            "name" | "namespace" | "labels" | "annotations" | "ownerReferences"
        )
    });
    body["data"]["backdoor"] = json!("yes");
    cms.patch(
        "web-config",
        &PatchParams::apply(Vault::FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .expect("the tenant's apply");
    let report = Applier::new(client.clone())
        .reconcile(&owner, &desired)
        .await
        .expect("repair");
    let after = cms.get("web-config").await.unwrap();
    eprintln!(
        "outcome {:?}, repaired {:?}, data now {:?}",
        report.children[0].1, report.repaired, after.data
    );
    assert_eq!(report.children[0].1, ChildOutcome::Applied);
    assert!(
        !report.repaired.is_empty(),
        "a key someone else added was removed without a drift report"
    );
}

/// A child created by our POST holds our `Update` entry; once the desired body changes, the
/// apply folds that entry into our `Apply` entry first, by a write of the whole `managedFields`
/// list. The cached child keeps no timestamps, so that write starts from the object as the API
/// server has it: every other writer's entry keeps its time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folding_our_create_entry_keeps_other_writers_timestamps() {
    let client = idem_tests::shared().client();
    common::install_crd(&client, Vault::crd()).await;
    let ns = common::namespace(&client, "answers-fold").await;
    let vaults: Api<Vault> = Api::namespaced(client.clone(), &ns);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let controller = Controller::for_derived(vaults.clone(), watcher::Config::default())
        .owns(sets.clone(), Driver::<Vaults>::children_config());
    let caches = idem_runtime::apply::ChildCaches::new();
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(
        Driver::new(client.clone(), Vaults)
            .with_caches(caches.clone())
            .run(controller, async {
                let _ = stopped.await;
            }),
    );
    vaults
        .create(
            &PostParams::default(),
            &Vault::new("v", VaultSpec { value: "a".into() }),
        )
        .await
        .unwrap();
    let wait_ready = || async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !vaults.get("v").await.map(|v| ready(&v)).unwrap_or(false) {
            assert!(tokio::time::Instant::now() < deadline, "Vault not Ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    wait_ready().await;
    // Another writer's entry, with the time of its write.
    let pp = PatchParams {
        field_manager: Some("other-writer".into()),
        ..PatchParams::default()
    };
    let patched = sets
        .patch(
            "v",
            &pp,
            &Patch::Merge(&json!({"metadata": {"labels": {"other": "x"}}})),
        )
        .await
        .unwrap();
    // The pass below judges the cached copy (without times), not a stale one whose write
    // would meet a conflict and read the object again.
    let number = |rv: Option<String>| rv.and_then(|v| v.parse::<u64>().ok());
    let rv = number(patched.resource_version());
    common::wait_until(
        "the other writer's change in the cache",
        Duration::from_secs(60),
        || {
            caches
                .lookup::<StatefulSet>(Some(&ns), "v")
                .flatten()
                .is_some_and(|s| number(s.resource_version()) >= rv)
        },
    )
    .await;
    let times = |s: &StatefulSet| -> Vec<(String, Option<String>, bool)> {
        (s.metadata.managed_fields.iter().flatten())
            .map(|e| {
                (
                    e.manager.clone().unwrap_or_default(),
                    e.operation.clone(),
                    e.time.is_some(),
                )
            })
            .collect()
    };
    let before = sets.get("v").await.unwrap();
    assert!(
        times(&before).iter().all(|(_, _, timed)| *timed),
        "{:?}",
        times(&before)
    );
    let other_time = |s: &StatefulSet| {
        (s.metadata.managed_fields.iter().flatten())
            .find(|e| e.manager.as_deref() == Some("other-writer"))
            .and_then(|e| e.time.clone())
    };
    assert!(other_time(&before).is_some());

    vaults
        .patch(
            "v",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"value": "b"}})),
        )
        .await
        .unwrap();
    wait_ready().await;
    let after = sets.get("v").await.unwrap();
    let annotation = after
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get("test.idem.dev/value").cloned());
    assert_eq!(
        annotation.as_deref(),
        Some("b"),
        "the new desired body applied"
    );
    let ours: Vec<_> = times(&after)
        .into_iter()
        .filter(|(m, _, _)| m == Vault::FIELD_MANAGER)
        .map(|(_, op, _)| op.unwrap_or_default())
        .collect();
    assert_eq!(
        ours,
        ["Apply"],
        "our create's entry folded into our Apply entry"
    );
    assert!(
        times(&after).iter().all(|(_, _, timed)| *timed),
        "every entry keeps its time: {:?}",
        times(&after)
    );
    assert_eq!(other_time(&after), other_time(&before));
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
}
