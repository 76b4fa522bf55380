//! Against the real control plane: which child events reconcile the owner — not the apply
//! engine's own writes, not status-only changes unless the kind is owned with
//! `OwnsOptions::reading_status`.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Echo, EchoSpec, Widget, WidgetSpec, install_echo, install_widget, namespace};
use idem_runtime::TenantKey;
use idem_runtime::apply::{Applier, ChildCaches, DesiredChildren, Labels, Owner};
use idem_runtime::controller::{Action, Attempt, Controller, ControllerConfig, OwnsOptions};
use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(90);
const FM: &str = "idem-child-events";

/// Reconciles per widget name.
#[derive(Default)]
struct Counts(Mutex<BTreeMap<String, usize>>);

impl Counts {
    fn of(&self, name: &str) -> usize {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }
    fn bump(&self, name: &str) {
        *self.0.lock().unwrap().entry(name.to_owned()).or_default() += 1;
    }
    fn all(&self) -> BTreeMap<String, usize> {
        self.0.lock().unwrap().clone()
    }
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "waited for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn quiet_config() -> ControllerConfig {
    ControllerConfig {
        workers: 1, // reconciles run in the order their events were handled (see `pass`)
        per_tenant_cap: Some(1),
        resync_period: Duration::ZERO,
        ..ControllerConfig::default()
    }
}

fn owned_by(w: &Widget) -> OwnerReference {
    OwnerReference {
        api_version: "test.idem.dev/v1".into(),
        kind: "Widget".into(),
        name: w.name_any(),
        uid: w.uid().unwrap(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// Passes once every Echo event handled before now has been reconciled (if it caused a
/// reconcile): an edit of the sentinel's Echo comes later in the same watch stream, and with one
/// worker and one tenant keys are reconciled in the order their events were handled.
async fn pass(echoes: &Api<Echo>, counts: &Counts, round: i64) {
    let before = counts.of("sentinel");
    let spec = json!({"spec": {"value": round}});
    echoes
        .patch("sentinel", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
    wait_for("the sentinel's reconcile", || {
        counts.of("sentinel") > before
    })
    .await;
}

async fn count(obj: Arc<Widget>, ctx: Arc<Counts>, _: Attempt) -> Result<Action, kube::Error> {
    ctx.bump(&obj.name_any());
    Ok(Action::await_change())
}

/// With the default options a status-only change of an owned child does not reconcile the
/// owner; with `OwnsOptions::reading_status` it does; a spec change does either way.
async fn status_change_reconciles(options: OwnsOptions) -> bool {
    let client = idem_tests::shared().client();
    install_widget(&client).await;
    install_echo(&client).await;
    let ns = namespace(&client, "ctl-child-status").await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let echoes: Api<Echo> = Api::namespaced(client.clone(), &ns);
    let counts = Arc::new(Counts::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default())
            .owns_with(echoes.clone(), watcher::Config::default(), options)
            .with_config(quiet_config())
            .run(count, Arc::clone(&counts), async {
                let _ = stopped.await;
            }),
    );
    for name in ["w", "sentinel"] {
        let w = widgets
            .create(
                &PostParams::default(),
                &Widget::new(name, WidgetSpec { value: 0 }),
            )
            .await
            .unwrap();
        let mut e = Echo::new(name, EchoSpec { value: 0 });
        e.metadata.owner_references = Some(vec![owned_by(&w)]);
        echoes.create(&PostParams::default(), &e).await.unwrap();
    }
    wait_for("first reconciles", || {
        counts.of("w") >= 1 && counts.of("sentinel") >= 1
    })
    .await;
    pass(&echoes, &counts, 1).await;
    let before = counts.of("w");

    let status = json!({"status": {"observedGeneration": 1, "reconciles": 7}});
    echoes
        .patch_status("w", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    pass(&echoes, &counts, 2).await;
    let status_reconciled = counts.of("w") > before;

    // A spec change of the child reconciles the owner with any options.
    let before = counts.of("w");
    let spec = json!({"spec": {"value": 5}});
    echoes
        .patch("w", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
    wait_for("the child's spec change reconciled", || {
        counts.of("w") > before
    })
    .await;

    stop.send(()).unwrap();
    controller.await.unwrap().unwrap();
    status_reconciled
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_only_child_change_reconciles_the_owner_only_when_its_status_is_read() {
    assert!(
        !status_change_reconciles(OwnsOptions::default()).await,
        "default options: a status-only change of a child reconciled its owner"
    );
    assert!(
        status_change_reconciles(OwnsOptions::reading_status()).await,
        "reading_status: a status-only change of a child did not reconcile its owner"
    );
}

struct Fleet {
    applier: Applier,
    counts: Counts,
}

/// Applies a ConfigMap and a ResourceQuota (whose status the controller-manager then writes).
async fn converge(obj: Arc<Widget>, ctx: Arc<Fleet>, _: Attempt) -> Result<Action, String> {
    let name = obj.name_any();
    ctx.counts.bump(&name);
    let tenant = TenantKey::new(obj.namespace().unwrap_or_default());
    let owner = Owner::labelled(obj.as_ref(), FM, Some(tenant), Labels::operator())
        .map_err(|e| e.to_string())?;
    let mut desired = DesiredChildren::new();
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "value".to_owned(),
            obj.spec.value.to_string(),
        )])),
        ..ConfigMap::default()
    };
    let quota = ResourceQuota {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(BTreeMap::from([(
                "pods".to_owned(),
                Quantity(format!("{}", 10 + obj.spec.value)),
            )])),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    };
    desired.add(&cm).map_err(|e| e.to_string())?;
    desired.add(&quota).map_err(|e| e.to_string())?;
    ctx.applier
        .reconcile(&owner, &desired)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Action::await_change())
}

