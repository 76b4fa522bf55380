//! The work queue reports controller-runtime-named metrics plus idem's per-tenant figures, as
//! a Prometheus scrape sees them.

use idem_runtime::metrics::Metrics;
use idem_runtime::queue::{Priority, QueueConfig, WorkQueue};
use idem_runtime::{ObjectKey, TenantKey};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text
}

/// The value of the sample line starting with `series` (name and labels, exactly).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn queue_metrics_count_adds_dedupes_and_per_tenant_dispatches() {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let queue = WorkQueue::with_metrics(QueueConfig::default(), metrics.queue("tenant")).unwrap();
    let (a, b) = (TenantKey::new("a"), TenantKey::new("b"));
    let key = |n: &str| ObjectKey::cluster("Tenant", n);
    queue.add(&key("a1"), &a, Priority::Event);
    queue.add(&key("a1"), &a, Priority::Event); // deduped: not an add
    queue.add(&key("a2"), &a, Priority::Event);
    queue.add(&key("b1"), &b, Priority::Event);

    let text = scrape(&registry);
    assert_eq!(value(&text, r#"workqueue_adds_total{name="tenant"}"#), 3.0);
    assert_eq!(value(&text, r#"workqueue_depth{name="tenant"}"#), 3.0);
    assert_eq!(
        value(
            &text,
            r#"idem_tenant_queue_depth{name="tenant",tenant="a"}"#
        ),
        2.0
    );

    // Hold the last lease: a tenant's series live while some key refers to it.
    let mut served = Vec::new();
    let mut last = None;
    while let Some(lease) = queue.try_get() {
        served.push(lease.tenant().clone());
        if let Some(previous) = last.replace(lease) {
            drop(previous);
        }
    }
    assert_eq!(served.len(), 3);
    let held_tenant = last.as_ref().unwrap().tenant().clone();
    // The work duration of the held lease is observed at done; finish it with the other
    // tenant's series still to be checked below.
    let text = scrape(&registry);
    assert_eq!(value(&text, r#"workqueue_depth{name="tenant"}"#), 0.0);
    let dispatches =
        |t: &str| format!(r#"idem_tenant_dispatches_total{{name="tenant",tenant="{t}"}}"#);
    let expected = |t: &TenantKey| if t == &a { 2.0 } else { 1.0 };
    // Only the tenant of the held lease is still known; the other was forgotten with its
    // series when its last key was done.
    assert_eq!(
        value(&text, &dispatches(held_tenant.as_str())),
        expected(&held_tenant)
    );
    let other = if held_tenant == a { "b" } else { "a" };
    assert!(!text.contains(&format!(r#"tenant="{other}""#)), "{text}");
    drop(last);
    let text = scrape(&registry);
    assert!(
        !text.contains("idem_tenant_"),
        "every tenant forgotten:\n{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"workqueue_queue_duration_seconds_count{name="tenant"}"#
        ),
        3.0
    );
    assert_eq!(
        value(
            &text,
            r#"workqueue_work_duration_seconds_count{name="tenant"}"#
        ),
        3.0
    );
}
