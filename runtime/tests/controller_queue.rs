//! Against the real control plane: how the controller feeds its queue — the first list after
//! start is a low-priority replay that a user's change overtakes, and a key backing off after
//! a failure is not retried early by child events, only by a change of its own spec or, at
//! most every 10 s, the deletion of a child; and a
//! quiet tenant's change gets the worker kept for it while another tenant's backlog runs.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Widget, WidgetSpec, install_widget, namespace};
use idem_runtime::backoff::BackoffConfig;
use idem_runtime::controller::{Action, Attempt, Controller, ControllerConfig, ControllerError};
use idem_runtime::queue::ShutdownReport;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::Instant;

const WAIT: Duration = Duration::from_secs(120);

/// (name, generation, when) of every reconcile, in order.
#[derive(Default)]
struct Log(Mutex<Vec<(String, i64, Instant)>>);

impl Log {
    fn push(&self, obj: &Widget) {
        self.0.lock().unwrap().push((
            obj.name_any(),
            obj.meta().generation.unwrap_or_default(),
            Instant::now(),
        ));
    }

    fn entries(&self) -> Vec<(String, i64, Instant)> {
        self.0.lock().unwrap().clone()
    }

    /// Polls until `check` holds on the log (fails after [`WAIT`]).
    async fn wait_for(&self, what: &str, check: impl Fn(&[(String, i64, Instant)]) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !check(&self.entries()) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn slow_ok(obj: Arc<Widget>, log: Arc<Log>, _: Attempt) -> Result<Action, kube::Error> {
    log.push(&obj);
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(Action::await_change())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_during_the_restart_replay_is_reconciled_before_the_replay_ends() {
    const N: usize = 150;
    let client = idem_tests::shared().client();
    install_widget(&client).await;
    let ns = namespace(&client, "ctl-replay").await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    for i in 0..N {
        let w = Widget::new(&format!("w-{i:03}"), WidgetSpec { value: 1 });
        widgets.create(&PostParams::default(), &w).await.unwrap();
    }
    // "Restart": a controller starts over an existing fleet, one worker, ~20 ms a reconcile.
    let log = Arc::new(Log::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default())
            .with_config(ControllerConfig {
                workers: 1,
                resync_period: Duration::ZERO,
                ..ControllerConfig::default()
            })
            .run(slow_ok, Arc::clone(&log), async {
                let _ = stopped.await;
            }),
    );
    log.wait_for("the replay to begin", |l| !l.is_empty()).await;
    // The user changes the object the list returned last.
    let last = format!("w-{:03}", N - 1);
    widgets
        .patch(
            &last,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"value": 2}})),
        )
        .await
        .unwrap();
    log.wait_for("the change to be reconciled", |l| {
        l.iter().any(|(n, g, _)| *n == last && *g == 2)
    })
    .await;
    let entries = log.entries();
    let at = entries
        .iter()
        .position(|(n, g, _)| *n == last && *g == 2)
        .unwrap();
    let replayed: HashSet<&String> = entries[..at].iter().map(|(n, _, _)| n).collect();
    println!(
        "the change was reconciled as reconcile {} of a {N}-object replay",
        at + 1
    );
    assert!(
        replayed.len() < N - 1,
        "the change waited for the whole replay ({} objects first)",
        replayed.len()
    );
    log.wait_for("the replay to end", |l| {
        l.iter().map(|(n, _, _)| n).collect::<HashSet<_>>().len() == N
    })
    .await;
    stop.send(()).unwrap();
    assert!(controller.await.unwrap().unwrap().drained());
}

async fn always_fails(obj: Arc<Widget>, log: Arc<Log>, _: Attempt) -> Result<Action, String> {
    log.push(&obj);
    Err("the backend is down".to_owned())
}

/// A controller whose reconciles of the Widget `failing` always fail and back off `backoff`
/// (no growth, no jitter), with its child ConfigMap `failing-child` (not yet made).
struct Failing {
    widgets: Api<Widget>,
    cms: Api<ConfigMap>,
    log: Arc<Log>,
    child: ConfigMap,
    stop: oneshot::Sender<()>,
    controller: tokio::task::JoinHandle<Result<ShutdownReport, ControllerError>>,
}

