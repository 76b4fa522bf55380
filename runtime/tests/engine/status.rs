//! Status writes: 409 on a race then success, stable lastTransitionTime, observedGeneration
//! never going backwards, finalizer edits guarded by resourceVersion.

use std::time::Duration;

use idem_runtime::status::{Readiness, StatusOutcome, StatusWriter};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::*;

fn writer(ns: &str) -> StatusWriter<Widget> {
    StatusWriter::new(Api::namespaced(client(), ns))
}

#[tokio::test]
async fn status_write_racing_another_writer_gets_409_and_succeeds_on_retry() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.write().await;
    let ns = namespace(&client, "status-race").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    reconcile(&client, &w).await.expect("first reconcile");
    let read = get_widget(&client, &ns, "w").await;

    // Another writer changes the status after our read.
    let api: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let mut rival = read.clone();
    rival.status.as_mut().expect("status").note = Some("rival was here".into());
    api.replace_status("w", &PostParams::default(), &rival)
        .await
        .expect("rival status write");

    let before = counts("test.idem.dev", "widgets").await;
    let progressing = Readiness::Reconciling {
        reason: "Progressing".into(),
        message: "rolling out".into(),
    };
    let outcome = writer(&ns)
        .write(&read, |_, d| {
            d.set_readiness(&progressing);
        })
        .await
        .expect("write succeeds after retry");
    let after = counts("test.idem.dev", "widgets").await;
    assert!(matches!(outcome, StatusOutcome::Written(_)), "{outcome:?}");
    assert_eq!(
        after.conflicts - before.conflicts,
        1,
        "exactly one 409 seen by the server"
    );
    assert_eq!(
        after.status_writes - before.status_writes,
        2,
        "the 409 and the retry"
    );

    let w = get_widget(&client, &ns, "w").await;
    let status = w.status.as_ref().expect("status");
    assert_eq!(
        status.note.as_deref(),
        Some("rival was here"),
        "rival's write not lost"
    );
    assert_eq!(condition(&w, "Reconciling").status, "True");
    assert_eq!(condition(&w, "Ready").reason, "Progressing");
}

#[tokio::test]
async fn last_transition_time_moves_only_when_status_flips() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "ltt").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    reconcile(&client, &w).await.expect("first reconcile");
    let w = get_widget(&client, &ns, "w").await;
    let t0 = condition(&w, "Ready").last_transition_time.clone();
    assert_eq!(condition(&w, "Ready").status, "True");

    // metav1.Time has one-second resolution: wait until the clock is past t0's second, so
    // that a moved time would show.
    let t0_second = t0.0.as_second();
    while k8s_openapi::jiff::Timestamp::now().as_second() <= t0_second {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, outcome) = reconcile(&client, &w).await.expect("reconcile");
    assert!(matches!(outcome, StatusOutcome::Unchanged), "{outcome:?}");
    // Same status, another reason: written, time kept.
    let outcome = writer(&ns)
        .write(&w, |_, d| {
            d.set_readiness(&Readiness::Ready {
                reason: "StillReady".into(),
                message: "m".into(),
            });
        })
        .await
        .expect("write");
    let StatusOutcome::Written(w) = outcome else {
        panic!("reason changed, so the status is written: {outcome:?}")
    };
    assert_eq!(condition(&w, "Ready").last_transition_time, t0);
    assert_eq!(condition(&w, "Ready").reason, "StillReady");

    // Flip: time moves.
    let outcome = writer(&ns)
        .write(&w, |_, d| {
            d.set_readiness(&Readiness::Reconciling {
                reason: "Progressing".into(),
                message: "m".into(),
            });
        })
        .await
        .expect("write");
    let StatusOutcome::Written(w) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(condition(&w, "Ready").last_transition_time > t0);
}

#[tokio::test]
async fn observed_generation_never_goes_backwards() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "obsgen").await;
    let old = create_widget(&client, &ns, "w", widget_spec()).await;
    assert_eq!(old.metadata.generation, Some(1));
    let api: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let new = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("edit spec");
    assert_eq!(new.metadata.generation, Some(2));
    reconcile(&client, &new).await.expect("reconcile newer");
    // A reconcile that started from the older object finishes late.
    let outcome = writer(&ns)
        .write(&old, |_, d| {
            d.set_readiness(&Readiness::Reconciling {
                reason: "Stale".into(),
                message: "from an old read".into(),
            });
        })
        .await
        .expect("no error");
    assert!(matches!(outcome, StatusOutcome::Superseded), "{outcome:?}");
    let w = get_widget(&client, &ns, "w").await;
    assert_eq!(
        w.status.as_ref().and_then(|s| s.observed_generation),
        Some(2)
    );
    assert_eq!(condition(&w, "Ready").status, "True");
}

#[tokio::test]
async fn finalizer_edits_survive_a_concurrent_change() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "finalizer").await;
    let read = create_widget(&client, &ns, "w", widget_spec()).await;
    let api: Api<Widget> = Api::namespaced(client.clone(), &ns);
    // Someone else adds a finalizer after our read.
    api.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"finalizers": ["example.com/other"]}})),
    )
    .await
    .expect("other finalizer");
    let w = writer(&ns)
        .add_finalizer(&read, "tenancy.idem.dev/cleanup")
        .await
        .expect("add")
        .expect("written");
    let list = w.metadata.finalizers.clone().unwrap_or_default();
    assert_eq!(
        list,
        vec!["example.com/other", "tenancy.idem.dev/cleanup"],
        "no lost update"
    );
    assert!(
        writer(&ns)
            .add_finalizer(&w, "tenancy.idem.dev/cleanup")
            .await
            .expect("add")
            .is_none()
    );
    let w = writer(&ns)
        .remove_finalizer(&w, "tenancy.idem.dev/cleanup")
        .await
        .expect("remove")
        .expect("written");
    assert_eq!(
        w.metadata.finalizers.unwrap_or_default(),
        vec!["example.com/other"]
    );
}