/// A converging fleet is reconciled once per tenant: the events of the engine's own creates and
/// writes, and the controller-manager's quota status updates, reconcile nothing; a tenant's edit
/// of a child still does (read-repair).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_converging_fleet_is_reconciled_once_per_tenant() {
    const N: usize = 10;
    let client = idem_tests::shared().client();
    install_widget(&client).await;
    let ns = namespace(&client, "ctl-own-writes").await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    let caches = ChildCaches::new();
    let fleet = Arc::new(Fleet {
        applier: Applier::new(client.clone()).with_caches(caches.clone()),
        counts: Counts::default(),
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default())
            .owns(cms.clone(), watcher::Config::default())
            .owns(quotas.clone(), watcher::Config::default())
            // One tenant (the namespace) and one worker: keys are reconciled in the order
            // their events were handled, so the repairs below are barriers.
            .with_config(quiet_config())
            .with_child_caches(caches)
            .run(converge, Arc::clone(&fleet), async {
                let _ = stopped.await;
            }),
    );
    let names: Vec<String> = (0..N).map(|i| format!("t{i}")).collect();
    for name in &names {
        widgets
            .create(
                &PostParams::default(),
                &Widget::new(name, WidgetSpec { value: 0 }),
            )
            .await
            .unwrap();
    }
    // Converged: every quota exists with its status written by the controller-manager (the
    // last write any of this causes).
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let list = quotas.list(&Default::default()).await.unwrap();
        let used = list
            .items
            .iter()
            .filter(|q| q.status.as_ref().and_then(|s| s.used.as_ref()).is_some())
            .count();
        if used == N {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{used}/{N} quotas have a status"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A tenant's edits of t0's children are repaired (read-repair still works), and these
    // repairs are barriers: every event of both child watches before them has been handled.
    // Waited for on the server, not on t0's reconcile count: an earlier event (say, the first
    // repair's own write, settled late on a busy machine) may reconcile t0 once more before
    // the edit's event is handled.
    let before = fleet.counts.of("t0");
    let edit = json!({"data": {"value": "tampered"}});
    cms.patch("t0", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while cms.get("t0").await.unwrap().data.unwrap_or_default()["value"] != "0" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "ConfigMap not repaired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        fleet.counts.of("t0") > before,
        "repaired by a reconcile of t0"
    );
    let before = fleet.counts.of("t0");
    let edit = json!({"spec": {"hard": {"pods": "99"}}});
    quotas
        .patch("t0", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    let pods = || async {
        let quota = quotas.get("t0").await.unwrap();
        quota.spec.and_then(|s| s.hard).unwrap_or_default()["pods"]
            .0
            .clone()
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    while pods().await != "10" {
        assert!(tokio::time::Instant::now() < deadline, "quota not repaired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        fleet.counts.of("t0") > before,
        "repaired by a reconcile of t0"
    );
    stop.send(()).unwrap();
    controller.await.unwrap().unwrap();

    let counts = fleet.counts.all();
    let others: usize = names[1..]
        .iter()
        .map(|n| counts.get(n).copied().unwrap_or(0))
        .sum();
    let per_tenant = others as f64 / (N - 1) as f64;
    println!("reconciles per tenant while converging: {per_tenant:.2} ({counts:?})");
    assert!(
        per_tenant <= 1.2,
        "own writes or status churn reconciled the fleet again: {per_tenant:.2} per tenant, {counts:?}"
    );
    assert!(
        counts.values().all(|n| *n >= 1),
        "every tenant reconciled: {counts:?}"
    );
}

/// A child whose controller ownerReference is moved to another owner reconciles both: the
/// new owner, and the former one, which may have created it and would repair it (nothing else
/// would tell it: its own object did not change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_moved_to_another_owner_reconciles_the_former_owner_too() {
    let client = idem_tests::shared().client();
    install_widget(&client).await;
    install_echo(&client).await;
    let ns = namespace(&client, "ctl-child-moved").await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let echoes: Api<Echo> = Api::namespaced(client.clone(), &ns);
    let counts = Arc::new(Counts::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default())
            .owns_with(
                echoes.clone(),
                watcher::Config::default(),
                OwnsOptions::default(),
            )
            .with_config(quiet_config())
            .run(count, Arc::clone(&counts), async {
                let _ = stopped.await;
            }),
    );
    let mut owners = BTreeMap::new();
    for name in ["a", "b", "sentinel"] {
        let w = widgets
            .create(
                &PostParams::default(),
                &Widget::new(name, WidgetSpec { value: 0 }),
            )
            .await
            .unwrap();
        owners.insert(name, owned_by(&w));
    }
    for (echo, owner) in [("e", "a"), ("sentinel", "sentinel")] {
        let mut e = Echo::new(echo, EchoSpec { value: 0 });
        e.metadata.owner_references = Some(vec![owners[owner].clone()]);
        echoes.create(&PostParams::default(), &e).await.unwrap();
    }
    wait_for("first reconciles", || {
        counts.of("a") >= 1 && counts.of("sentinel") >= 1
    })
    .await;
    pass(&echoes, &counts, 1).await;
    let (a, b) = (counts.of("a"), counts.of("b"));

    let moved = json!({"metadata": {"ownerReferences": [owners["b"]]}});
    echoes
        .patch("e", &PatchParams::default(), &Patch::Merge(&moved))
        .await
        .unwrap();
    pass(&echoes, &counts, 2).await;
    let after = counts.all();
    stop.send(()).unwrap();
    controller.await.unwrap().unwrap();
    assert!(counts.of("b") > b, "the new owner reconciled: {after:?}");
    assert!(
        counts.of("a") > a,
        "the former owner was not reconciled: {after:?}"
    );
}
