//! Against the real control plane: a child deleted while its watch was down is recreated by
//! the relist that follows (client-go's `DeletedFinalStateUnknown`), within one reconcile of
//! its owner and not at the next resync.
//!
//! The child watch runs through an `idem_tests::faults` client: its events are held (a
//! stalled link), the child is deleted with a separate client, and a 410 Gone watch event
//! makes kube's watcher relist. The Delete event is never delivered; only the difference
//! between the two lists tells the controller the child is gone. Likewise a primary object
//! deleted and created again under the same name while its watch was down is told apart by
//! its uid and reconciled — once the relist is complete, never from the store of before it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{MANAGER, Widget, WidgetSpec, install_widget, namespace, wait_until};
use idem_runtime::apply::{Applier, ChildCaches, DesiredChildren, Labels, OWNER_UID_LABEL, Owner};
use idem_runtime::controller::{Action, Attempt, Controller, ControllerConfig, ControllerError};
use idem_runtime::queue::ShutdownReport;
use idem_tests::faults::{Faults, Verb};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(60);

/// One reconcile: the widget's name and whether it wrote its child (false: converged, read
/// from the cache with no request).
type Written = (String, bool);
/// One reconcile: the widget's name and uid.
type Entry = (String, String);

struct Ctx {
    applier: Applier,
    log: Mutex<Vec<Written>>,
}

fn child_name(widget: &str) -> String {
    format!("{widget}-child")
}

/// Desired state: one ConfigMap per widget, applied through the engine, which reads it from
/// the controller's child cache.
async fn reconcile(
    obj: Arc<Widget>,
    ctx: Arc<Ctx>,
    _: Attempt,
) -> Result<Action, idem_runtime::apply::ApplyError> {
    let owner = Owner::labelled(obj.as_ref(), MANAGER, None, Labels::operator())?;
    let child = ConfigMap {
        metadata: ObjectMeta {
            name: Some(child_name(&obj.name_any())),
            ..ObjectMeta::default()
        },
        data: Some([("k".to_owned(), "v".to_owned())].into()),
        ..ConfigMap::default()
    };
    let mut desired = DesiredChildren::new();
    desired.add(&child)?;
    let report = ctx.applier.reconcile(&owner, &desired).await?;
    ctx.log
        .lock()
        .unwrap()
        .push((obj.name_any(), report.wrote()));
    Ok(Action::await_change())
}