impl Failing {
    /// Starts the controller in a new namespace, creates the Widget and waits for its first
    /// attempt.
    async fn start(prefix: &str, backoff: Duration) -> Self {
        let client = idem_tests::shared().client();
        install_widget(&client).await;
        let ns = namespace(&client, prefix).await;
        let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let log = Arc::new(Log::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let controller = tokio::spawn(
            Controller::new(widgets.clone(), watcher::Config::default())
                .owns(cms.clone(), watcher::Config::default())
                .with_config(ControllerConfig {
                    workers: 2,
                    resync_period: Duration::ZERO,
                    backoff: BackoffConfig {
                        base: backoff,
                        factor: 1.0,
                        cap: backoff,
                        jitter: 0.0,
                    },
                    ..ControllerConfig::default()
                })
                .run(always_fails, Arc::clone(&log), async {
                    let _ = stopped.await;
                }),
        );
        let w = widgets
            .create(
                &PostParams::default(),
                &Widget::new("failing", WidgetSpec { value: 1 }),
            )
            .await
            .unwrap();
        log.wait_for("the first attempt", |l| !l.is_empty()).await;
        let child = ConfigMap {
            metadata: ObjectMeta {
                name: Some("failing-child".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "test.idem.dev/v1".into(),
                    kind: "Widget".into(),
                    name: "failing".into(),
                    uid: w.uid().unwrap(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([("n".to_owned(), "0".to_owned())])),
            ..ConfigMap::default()
        };
        Self {
            widgets,
            cms,
            log,
            child,
            stop,
            controller,
        }
    }

    /// Makes the child and deletes it; returns when it was deleted.
    async fn delete_child(&self) -> Instant {
        (self.cms.create(&PostParams::default(), &self.child))
            .await
            .unwrap();
        (self.cms.delete("failing-child", &Default::default()))
            .await
            .unwrap();
        Instant::now()
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.controller.await.unwrap().unwrap();
    }
}

/// Issue 10, item 8: child events while a key backs off do not bypass the backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_events_do_not_bypass_backoff_but_a_spec_change_does() {
    // Long enough that a spec change's retry (a PATCH, its watch event, a dispatch) stays
    // well inside two thirds of it on a loaded machine.
    const BACKOFF: Duration = Duration::from_secs(6);
    let failing = Failing::start("ctl-backoff", BACKOFF).await;
    let Failing {
        widgets, cms, log, ..
    } = &failing;
    cms.create(&PostParams::default(), &failing.child)
        .await
        .unwrap();
    // Child events every ~100 ms for 2.5 backoff periods.
    let until = Instant::now() + BACKOFF * 5 / 2;
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        cms.patch(
            "failing-child",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"n": n.to_string()}})),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let attempts = log.entries();
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1].2 - w[0].2).collect();
    println!(
        "{n} child edits; attempts {}, gaps {gaps:?}",
        attempts.len()
    );
    assert!(attempts.len() >= 2, "retries go on: {}", attempts.len());
    for gap in &gaps {
        assert!(
            *gap >= BACKOFF - Duration::from_millis(100),
            "a child event bypassed the {BACKOFF:?} backoff: gaps {gaps:?}"
        );
    }
    // Right after a failed attempt, a change of the spec is retried at once.
    let before = log.entries().len();
    log.wait_for("the next attempt", |l| l.len() > before).await;
    let failed_at = Instant::now();
    widgets
        .patch(
            "failing",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"value": 2}})),
        )
        .await
        .unwrap();
    log.wait_for("an attempt at generation 2", |l| {
        l.iter().any(|(_, g, _)| *g == 2)
    })
    .await;
    let waited = failed_at.elapsed();
    println!("spec change retried after {waited:?} (backoff {BACKOFF:?})");
    assert!(
        waited < BACKOFF * 2 / 3,
        "the spec change waited for the backoff: {waited:?}"
    );
    failing.stop().await;
}

/// A child deleted while its owner backs off ends the wait: the next attempt repairs it at
/// once. At most once per 10 s (a failing reconcile deleting its own children retries no more
/// often): a deletion right after that early attempt waits for the retry the early attempt
/// replaced, which its own failure does not push later; 10 s on, a deletion ends the wait
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_child_ends_a_backoff_wait_at_most_every_ten_seconds() {
    const BACKOFF: Duration = Duration::from_secs(12);
    const SPACING: Duration = Duration::from_secs(10);
    let failing = Failing::start("ctl-repair", BACKOFF).await;
    let log = &failing.log;
    let first = log.entries()[0].2;
    // Well inside the wait, so that a retry pushed to the early attempt's own backoff shows.
    tokio::time::sleep_until(first + Duration::from_secs(4)).await;
    let deleted = failing.delete_child().await;
    log.wait_for("an early attempt", |l| l.len() >= 2).await;
    let early = log.entries()[1].2;
    println!("deleted child repaired after {:?}", early - deleted);
    assert!(
        early - deleted < BACKOFF / 3,
        "the deletion waited for the backoff: {:?}",
        early - deleted
    );
    // Within 10 s of the early attempt, a deletion does not end the wait.
    failing.delete_child().await;
    log.wait_for("the ordinary retry", |l| l.len() >= 3).await;
    let retry = log.entries()[2].2;
    println!(
        "retried {:?} after the first attempt, {:?} after the early one",
        retry - first,
        retry - early
    );
    assert!(
        retry - first >= BACKOFF - Duration::from_millis(100),
        "a second deletion within 10 s ended the wait: {:?}",
        retry - first
    );
    assert!(
        retry - early < BACKOFF - Duration::from_secs(2),
        "the early attempt's failure pushed the retry later: {:?} after it",
        retry - early
    );
    // 10 s after the early attempt, a deletion ends the wait again.
    tokio::time::sleep_until(early + SPACING + Duration::from_millis(500)).await;
    let deleted = failing.delete_child().await;
    log.wait_for("another early attempt", |l| l.len() >= 4)
        .await;
    let again = log.entries()[3].2;
    assert!(
        again - deleted < BACKOFF / 3,
        "10 s on, the deletion waited: {:?}",
        again - deleted
    );
    failing.stop().await;
}

