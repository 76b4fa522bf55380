//! Rules 1, 3, 8 and 9: priorities kept through delays, counts that include due delays,
//! backoff waits that events cannot bypass, freed keys and forgotten tenants.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

use super::{key, queue, serve, tenant};
use crate::metrics::Metrics;
use crate::queue::{AddOutcome, Priority, QueueConfig, WorkQueue};

const EV: Priority = Priority::Event;
const RS: Priority = Priority::Resync;

/// Queue five resync keys of other tenants, so a key served at resync priority comes last.
fn resync_backlog(q: &WorkQueue) {
    for i in 0..5 {
        q.add(&key(&format!("r{i}")), &tenant(&format!("o{i}")), RS);
    }
}

#[tokio::test(start_paused = true)]
async fn rule3_event_delay_raises_a_pending_resync_delay() {
    let q = queue(1);
    let t = tenant("a");
    q.add_after(&key("x"), &t, Duration::from_secs(1), RS);
    // A requeue at event priority asked for later than the pending resync: one delay, the
    // earlier deadline, the higher priority.
    assert_eq!(
        q.add_after(&key("x"), &t, Duration::from_secs(2), EV),
        AddOutcome::Deduped
    );
    resync_backlog(&q);
    tokio::time::advance(Duration::from_secs(1)).await;
    let lease = q.try_get().expect("due");
    assert_eq!((lease.key(), lease.priority()), (&key("x"), EV));
}

