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

    let mut served = Vec::new();
    while let Some(lease) = queue.try_get() {
        served.push(lease.tenant().clone());
        lease.done();
    }
    assert_eq!(served.len(), 3);
    let text = scrape(&registry);
    assert_eq!(value(&text, r#"workqueue_depth{name="tenant"}"#), 0.0);
    assert_eq!(
        value(
            &text,
            r#"idem_tenant_dispatches_total{name="tenant",tenant="a"}"#
        ),
        2.0
    );
    assert_eq!(
        value(
            &text,
            r#"idem_tenant_dispatches_total{name="tenant",tenant="b"}"#
        ),
        1.0
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