/// Reconciles of `busy-*` Widgets (tenant `busy`) hold their worker until `gate` opens; the
/// others (tenant `quiet`) return at once. Every start is logged.
async fn held_while_busy(
    obj: Arc<Widget>,
    ctx: Arc<(Log, tokio::sync::Semaphore)>,
    _: Attempt,
) -> Result<Action, kube::Error> {
    ctx.0.push(&obj);
    if obj.name_any().starts_with("busy") {
        let _permit = ctx.1.acquire().await;
    }
    Ok(Action::await_change())
}

/// Starts a controller with `workers` and `idle_reserve` over six `busy-*` Widgets made
/// before it starts (so all six are queued at once), and waits until `held` of them run.
async fn busy_tenant_holds(
    prefix: &str,
    workers: usize,
    idle_reserve: usize,
    held: usize,
) -> (
    Api<Widget>,
    Arc<(Log, tokio::sync::Semaphore)>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<
        Result<idem_runtime::queue::ShutdownReport, idem_runtime::controller::ControllerError>,
    >,
) {
    let client = idem_tests::shared().client();
    install_widget(&client).await;
    let ns = namespace(&client, prefix).await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    for i in 0..6 {
        let w = Widget::new(&format!("busy-{i}"), WidgetSpec { value: 1 });
        widgets.create(&PostParams::default(), &w).await.unwrap();
    }
    let ctx = Arc::new((Log::default(), tokio::sync::Semaphore::new(0)));
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default())
            .tenant_of(|w: &Widget| {
                idem_runtime::TenantKey::new(if w.name_any().starts_with("busy") {
                    "busy"
                } else {
                    "quiet"
                })
            })
            .with_config(ControllerConfig {
                workers,
                idle_reserve,
                resync_period: Duration::ZERO,
                ..ControllerConfig::default()
            })
            .run(held_while_busy, Arc::clone(&ctx), async {
                let _ = stopped.await;
            }),
    );
    ctx.0
        .wait_for("the busy tenant's reconciles to start", |l| l.len() >= held)
        .await;
    (widgets, ctx, stop, controller)
}

/// `ControllerConfig::idle_reserve`: with the default reserve of one worker, a tenant whose
/// backlog holds every worker it may take leaves the last one to a tenant with nothing
/// running, whose change starts while all of the busy tenant's reconciles still run; with no
/// reserve the busy tenant takes every worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_tenants_change_starts_while_a_busy_tenant_holds_every_other_worker() {
    let (widgets, ctx, stop, controller) = busy_tenant_holds("ctl-reserve", 4, 1, 3).await;
    widgets
        .create(
            &PostParams::default(),
            &Widget::new("quiet", WidgetSpec { value: 1 }),
        )
        .await
        .unwrap();
    ctx.0
        .wait_for("the quiet tenant's reconcile", |l| {
            l.iter().any(|(n, _, _)| n == "quiet")
        })
        .await;
    let started: Vec<String> = ctx.0.entries().into_iter().map(|(n, _, _)| n).collect();
    let busy = started.iter().filter(|n| n.starts_with("busy")).count();
    assert_eq!(
        busy, 3,
        "the busy tenant ran 3 of 4 workers, none finished, when the quiet one started: {started:?}"
    );
    ctx.1.add_permits(100);
    ctx.0
        .wait_for("every busy reconcile", |l| l.len() == 7)
        .await;
    stop.send(()).unwrap();
    assert!(controller.await.unwrap().unwrap().drained());

    // No reserve: the busy tenant's backlog takes all four workers.
    let (_, ctx, stop, controller) = busy_tenant_holds("ctl-noreserve", 4, 0, 4).await;
    let started: Vec<String> = ctx.0.entries().into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(started.len(), 4, "{started:?}");
    ctx.1.add_permits(100);
    ctx.0
        .wait_for("every busy reconcile", |l| l.len() == 6)
        .await;
    stop.send(()).unwrap();
    assert!(controller.await.unwrap().unwrap().drained());
}
