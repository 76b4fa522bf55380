//! Against the real control plane, in a process of its own (the releases are the process's):
//! a controller whose queue drained gives free memory back once per burst
//! (`idem_memory_releases_total`), and one with `release_memory_when_idle: None` never does.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{namespace, wait_until};
use idem_runtime::controller::{Action, Attempt, Controller, ControllerConfig};
use idem_runtime::metrics::Metrics;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::watcher;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

/// The value of the sample `series` (name and labels, exactly) in `registry`; 0 when absent.
fn read(registry: &Registry, series: &str) -> f64 {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"idle": "yes"}}
    }))
    .unwrap()
}

#[tokio::test]
async fn a_drained_queue_releases_memory_once_per_burst_unless_switched_off() {
    let client = idem_tests::shared().client();
    let ns = namespace(&client, "idle-memory").await;
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let start =
        |name: &str, release: Option<Duration>, synced: tokio::sync::watch::Sender<bool>| {
            let config = ControllerConfig {
                name: Some(name.into()),
                release_memory_when_idle: release,
                ..ControllerConfig::default()
            };
            let controller =
                Controller::new(api.clone(), watcher::Config::default().labels("idle=yes"))
                    .with_config(config)
                    .with_metrics(metrics.clone())
                    .with_synced_signal(synced);
            let reconcile = |_: Arc<ConfigMap>, _: Arc<()>, _: Attempt| async {
                Ok::<_, String>(Action::await_change())
            };
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let run = tokio::spawn(controller.run(reconcile, Arc::new(()), async {
                let _ = stopped.await;
            }));
            (stop, run)
        };
    let (off_synced, mut off_listed) = tokio::sync::watch::channel(false);
    let (on_synced, mut on_listed) = tokio::sync::watch::channel(false);
    let off = start("off", None, off_synced);
    let on = start("on", Some(Duration::from_millis(200)), on_synced);
    off_listed.wait_for(|s| *s).await.unwrap();
    on_listed.wait_for(|s| *s).await.unwrap();
    let registry = Arc::new(registry);
    let success = |c: &str| {
        read(
            &registry,
            &format!(r#"controller_runtime_reconcile_total{{controller="{c}",result="success"}}"#),
        )
    };
    let releases = |c: &str| {
        read(
            &registry,
            &format!(r#"idem_memory_releases_total{{controller="{c}"}}"#),
        )
    };
    let wait = Duration::from_secs(60);
    api.create(&PostParams::default(), &config_map("one"))
        .await
        .unwrap();
    // The one that does not release reconciles first; the other's release follows its own
    // reconcile and 200 ms with nothing queued.
    wait_until("off reconciled", wait, || success("off") >= 1.0).await;
    wait_until("on reconciled", wait, || success("on") >= 1.0).await;
    let reconciled = std::time::Instant::now();
    wait_until("on released memory", wait, || releases("on") >= 1.0).await;
    assert_eq!(releases("on"), 1.0, "one release for one burst");
    // Soon after the burst (its 200 ms of quiet), not held back by an earlier release's 10 s
    // (that a worker's start is not work is the worker's unit test).
    let after = reconciled.elapsed();
    assert!(
        after < Duration::from_secs(5),
        "released {after:?} after the reconcile"
    );
    assert_eq!(releases("off"), 0.0, "switched off");
    // A second burst: its own release, once the 10 s between two releases have passed.
    api.create(&PostParams::default(), &config_map("two"))
        .await
        .unwrap();
    wait_until("on reconciled the second", wait, || success("on") >= 2.0).await;
    wait_until("on released after the second burst", wait, || {
        releases("on") >= 2.0
    })
    .await;
    assert_eq!(releases("on"), 2.0, "one release for the second burst");
    wait_until("off reconciled the second", wait, || success("off") >= 2.0).await;
    assert_eq!(releases("off"), 0.0, "switched off");
    for (stop, run) in [off, on] {
        stop.send(()).unwrap();
        run.await.unwrap().unwrap();
    }
}
