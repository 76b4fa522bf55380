//! Against the real control plane: which watch events trigger reconciles, and that two
//! workers never reconcile one key at once.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{MANAGER, Widget, WidgetSpec, install_widget, namespace, wait_until};
use idem_runtime::controller::{Action, Attempt, Controller, ControllerConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::oneshot;

const FINALIZER: &str = "test.idem.dev/cleanup";
const WAIT: Duration = Duration::from_secs(60);
/// The widget (and its child ConfigMap) whose reconciles serve as a barrier, see [`Barrier`].
const SENTINEL: &str = "zz-sentinel";

struct Seen {
    /// Reconciles of everything but the sentinel.
    count: Arc<AtomicUsize>,
    /// Reconciles of the sentinel.
    sentinel: AtomicUsize,
    /// (name, generation, deleting) per reconcile, in order.
    log: Mutex<Vec<(String, i64, bool)>>,
    api: Api<Widget>,
}

async fn record(obj: Arc<Widget>, ctx: Arc<Seen>, _: Attempt) -> Result<Action, kube::Error> {
    if obj.name_any() == SENTINEL {
        ctx.sentinel.fetch_add(1, Ordering::SeqCst);
        return Ok(Action::await_change());
    }
    let deleting = obj.meta().deletion_timestamp.is_some();
    ctx.log.lock().unwrap().push((
        obj.name_any(),
        obj.meta().generation.unwrap_or_default(),
        deleting,
    ));
    if deleting {
        // Cleanup done: drop our finalizer so the apiserver can delete the object.
        let patch = json!({"metadata": {"finalizers": null}});
        ctx.api
            .patch(
                &obj.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    ctx.count.fetch_add(1, Ordering::SeqCst);
    Ok(Action::await_change())
}

/// A barrier for "this event triggered no reconcile": with one worker and every widget in one
/// tenant (the namespace), keys are reconciled in the order their watch events were handled.
/// An edit of the sentinel (and of its child) made after the event under test comes later in
/// the same watch stream, so once the sentinel has been reconciled for it, any reconcile the
/// earlier event caused has already run.
struct Barrier {
    widgets: Api<Widget>,
    cms: Api<ConfigMap>,
    round: i64,
}

impl Barrier {
    async fn new(widgets: &Api<Widget>, cms: &Api<ConfigMap>, seen: &Seen) -> Self {
        let w = widgets
            .create(
                &PostParams::default(),
                &Widget::new(SENTINEL, WidgetSpec { value: 0 }),
            )
            .await
            .unwrap();
        let child = ConfigMap {
            metadata: ObjectMeta {
                name: Some(SENTINEL.into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "test.idem.dev/v1".into(),
                    kind: "Widget".into(),
                    name: SENTINEL.into(),
                    uid: w.uid().unwrap(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        cms.create(&PostParams::default(), &child).await.unwrap();
        wait_until("the sentinel's first reconcile", WAIT, || {
            seen.sentinel.load(Ordering::SeqCst) >= 1
        })
        .await;
        Self {
            widgets: widgets.clone(),
            cms: cms.clone(),
            round: 0,
        }
    }

    /// Passes once every watch event handled before now (primary and child) has been
    /// reconciled, if it caused a reconcile at all.
    async fn pass(&mut self, seen: &Seen) {
        self.round += 1;
        let spec = json!({"spec": {"value": self.round}});
        let before = seen.sentinel.load(Ordering::SeqCst);
        self.widgets
            .patch(SENTINEL, &PatchParams::default(), &Patch::Merge(&spec))
            .await
            .unwrap();
        wait_until("the sentinel's spec reconcile", WAIT, || {
            seen.sentinel.load(Ordering::SeqCst) > before
        })
        .await;
        let before = seen.sentinel.load(Ordering::SeqCst);
        let data = json!({"data": {"round": self.round.to_string()}});
        self.cms
            .patch(SENTINEL, &PatchParams::default(), &Patch::Merge(&data))
            .await
            .unwrap();
        wait_until("the sentinel's child reconcile", WAIT, || {
            seen.sentinel.load(Ordering::SeqCst) > before
        })
        .await;
    }
}

/// Waits for `want` reconciles, passes the barrier, and checks there was no other.
async fn expect_exactly(seen: &Seen, barrier: &mut Barrier, want: usize, what: &str) {
    wait_until(&format!("{what}: {want} reconciles"), WAIT, || {
        seen.count.load(Ordering::SeqCst) >= want
    })
    .await;
    barrier.pass(seen).await;
    assert_eq!(
        seen.count.load(Ordering::SeqCst),
        want,
        "{what}: extra reconciles"
    );
}

fn quiet_config() -> ControllerConfig {
    ControllerConfig {
        workers: 2,
        resync_period: Duration::ZERO, // no resync noise in counts
        ..ControllerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_update_child_edit_and_delete_trigger_exactly_the_expected_reconciles() {
    let client = idem_tests::shared().client();
    install_widget(&client).await;
    let ns = namespace(&client, "ctl-triggers").await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let seen = Arc::new(Seen {
        count: Arc::new(AtomicUsize::new(0)),
        sentinel: AtomicUsize::new(0),
        log: Mutex::new(Vec::new()),
        api: widgets.clone(),
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default())
            .owns(cms.clone(), watcher::Config::default())
            .with_config(ControllerConfig {
                workers: 1, // the barrier needs one worker (see `Barrier`)
                per_tenant_cap: Some(1),
                ..quiet_config()
            })
            .run(record, Arc::clone(&seen), async {
                let _ = stopped.await;
            }),
    );
    let mut barrier = Barrier::new(&widgets, &cms, &seen).await;

    // 1. Create → one reconcile.
    let mut w = Widget::new("w1", WidgetSpec { value: 1 });
    w.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let w = widgets.create(&PostParams::default(), &w).await.unwrap();
    expect_exactly(&seen, &mut barrier, 1, "create").await;

    // 2. Spec update → one reconcile, of the new generation.
    let spec = json!({"spec": {"value": 2}});
    widgets
        .patch("w1", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
    expect_exactly(&seen, &mut barrier, 2, "spec update").await;
    assert_eq!(seen.log.lock().unwrap()[1], ("w1".into(), 2, false));

    // 3. A status-only write → no reconcile.
    let status = json!({"status": {"observedGeneration": 2, "reconciles": 7}});
    widgets
        .patch_status("w1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    expect_exactly(&seen, &mut barrier, 2, "status-only write").await;

    // 4. Creating an owned child → one reconcile of the owner; editing it → one more.
    let owner = OwnerReference {
        api_version: "test.idem.dev/v1".into(),
        kind: "Widget".into(),
        name: "w1".into(),
        uid: w.uid().unwrap(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let child = ConfigMap {
        metadata: ObjectMeta {
            name: Some("w1-child".into()),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("k".to_owned(), "v1".to_owned())])),
        ..ConfigMap::default()
    };
    cms.create(&PostParams::default(), &child).await.unwrap();
    expect_exactly(&seen, &mut barrier, 3, "child created").await;
    let edit = json!({"data": {"k": "v2"}});
    cms.patch(
        "w1-child",
        &PatchParams::apply(MANAGER),
        &Patch::Merge(&edit),
    )
    .await
    .unwrap();
    expect_exactly(&seen, &mut barrier, 4, "child edited").await;

    // 5. A ConfigMap nobody owns → nothing.
    let stray = ConfigMap {
        metadata: ObjectMeta {
            name: Some("stray".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    cms.create(&PostParams::default(), &stray).await.unwrap();
    expect_exactly(&seen, &mut barrier, 4, "unowned configmap").await;

    // 6. Delete → one reconcile that sees deletionTimestamp and drops the finalizer; the
    //    object's disappearance (and its child's garbage collection) reconcile nothing.
    widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    expect_exactly(&seen, &mut barrier, 5, "delete").await;
    assert!(
        seen.log.lock().unwrap()[4].2,
        "the fifth reconcile saw the deletion"
    );
    let gone = tokio::time::timeout(WAIT, async {
        while widgets.get_opt("w1").await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "widget deleted after its finalizer was removed"
    );
    expect_exactly(&seen, &mut barrier, 5, "after deletion").await;

    stop.send(()).unwrap();
    let report = controller.await.unwrap().unwrap();
    assert!(report.drained());
}

struct Overlap {
    running: Mutex<HashSet<String>>,
    violations: AtomicUsize,
    max_parallel: AtomicUsize,
    reconciles: Arc<AtomicUsize>,
    last_generation: Mutex<BTreeMap<String, i64>>,
}

async fn slow(obj: Arc<Widget>, ctx: Arc<Overlap>, _: Attempt) -> Result<Action, kube::Error> {
    let name = obj.name_any();
    {
        let mut running = ctx.running.lock().unwrap();
        if !running.insert(name.clone()) {
            ctx.violations.fetch_add(1, Ordering::SeqCst);
        }
        ctx.max_parallel.fetch_max(running.len(), Ordering::SeqCst);
    }
    // Long beside a round of changes (three PATCHes and 100 ms), even on a loaded machine,
    // so that each key changes several times while it is reconciled.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    ctx.running.lock().unwrap().remove(&name);
    ctx.last_generation
        .lock()
        .unwrap()
        .insert(name, obj.meta().generation.unwrap_or_default());
    ctx.reconciles.fetch_add(1, Ordering::SeqCst);
    Ok(Action::await_change())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_never_reconcile_one_key_at_once() {
    let client = idem_tests::shared().client();
    install_widget(&client).await;
    let ns = namespace(&client, "ctl-overlap").await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let ctx = Arc::new(Overlap {
        running: Mutex::new(HashSet::new()),
        violations: AtomicUsize::new(0),
        max_parallel: AtomicUsize::new(0),
        reconciles: Arc::new(AtomicUsize::new(0)),
        last_generation: Mutex::new(BTreeMap::new()),
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let config = ControllerConfig {
        workers: 4,
        per_tenant_cap: None, // all widgets share the namespace tenant
        ..quiet_config()
    };
    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default())
            .with_config(config)
            .run(slow, Arc::clone(&ctx), async {
                let _ = stopped.await;
            }),
    );
    let names = ["a", "b", "c"];
    for n in names {
        widgets
            .create(
                &PostParams::default(),
                &Widget::new(n, WidgetSpec { value: 0 }),
            )
            .await
            .unwrap();
    }
    // Hammer every widget with spec changes while its reconcile is running.
    for round in 1..=10 {
        for n in names {
            let spec = json!({"spec": {"value": round}});
            widgets
                .patch(n, &PatchParams::default(), &Patch::Merge(&spec))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each widget ends at generation 11; wait until every one was reconciled at it.
    let converged = tokio::time::timeout(WAIT, async {
        loop {
            let done = {
                let last = ctx.last_generation.lock().unwrap();
                names.iter().all(|n| last.get(*n) == Some(&11))
            };
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        converged.is_ok(),
        "every widget reconciled at its last generation"
    );
    stop.send(()).unwrap();
    controller.await.unwrap().unwrap();
    assert_eq!(
        ctx.violations.load(Ordering::SeqCst),
        0,
        "one key reconciled twice at once"
    );
    assert!(
        ctx.max_parallel.load(Ordering::SeqCst) >= 2,
        "workers did run in parallel (else the check above proves nothing)"
    );
    // Dedupe: 33 generations in total, far fewer reconciles while busy keys coalesce.
    let n = ctx.reconciles.load(Ordering::SeqCst);
    assert!(n < 33, "changes to a busy key coalesce: {n} reconciles");
}
