//! Against the real control plane: a reconcile that writes its primary's status does
//! not trigger itself again: it runs once, and the apiserver saw one status write.
//!
//! "Not again" is checked with a barrier, not by waiting: with one worker and one tenant (the
//! namespace), keys are reconciled in the order their watch events arrive, so once a sentinel
//! object created *after* the status write has been reconciled, a reconcile that the status
//! write had caused would already have run.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Echo, EchoSpec, install_echo, namespace, wait_until};
use idem_runtime::controller::{Action, Attempt, Controller, ControllerConfig};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(60);
const SENTINEL: &str = "zz-sentinel";

struct Ctx {
    api: Api<Echo>,
    /// Reconciles of `e1`, counted once its status write returned.
    reconciles: AtomicUsize,
    /// Reconciles of the sentinel.
    sentinel: AtomicUsize,
}

async fn write_status(obj: Arc<Echo>, ctx: Arc<Ctx>, _: Attempt) -> Result<Action, kube::Error> {
    let counter = if obj.name_any() == SENTINEL {
        &ctx.sentinel
    } else {
        &ctx.reconciles
    };
    let n = counter.load(Ordering::SeqCst) + 1;
    // A different value every time: every status write is a real change of the object.
    let status = json!({"status": {
        "observedGeneration": obj.meta().generation.unwrap_or_default(),
        "reconciles": n,
    }});
    ctx.api
        .patch_status(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await?;
    counter.fetch_add(1, Ordering::SeqCst);
    Ok(Action::await_change())
}

/// Passes once every watch event handled before now has been reconciled (see the module docs):
/// bumps the sentinel's spec (creating it on `round` 0) and waits for its reconcile.
async fn barrier(echoes: &Api<Echo>, ctx: &Ctx, round: i64) {
    let before = ctx.sentinel.load(Ordering::SeqCst);
    if round == 0 {
        let sentinel = Echo::new(SENTINEL, EchoSpec { value: 0 });
        echoes
            .create(&PostParams::default(), &sentinel)
            .await
            .unwrap();
    } else {
        let spec = json!({"spec": {"value": round}});
        echoes
            .patch(SENTINEL, &PatchParams::default(), &Patch::Merge(&spec))
            .await
            .unwrap();
    }
    wait_until("the sentinel's reconcile", WAIT, || {
        ctx.sentinel.load(Ordering::SeqCst) > before
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_write_does_not_trigger_its_own_reconcile() {
    let cp = idem_tests::shared();
    let client = cp.client();
    install_echo(&client).await;
    let ns = namespace(&client, "ctl-nocycle").await;
    let echoes: Api<Echo> = Api::namespaced(client.clone(), &ns);
    let ctx = Arc::new(Ctx {
        api: echoes.clone(),
        reconciles: AtomicUsize::new(0),
        sentinel: AtomicUsize::new(0),
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::new(echoes.clone(), watcher::Config::default())
            .with_config(ControllerConfig {
                workers: 1,
                per_tenant_cap: Some(1),
                ..ControllerConfig::default() // default resync: 10 h
            })
            .run(write_status, Arc::clone(&ctx), async {
                let _ = stopped.await;
            }),
    );
    let before = cp.metrics().await.unwrap();
    echoes
        .create(
            &PostParams::default(),
            &Echo::new("e1", EchoSpec { value: 1 }),
        )
        .await
        .unwrap();
    wait_until("the first reconcile", WAIT, || {
        ctx.reconciles.load(Ordering::SeqCst) >= 1
    })
    .await;
    barrier(&echoes, &ctx, 0).await;
    let after = cp.metrics().await.unwrap();
    assert_eq!(
        ctx.reconciles.load(Ordering::SeqCst),
        1,
        "its own status write reconciled it again"
    );
    let status = echoes.get_status("e1").await.unwrap().status.unwrap();
    assert_eq!(status.reconciles, 1);
    let plural = Echo::plural(&());
    let writes = |text: &str| idem_tests::metrics::writes(text, "test.idem.dev", &plural);
    // One create by the test and one status write by the reconcile, for e1 and for the
    // sentinel; nothing else.
    let lines: Vec<&str> = after
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total") && l.contains(&*plural))
        .collect();
    assert_eq!(
        writes(&after) - writes(&before),
        4,
        "apiserver writes on {plural}; samples: {lines:#?}"
    );

    // A spec change is still seen: exactly one more reconcile, one more status write.
    let spec = json!({"spec": {"value": 2}});
    echoes
        .patch("e1", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
    wait_until("the spec change's reconcile", WAIT, || {
        ctx.reconciles.load(Ordering::SeqCst) >= 2
    })
    .await;
    barrier(&echoes, &ctx, 1).await;
    assert_eq!(ctx.reconciles.load(Ordering::SeqCst), 2);
    stop.send(()).unwrap();
    controller.await.unwrap().unwrap();
}
