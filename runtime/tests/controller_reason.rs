//! Against the real control plane: the controller tells each reconcile why it runs
//! ([`Attempt::reason`]): the object changed, a child changed, a requeue, a retry after an
//! error, the periodic resync; and runs it in its tenant's scope, so requests through an
//! `inflight::RequestSlots` client count as that tenant's.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{namespace, wait_until};
use idem_runtime::TenantKey;
use idem_runtime::controller::{Action, Attempt, Controller, ControllerConfig, Reason};
use idem_runtime::inflight::current_tenant;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};

/// Reasons seen per object name, in order.
type Seen = Arc<Mutex<HashMap<String, Vec<Reason>>>>;

/// Per reconcile: the request scope's tenant and the attempt's.
static SCOPES: Mutex<Vec<(Option<TenantKey>, TenantKey)>> = Mutex::new(Vec::new());

fn seen(log: &Seen, name: &str) -> Vec<Reason> {
    log.lock().unwrap().get(name).cloned().unwrap_or_default()
}

#[tokio::test]
async fn each_reconcile_is_told_why_it_runs() {
    let client = idem_tests::shared().client();
    let ns = namespace(&client, "reason").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let selected = || watcher::Config::default().labels("reason=yes");
    let config = ControllerConfig {
        resync_period: Duration::from_secs(3),
        resync_jitter: 0.0,
        ..ControllerConfig::default()
    };
    let (synced_tx, mut synced) = tokio::sync::watch::channel(false);
    let controller = Controller::new(cms.clone(), selected())
        .owns(secrets.clone(), selected())
        .with_config(config)
        .with_synced_signal(synced_tx);
    let log: Seen = Arc::default();
    let reconcile = |cm: Arc<ConfigMap>, log: Seen, attempt: Attempt| async move {
        let name = cm.name_any();
        SCOPES
            .lock()
            .unwrap()
            .push((current_tenant(), attempt.tenant.clone()));
        let count = {
            let mut log = log.lock().unwrap();
            let reasons = log.entry(name.clone()).or_default();
            reasons.push(attempt.reason);
            reasons.len()
        };
        match (name.as_str(), count) {
            ("requeued", 1) => Ok(Action::requeue(Duration::from_millis(200))),
            ("failing", 1) => Err("deliberate first failure".to_string()),
            _ => Ok(Action::await_change()),
        }
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(reconcile, Arc::clone(&log), async {
        let _ = stopped.await;
    }));
    synced.wait_for(|s| *s).await.unwrap();
    let mut created = HashMap::new();
    for name in ["owner", "requeued", "failing"] {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"reason": "yes"}}
        }))
        .unwrap();
        created.insert(name, cms.create(&PostParams::default(), &cm).await.unwrap());
    }
    let wait = Duration::from_secs(60);
    wait_until("the owner reconciled", wait, || {
        !seen(&log, "owner").is_empty()
    })
    .await;
    assert_eq!(seen(&log, "owner")[0], Reason::ObjectChanged);

    let owner = &created["owner"];
    let child: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "child", "labels": {"reason": "yes"}, "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
            "uid": owner.uid().unwrap(), "controller": true}]}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &child)
        .await
        .unwrap();
    wait_until("a child change seen", wait, || {
        seen(&log, "owner").contains(&Reason::ChildChanged)
    })
    .await;

    wait_until("the requeue ran", wait, || {
        seen(&log, "requeued").len() >= 2
    })
    .await;
    assert_eq!(
        seen(&log, "requeued")[..2],
        [Reason::ObjectChanged, Reason::Requeue]
    );
    wait_until("the retry ran", wait, || seen(&log, "failing").len() >= 2).await;
    assert_eq!(
        seen(&log, "failing")[..2],
        [Reason::ObjectChanged, Reason::Error]
    );
    wait_until("a resync", wait, || {
        seen(&log, "owner").contains(&Reason::Resync)
    })
    .await;
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    let scopes = SCOPES.lock().unwrap().clone();
    assert!(!scopes.is_empty());
    for (scope, tenant) in scopes {
        assert_eq!(
            scope,
            Some(tenant),
            "requests of a reconcile are its tenant's"
        );
    }
}
