//! Against the real control plane: the metrics users alert on move — a reconcile that panics
//! counts in `controller_runtime_reconcile_panics_total` (and errors) and the worker lives on;
//! a terminal error counts in `controller_runtime_terminal_reconcile_errors_total` and in the
//! errors (as in controller-runtime) and is not retried;
//! a hanging reconcile shows in `controller_runtime_active_workers`,
//! `workqueue_unfinished_work_seconds` and `workqueue_longest_running_processor_seconds`;
//! `controller_runtime_max_concurrent_reconciles` is the worker count. Plus the in-flight
//! gauges' arithmetic on a bare queue with paused time.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{namespace, wait_until};
use idem_runtime::controller::{Action, Attempt, Controller, ControllerConfig};
use idem_runtime::metrics::Metrics;
use idem_runtime::queue::{Priority, QueueConfig, WorkQueue};
use idem_runtime::{ObjectKey, TenantKey};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text
}

/// The value of the sample `series` (name and labels, exactly); `None` when absent.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .map(|v| v.parse().unwrap())
    })
}

#[tokio::test(start_paused = true)]
async fn in_flight_gauges_sum_and_max_the_keys_being_processed() {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let queue = WorkQueue::with_metrics(QueueConfig::default(), metrics.queue("q")).unwrap();
    let tenant = TenantKey::new("t");
    let unfinished = r#"workqueue_unfinished_work_seconds{name="q"}"#;
    let longest = r#"workqueue_longest_running_processor_seconds{name="q"}"#;
    queue.add(&ObjectKey::cluster("K", "a"), &tenant, Priority::Event);
    queue.add(&ObjectKey::cluster("K", "b"), &tenant, Priority::Event);
    let a = queue.try_get().unwrap();
    assert_eq!(value(&scrape(&registry), unfinished), Some(0.0));
    tokio::time::advance(Duration::from_secs(2)).await;
    let b = queue.try_get().unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    let text = scrape(&registry);
    assert_eq!(value(&text, unfinished), Some(4.0), "3 s + 1 s:\n{text}");
    assert_eq!(value(&text, longest), Some(3.0));
    a.done();
    let text = scrape(&registry);
    assert_eq!(value(&text, unfinished), Some(1.0));
    assert_eq!(value(&text, longest), Some(1.0));
    b.done();
    let text = scrape(&registry);
    assert_eq!(value(&text, unfinished), Some(0.0));
    assert_eq!(value(&text, longest), Some(0.0));
}

#[tokio::test]
async fn panics_errors_and_hanging_reconciles_show_in_the_metrics() {
    let client = idem_tests::shared().client();
    let ns = namespace(&client, "metrics").await;
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let release = Arc::new((Notify::new(), AtomicUsize::new(0)));
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let config = ControllerConfig {
        name: Some("cm".into()),
        workers: 3,
        ..ControllerConfig::default()
    };
    let controller = Controller::new(
        api.clone(),
        watcher::Config::default().labels("metrics=yes"),
    )
    .with_config(config)
    .with_metrics(metrics);
    let reconcile = |cm: Arc<ConfigMap>, ctx: Arc<(Notify, AtomicUsize)>, _: Attempt| async move {
        match cm.name_any().as_str() {
            "boom" => panic!("deliberate panic in a reconcile"),
            "hang" => {
                ctx.0.notified().await;
                Ok(Action::await_change())
            }
            "invalid" => {
                ctx.1.fetch_add(1, Ordering::SeqCst);
                Ok(Action::terminal())
            }
            _ => Ok::<_, String>(Action::await_change()),
        }
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(reconcile, Arc::clone(&release), async {
        let _ = stopped.await;
    }));
    let registry = Arc::new(registry);
    let read = |series: &str| value(&scrape(&registry), series).unwrap_or(0.0);
    let errors = r#"controller_runtime_reconcile_errors_total{controller="cm"}"#;
    let panics = r#"controller_runtime_reconcile_panics_total{controller="cm"}"#;
    let terminal = r#"controller_runtime_terminal_reconcile_errors_total{controller="cm"}"#;
    let result_error = r#"controller_runtime_reconcile_total{controller="cm",result="error"}"#;
    let active = r#"controller_runtime_active_workers{controller="cm"}"#;
    let max = r#"controller_runtime_max_concurrent_reconciles{controller="cm"}"#;
    let success = r#"controller_runtime_reconcile_total{controller="cm",result="success"}"#;
    let unfinished = r#"workqueue_unfinished_work_seconds{name="cm"}"#;
    let longest = r#"workqueue_longest_running_processor_seconds{name="cm"}"#;
    for name in ["boom", "hang", "invalid"] {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"metrics": "yes"}}
        }))
        .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    let wait = Duration::from_secs(60);
    wait_until("a panic counted", wait, || read(panics) >= 1.0).await;
    wait_until("the terminal error counted", wait, || read(terminal) == 1.0).await;
    // Terminal errors and panics are errors. A failed reconcile's counters go up one after
    // the other while the panicking key keeps retrying: a scrape between two of them is read
    // again.
    let counted = || {
        let text = scrape(&registry);
        let (t, p) = (
            value(&text, terminal).unwrap(),
            value(&text, panics).unwrap(),
        );
        value(&text, errors).unwrap() >= t + p && value(&text, result_error).unwrap() >= t + p
    };
    wait_until(
        "terminal errors and panics counted as errors",
        wait,
        counted,
    )
    .await;
    wait_until("the hanging reconcile active", wait, || read(active) == 1.0).await;
    assert_eq!(read(max), 3.0);
    wait_until("its work counted as unfinished", wait, || {
        read(longest) > 0.5
    })
    .await;
    let text = scrape(&registry);
    assert!(value(&text, unfinished) >= value(&text, longest), "{text}");
    // The worker that caught the panic lives on: a new object is still reconciled.
    let ok: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "fine", "labels": {"metrics": "yes"}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &ok).await.unwrap();
    wait_until("the fine one reconciled", wait, || read(success) >= 1.0).await;
    // An error is retried with backoff (200 ms, 400 ms, …): once the panicking key was
    // retried twice, a terminal error treated as an ordinary one would have been too.
    wait_until("the panicking key retried twice", wait, || {
        read(panics) >= 3.0
    })
    .await;
    assert_eq!(
        release.1.load(Ordering::SeqCst),
        1,
        "a terminal error was retried"
    );
    assert_eq!(read(terminal), 1.0);
    release.0.notify_waiters();
    wait_until("the hang released", wait, || read(active) == 0.0).await;
    wait_until("no unfinished work", wait, || read(longest) == 0.0).await;
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
}
