//! Against the real control plane (rule 8): a reconcile that writes its primary's status does
//! not trigger itself again; over 30 s it runs once, and the apiserver saw one status write.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Echo, EchoSpec, install_echo, namespace};
use idem_runtime::controller::{Action, Attempt, Controller, ControllerConfig};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::oneshot;

struct Ctx {
    api: Api<Echo>,
    reconciles: AtomicUsize,
}

async fn write_status(obj: Arc<Echo>, ctx: Arc<Ctx>, _: Attempt) -> Result<Action, kube::Error> {
    let n = ctx.reconciles.fetch_add(1, Ordering::SeqCst) + 1;
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
    Ok(Action::await_change())
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
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::new(echoes.clone(), watcher::Config::default())
            .with_config(ControllerConfig::default()) // default resync: 10 h
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
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = cp.metrics().await.unwrap();
    assert_eq!(
        ctx.reconciles.load(Ordering::SeqCst),
        1,
        "reconciled once in 30 s"
    );
    let status = echoes.get_status("e1").await.unwrap().status.unwrap();
    assert_eq!(status.reconciles, 1);
    let plural = Echo::plural(&());
    let writes = |text: &str| idem_tests::metrics::writes(text, "test.idem.dev", &plural);
    // One create by the test, one status write by the reconcile, nothing else.
    let lines: Vec<&str> = after
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total") && l.contains(&*plural))
        .collect();
    assert_eq!(
        writes(&after) - writes(&before),
        2,
        "apiserver writes on {plural}; samples: {lines:#?}"
    );

    // A spec change is still seen: exactly one more reconcile, one more status write.
    let spec = json!({"spec": {"value": 2}});
    echoes
        .patch("e1", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(ctx.reconciles.load(Ordering::SeqCst), 2);
    stop.send(()).unwrap();
    controller.await.unwrap().unwrap();
}