#[tokio::test(start_paused = true)]
async fn rule3_event_delay_raises_a_key_queued_at_resync_when_due() {
    let q = queue(1);
    let t = tenant("a");
    q.add(&key("x"), &t, RS);
    q.add_after(&key("x"), &t, Duration::from_secs(2), EV);
    assert_eq!(q.tenant_len(&t, RS), 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(q.tenant_len(&t, EV), 1, "raised to event priority");
    assert_eq!(q.tenant_len(&t, RS), 0);
}

#[tokio::test(start_paused = true)]
async fn rule3_immediate_resync_add_keeps_a_pending_event_delay() {
    let q = queue(1);
    let t = tenant("a");
    q.add_after(&key("x"), &t, Duration::from_secs(2), EV);
    q.add(&key("x"), &t, RS);
    assert_eq!(q.tenant_len(&t, RS), 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(q.tenant_len(&t, EV), 1, "the event delay was not cancelled");
}

/// The worker's order on success: schedule the requeue and the next resync while the key is
/// in flight, then release it.
#[tokio::test(start_paused = true)]
async fn rule3_requeue_is_not_demoted_by_a_resync_that_fired_during_the_reconcile() {
    let q = queue(1);
    let t = tenant("a");
    q.add(&key("x"), &t, EV);
    let lease = q.try_get().unwrap();
    q.add_after(&key("x"), &t, Duration::from_secs(1), RS); // a resync timer runs out
    tokio::time::advance(Duration::from_millis(1500)).await;
    assert_eq!(q.len(), 0, "the resync fired and marked the key dirty");
    q.add_after(&key("x"), &t, Duration::from_secs(2), EV); // requeue_after(2 s)
    q.add_after(&key("x"), &t, Duration::from_secs(36_000), RS); // next resync
    lease.done();
    let redo = q.try_get().expect("the dirty resync is served");
    assert_eq!(redo.priority(), RS);
    redo.done();
    resync_backlog(&q);
    tokio::time::advance(Duration::from_secs(2)).await;
    let requeue = q.try_get().expect("requeue due");
    assert_eq!(
        (requeue.key(), requeue.priority()),
        (&key("x"), EV),
        "the requeue keeps event priority"
    );
}

#[tokio::test(start_paused = true)]
async fn rule9_len_and_depth_count_keys_whose_delay_passed() {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let q = WorkQueue::with_metrics(QueueConfig::default(), metrics.queue("q")).unwrap();
    q.add_after(&key("x"), &tenant("a"), Duration::from_secs(1), EV);
    assert!(q.is_empty());
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(q.len(), 1);
    assert!(!q.is_empty());
    assert_eq!(q.metrics().unwrap().depth.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn rule9_a_finished_key_is_dropped_from_its_slot() {
    let q = queue(2);
    let k = key("x");
    q.add(&k, &tenant("a"), EV);
    assert_eq!(serve(&q).as_deref(), Some("x"));
    assert_eq!(
        Arc::strong_count(&k.name),
        1,
        "a clone of the key stayed in the queue"
    );
}

#[tokio::test(start_paused = true)]
async fn rule9_idle_tenants_are_forgotten_with_their_metric_series() {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let q = WorkQueue::with_metrics(QueueConfig::default(), metrics.queue("q")).unwrap();
    for i in 0..50 {
        q.add(&key(&format!("k{i}")), &tenant(&format!("pr-{i}")), EV);
    }
    q.add_after(&key("late"), &tenant("delayed"), Duration::from_secs(5), EV);
    assert_eq!(q.tenants(), 51);
    let lease = q.try_get().unwrap();
    while serve(&q).is_some() {}
    assert_eq!(
        q.tenants(),
        2,
        "the one in flight and the delayed one remain"
    );
    lease.done();
    assert_eq!(q.tenants(), 1);
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    assert!(!text.contains("tenant=\"pr-"), "{text}");
    assert!(text.contains("tenant=\"delayed\""));
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(serve(&q).as_deref(), Some("late"));
    assert_eq!(q.tenants(), 0);
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    assert!(!text.contains("idem_tenant_dispatches_total{"), "{text}");
}

/// Issue 10, item 8: two failures 105 ms apart with a 213 ms delay. While the key backs off,
/// a child event (a plain add) is folded into the retry.
#[tokio::test(start_paused = true)]
async fn rule8_events_do_not_bypass_a_backoff_wait() {
    let q = queue(4);
    let t = tenant("a");
    q.add(&key("x"), &t, EV);
    q.try_get().unwrap().retry_after(Duration::from_millis(213));
    tokio::time::advance(Duration::from_millis(105)).await;
    assert_eq!(q.add(&key("x"), &t, EV), AddOutcome::Deduped);
    assert_eq!(q.add(&key("x"), &t, RS), AddOutcome::Deduped);
    q.add_after(&key("x"), &t, Duration::from_millis(10), EV);
    assert!(q.try_get().is_none(), "an event bypassed the backoff");
    tokio::time::advance(Duration::from_millis(107)).await;
    assert!(q.try_get().is_none());
    tokio::time::advance(Duration::from_millis(1)).await;
    let retry = q.try_get().expect("retried when the backoff ends");
    assert_eq!(retry.priority(), EV);
    // Once retried the key is no longer backing off: an event is served at once.
    retry.done();
    q.add(&key("x"), &t, EV);
    assert_eq!(serve(&q).as_deref(), Some("x"));
}

#[tokio::test(start_paused = true)]
async fn rule8_an_event_during_a_failing_reconcile_waits_for_the_backoff() {
    let q = queue(4);
    let t = tenant("a");
    q.add(&key("x"), &t, EV);
    let lease = q.try_get().unwrap();
    assert_eq!(q.add(&key("x"), &t, EV), AddOutcome::Dirty);
    lease.retry_after(Duration::from_millis(213));
    assert!(q.try_get().is_none(), "the dirty mark bypassed the backoff");
    let got = tokio::time::timeout(Duration::from_secs(1), q.get())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.key(), &key("x"));
}

#[tokio::test(start_paused = true)]
async fn rule8_a_spec_change_ends_the_backoff_wait() {
    let q = queue(4);
    let t = tenant("a");
    q.add(&key("x"), &t, EV);
    q.try_get().unwrap().retry_after(Duration::from_secs(60));
    tokio::time::advance(Duration::from_millis(105)).await;
    assert_eq!(
        q.add_bypassing_backoff(&key("x"), &t, EV),
        AddOutcome::Queued
    );
    let lease = q.try_get().expect("a spec change is served at once");
    // Also while in flight: a spec change during a failing reconcile retries at once.
    q.add_bypassing_backoff(&key("x"), &t, EV);
    lease.retry_after(Duration::from_secs(60));
    assert_eq!(serve(&q).as_deref(), Some("x"));
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(serve(&q), None, "the superseded retry does not fire again");
}

/// A deleted child ends a backoff wait, at most once per 10 s (a failing reconcile deleting its
/// own children retries no more often); the early attempt, failing with a longer backoff,
/// waits no longer than the retry it replaced.
#[tokio::test(start_paused = true)]
async fn rule8_a_deleted_child_ends_a_backoff_wait_at_most_every_ten_seconds() {
    let q = queue(4);
    let t = tenant("a");
    q.add(&key("x"), &t, EV);
    q.try_get().unwrap().retry_after(Duration::from_secs(60));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(q.add_repairing(&key("x"), &t, EV), AddOutcome::Queued);
    let early = q.try_get().expect("the repair is served at once");
    early.retry_after(Duration::from_secs(120));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(q.add_repairing(&key("x"), &t, EV), AddOutcome::Deduped);
    assert!(q.try_get().is_none(), "a second early attempt within 10 s");
    tokio::time::advance(Duration::from_secs(57)).await;
    assert!(q.try_get().is_none());
    tokio::time::advance(Duration::from_secs(1)).await;
    let retry = q
        .try_get()
        .expect("retried when the replaced retry was due, not 120 s later");
    retry.retry_after(Duration::from_secs(60));
    tokio::time::advance(Duration::from_secs(1)).await;
    q.add_repairing(&key("x"), &t, EV);
    assert_eq!(
        serve(&q).as_deref(),
        Some("x"),
        "10 s after the last early attempt a deleted child ends the wait again"
    );
}

/// A child deleted during a reconcile that then fails: the retry is at once, not after the
/// backoff; another during that retry, within 10 s, waits for the backoff it replaced.
#[tokio::test(start_paused = true)]
async fn rule8_a_child_deleted_during_a_failing_reconcile_retries_at_once() {
    let q = queue(4);
    let t = tenant("a");
    q.add(&key("x"), &t, EV);
    let lease = q.try_get().unwrap();
    assert_eq!(q.add_repairing(&key("x"), &t, EV), AddOutcome::Dirty);
    lease.retry_after(Duration::from_secs(60));
    let again = q.try_get().expect("the deletion is repaired at once");
    q.add_repairing(&key("x"), &t, EV);
    again.retry_after(Duration::from_secs(120));
    assert!(q.try_get().is_none(), "a second early attempt within 10 s");
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(serve(&q).as_deref(), Some("x"));
}

/// Issue 11, item 4: a restart replays every object at resync priority; a user's change made
/// meanwhile (an event add of a key already queued for the replay) is served next.
#[tokio::test(start_paused = true)]
async fn rule5_a_change_during_a_replay_is_served_before_the_replay_ends() {
    let q = queue(4);
    for i in 0..1_000 {
        q.add(
            &key(&format!("k{i}")),
            &tenant(&format!("t{}", i % 100)),
            RS,
        );
    }
    for _ in 0..10 {
        serve(&q).unwrap();
    }
    q.add(&key("k999"), &tenant("t99"), EV);
    assert_eq!(serve(&q).as_deref(), Some("k999"));
}

/// A deleted object's pending resync no longer keeps its key and tenant for hours.
#[tokio::test(start_paused = true)]
async fn rule9_removing_a_deleted_key_forgets_it_and_its_tenant() {
    let q = queue(2);
    let (a, b) = (tenant("pr-1"), tenant("pr-2"));
    q.add_after(&key("x"), &a, Duration::from_secs(36_000), RS);
    q.add(&key("y"), &b, RS);
    q.add(&key("z"), &b, EV);
    let lease = q.try_get().unwrap();
    assert_eq!(lease.key(), &key("z"));
    q.add(&key("z"), &b, EV); // dirty
    assert_eq!(q.tenants(), 2);
    assert!(q.remove(&key("x")));
    assert_eq!(q.tenants(), 1, "tenant pr-1 forgotten");
    assert!(q.remove(&key("y")));
    assert!(q.remove(&key("z")), "the dirty mark is dropped");
    assert_eq!(q.len(), 0);
    lease.done();
    assert_eq!(q.tenants(), 0);
    assert!(q.try_get().is_none());
    assert!(!q.remove(&key("x")));
}