/// Polls the server until `shows` holds, for at most [`WAIT`]; whether it did.
async fn server_shows<F, Fut>(mut shows: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    tokio::time::timeout(WAIT, async {
        while !shows().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .is_ok()
}

fn wrote(log: &[Written], name: &str) -> bool {
    log.iter().any(|(n, wrote)| n == name && *wrote)
}

/// A running controller of widgets w1 and w2, each with its child ConfigMap created and held
/// in the controller's child store; only the child watch goes through `faults`.
struct Running {
    ns: String,
    truth: Api<ConfigMap>,
    faults: Faults,
    caches: ChildCaches,
    ctx: Arc<Ctx>,
    stop: oneshot::Sender<()>,
    controller: tokio::task::JoinHandle<Result<ShutdownReport, ControllerError>>,
}

async fn running(ns: &str, page_size: Option<u32>) -> Running {
    let cp = idem_tests::shared();
    let client = cp.client();
    install_widget(&client).await;
    let ns = namespace(&client, ns).await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let truth: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    // Only the child watch goes through the faults.
    let faults = Faults::new();
    let child_api: Api<ConfigMap> = Api::namespaced(faults.client(cp.config()).unwrap(), &ns);
    let caches = ChildCaches::new();
    let ctx = Arc::new(Ctx {
        applier: Applier::new(client.clone()).with_caches(caches.clone()),
        log: Mutex::new(Vec::new()),
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default())
            // Only the children (not the namespace's kube-root-ca.crt): the store's size says
            // when the watch has delivered both.
            .owns(
                child_api,
                // One child per list page (so a relist delivers w1's child a page before
                // w2's), or the default page size.
                watcher::Config {
                    page_size: page_size.or(watcher::Config::default().page_size),
                    ..watcher::Config::default()
                }
                .labels(OWNER_UID_LABEL),
            )
            .with_child_caches(caches.clone())
            .with_config(ControllerConfig {
                // One worker, one tenant (the namespace): keys run in the order they were
                // queued, so once w1's reconcile is seen, one of w2 queued before it has run.
                workers: 1,
                // Only a relist can trigger the repair: no resync within the test.
                resync_period: Duration::from_secs(3600),
                ..ControllerConfig::default()
            })
            .run(reconcile, Arc::clone(&ctx), async {
                let _ = stopped.await;
            }),
    );

    // Two widgets; each reconcile creates its child (whose watch event, our own write, does
    // not reconcile the widget again); the child watch's store then holds both children.
    for name in ["w1", "w2"] {
        widgets
            .create(
                &PostParams::default(),
                &Widget::new(name, WidgetSpec { value: 1 }),
            )
            .await
            .unwrap();
    }
    wait_until("both widgets' children created", WAIT, || {
        let log = ctx.log.lock().unwrap();
        wrote(&log, "w1") && wrote(&log, "w2")
    })
    .await;
    wait_until("the child watch's store holds both children", WAIT, || {
        caches.objects() == 2
    })
    .await;
    wait_until("the child watch is open", WAIT, || {
        faults.open_watches() == 1
    })
    .await;
    Running {
        ns,
        truth,
        faults,
        caches,
        ctx,
        stop,
        controller,
    }
}

impl Running {
    async fn stop(self) {
        self.faults.clear();
        self.stop.send(()).unwrap();
        let report = self.controller.await.unwrap().unwrap();
        assert!(report.drained());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_deleted_while_its_watch_was_down_is_recreated_by_the_relist() {
    let Running {
        ns,
        truth,
        faults,
        caches,
        ctx,
        stop,
        controller,
    } = running("ctl-relist", None).await;
    let before = ctx.log.lock().unwrap().len();
    let lists = faults.requests()[&Verb::List];

    // The child watch stalls; w1's child is deleted meanwhile; the watch then expires.
    faults.hold_watches(true);
    truth
        .delete(&child_name("w1"), &DeleteParams::default())
        .await
        .unwrap();
    assert!(truth.get_opt(&child_name("w1")).await.unwrap().is_none());
    assert_eq!(faults.expire_watches(), 1);

    // The relist misses the child: its owner is reconciled and recreates it.
    let recreated =
        server_shows(|| async { truth.get_opt(&child_name("w1")).await.unwrap().is_some() }).await;
    assert!(
        recreated,
        "w1's child was not recreated within {WAIT:?} of the relist; reconciles since the \
         delete: {:?}",
        &ctx.log.lock().unwrap()[before..]
    );
    // The reconcile logs itself once its apply returned.
    wait_until("the recreating reconcile's entry", WAIT, || {
        ctx.log.lock().unwrap().len() > before
    })
    .await;
    let after: Vec<Written> = ctx.log.lock().unwrap()[before..].to_vec();
    assert_eq!(
        after,
        [("w1".to_owned(), true)],
        "exactly one reconcile, of the owner, which wrote the missing child (w2's child was \
         relisted unchanged)"
    );
    assert_eq!(
        faults.requests()[&Verb::List],
        lists + 1,
        "the child watch relisted once"
    );
    assert_eq!(
        caches
            .lookup::<ConfigMap>(Some(&ns), &child_name("w1"))
            .map(|c| c.is_some()),
        Some(true),
        "the engine's own write of the new child is visible to the next reconcile"
    );

    faults.hold_watches(false);
    stop.send(()).unwrap();
    let report = controller.await.unwrap().unwrap();
    assert!(report.drained());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_changed_while_its_watch_was_down_is_repaired_once_the_relist_is_complete() {
    let r = running("ctl-relist-drift", Some(1)).await;
    let before = r.ctx.log.lock().unwrap().len();

    // The child watch stalls; another manager changes w1's child meanwhile; the watch then
    // expires, and each page of the relist takes a while: w1's child arrives a page before
    // the list's end, and until then the child store holds the child of before the list,
    // which looks converged.
    r.faults.hold_watches(true);
    let mut child = r.truth.get(&child_name("w1")).await.unwrap();
    child.data = Some([("k".to_owned(), "tampered".to_owned())].into());
    r.truth
        .replace(&child_name("w1"), &PostParams::default(), &child)
        .await
        .unwrap();
    r.faults.latency(Duration::from_millis(1500));
    assert_eq!(r.faults.expire_watches(), 1);

    let repaired = server_shows(|| async {
        r.truth.get(&child_name("w1")).await.unwrap().data.unwrap()["k"] == "v"
    })
    .await;
    assert!(
        repaired,
        "w1's child was not repaired within {WAIT:?} of the relist; reconciles since the \
         change: {:?}",
        &r.ctx.log.lock().unwrap()[before..]
    );
    wait_until("the repairing reconcile's entry", WAIT, || {
        r.ctx.log.lock().unwrap().len() > before
    })
    .await;
    assert_eq!(
        r.ctx.log.lock().unwrap()[before..].to_vec(),
        [("w1".to_owned(), true)],
        "exactly one reconcile, of the owner, judged by the relisted child and repairing it"
    );
    r.stop().await;
}

/// Records each reconcile's (name, uid).
async fn record_uid(
    obj: Arc<Widget>,
    log: Arc<Mutex<Vec<Entry>>>,
    _: Attempt,
) -> Result<Action, kube::Error> {
    log.lock()
        .unwrap()
        .push((obj.name_any(), obj.uid().unwrap_or_default()));
    Ok(Action::await_change())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_deleted_and_recreated_while_its_watch_was_down_is_reconciled_again() {
    let cp = idem_tests::shared();
    let client = cp.client();
    install_widget(&client).await;
    let ns = namespace(&client, "ctl-relist-uid").await;
    let truth: Api<Widget> = Api::namespaced(client.clone(), &ns);
    // The primary watch goes through the faults.
    let faults = Faults::new();
    let widgets: Api<Widget> = Api::namespaced(faults.client(cp.config()).unwrap(), &ns);
    let log: Arc<Mutex<Vec<Entry>>> = Arc::new(Mutex::new(Vec::new()));
    let (stop, stopped) = oneshot::channel::<()>();
    // One object per list page, so the relist below delivers w1 a page before w2 and the
    // list's end (`InitDone`).
    let controller = tokio::spawn(
        Controller::new(widgets, watcher::Config::default().page_size(1))
            .with_config(ControllerConfig {
                workers: 1, // keys in queue order, see the child test
                resync_period: Duration::from_secs(3600),
                ..ControllerConfig::default()
            })
            .run(record_uid, Arc::clone(&log), async {
                let _ = stopped.await;
            }),
    );
    let pp = PostParams::default();
    let mut uids = Vec::new();
    for name in ["w1", "w2"] {
        let w = truth
            .create(&pp, &Widget::new(name, WidgetSpec { value: 1 }))
            .await
            .unwrap();
        uids.push(w.uid().unwrap());
    }
    wait_until("both widgets reconciled", WAIT, || {
        let log = log.lock().unwrap();
        uids.iter().all(|u| log.iter().any(|(_, uid)| uid == u))
    })
    .await;
    wait_until("the primary watch is open", WAIT, || {
        faults.open_watches() == 1
    })
    .await;
    let before = log.lock().unwrap().len();

    // While the watch stalls, w1 is deleted and created again with the same spec: the same
    // name, generation 1, labels and annotations — only its uid tells them apart.
    faults.hold_watches(true);
    truth.delete("w1", &DeleteParams::default()).await.unwrap();
    let again = truth
        .create(&pp, &Widget::new("w1", WidgetSpec { value: 1 }))
        .await
        .unwrap();
    assert_eq!(again.metadata.generation, Some(1));
    let new_uid = again.uid().unwrap();
    assert_ne!(new_uid, uids[0]);
    // Each page of the relist takes a while: between w1's page and the list's end, a worker
    // is free to take w1. The reflector's store still holds the w1 of before the list (the
    // held Delete event was discarded), so w1 must not be queued before the list is complete.
    faults.latency(Duration::from_millis(1500));
    assert_eq!(faults.expire_watches(), 1);

    wait_until("a reconcile of the recreated w1", WAIT, || {
        log.lock().unwrap()[before..]
            .iter()
            .any(|(_, uid)| *uid == new_uid)
    })
    .await;
    assert_eq!(
        log.lock().unwrap()[before..].to_vec(),
        [("w1".to_owned(), new_uid)],
        "exactly one reconcile, of the new w1 (w2 was relisted unchanged)"
    );

    faults.clear();
    stop.send(()).unwrap();
    let report = controller.await.unwrap().unwrap();
    assert!(report.drained());
}
