//! One test (or more) per numbered queue rule, on tokio's paused clock.

use std::time::Duration;

use tokio::time::Instant;

use super::{capped, key, queue, serve, tenant};
use crate::queue::{AddOutcome, Priority, QueueConfig, QueueError, WorkQueue};

const EV: Priority = Priority::Event;
const RS: Priority = Priority::Resync;

#[tokio::test(start_paused = true)]
async fn rule1_dedupe_waiting_key_is_queued_once() {
    let q = queue(10);
    let t = tenant("a");
    assert_eq!(q.add(&key("x"), &t, EV), AddOutcome::Queued);
    assert_eq!(q.add(&key("x"), &t, EV), AddOutcome::Deduped);
    assert_eq!(q.add(&key("x"), &t, RS), AddOutcome::Deduped);
    assert_eq!(q.len(), 1);
    assert_eq!(serve(&q).as_deref(), Some("x"));
    assert_eq!(serve(&q), None);
}

#[tokio::test(start_paused = true)]
async fn rule1_dedupe_raises_resync_to_event_priority() {
    let q = queue(10);
    let t = tenant("a");
    q.add(&key("r"), &t, RS);
    q.add(&key("e"), &t, EV);
    q.add(&key("r"), &t, EV); // raise: now an event, behind "e"
    assert_eq!(q.len(), 2);
    assert_eq!(q.tenant_len(&t, RS), 0);
    let first = q.try_get().unwrap();
    assert_eq!(first.key(), &key("e"));
    let second = q.try_get().unwrap();
    assert_eq!((second.key(), second.priority()), (&key("r"), EV));
    assert!(q.try_get().is_none());
}

#[tokio::test(start_paused = true)]
async fn rule2_in_flight_key_is_not_handed_out_again_until_done() {
    let q = queue(10);
    let t = tenant("a");
    q.add(&key("x"), &t, EV);
    let lease = q.try_get().unwrap();
    assert_eq!(q.add(&key("x"), &t, EV), AddOutcome::Dirty);
    assert_eq!(q.add(&key("x"), &t, EV), AddOutcome::Deduped);
    assert!(q.try_get().is_none(), "must not hand out an in-flight key");
    assert_eq!(q.in_flight(), 1);
    lease.done();
    let again = q.try_get().expect("dirty key comes back after done");
    assert_eq!(again.key(), &key("x"));
    again.done();
    assert!(q.try_get().is_none(), "and only once");
}

#[tokio::test(start_paused = true)]
async fn rule2_dropping_a_lease_releases_the_key() {
    let q = queue(10);
    let t = tenant("a");
    q.add(&key("x"), &t, EV);
    let worker = {
        let lease = q.try_get().unwrap();
        tokio::spawn(async move {
            let _lease = lease;
            panic!("worker dies holding the lease");
        })
    };
    assert!(worker.await.is_err());
    assert_eq!(q.in_flight(), 0);
    q.add(&key("x"), &t, EV);
    assert_eq!(serve(&q).as_deref(), Some("x"));
}

#[tokio::test(start_paused = true)]
async fn rule3_earliest_of_several_delays_wins() {
    let q = queue(10);
    let t = tenant("a");
    let start = Instant::now();
    q.add_after(&key("x"), &t, Duration::from_secs(5), EV);
    q.add_after(&key("x"), &t, Duration::from_secs(1), EV);
    q.add_after(&key("x"), &t, Duration::from_secs(3), EV);
    assert!(q.try_get().is_none());
    let lease = q.get().await.unwrap();
    assert_eq!(lease.key(), &key("x"));
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    lease.done();
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(q.try_get().is_none(), "later delays were superseded");
}

#[tokio::test(start_paused = true)]
async fn rule3_immediate_add_supersedes_delay_and_delay_of_queued_key_is_ignored() {
    let q = queue(10);
    let t = tenant("a");
    q.add_after(&key("x"), &t, Duration::from_secs(2), EV);
    q.add(&key("x"), &t, EV);
    assert_eq!(serve(&q).as_deref(), Some("x"));
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(
        serve(&q),
        None,
        "the delay was superseded by the earlier add"
    );
    q.add(&key("y"), &t, EV);
    assert_eq!(
        q.add_after(&key("y"), &t, Duration::from_secs(1), EV),
        AddOutcome::Deduped
    );
    assert_eq!(serve(&q).as_deref(), Some("y"));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(serve(&q), None);
}

#[tokio::test(start_paused = true)]
async fn rule3_delay_requested_while_in_flight_fires_after_done() {
    let q = queue(10);
    let t = tenant("a");
    q.add(&key("x"), &t, EV);
    let lease = q.try_get().unwrap();
    q.add_after(&key("x"), &t, Duration::from_secs(1), EV);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(q.try_get().is_none(), "still in flight");
    lease.done();
    assert_eq!(serve(&q).as_deref(), Some("x"));
}

/// Fill two tenants with `n` keys each and record who is served, `total` times.
fn dispatch_pattern(q: &WorkQueue, n: usize, total: usize) -> Vec<bool> {
    let (a, b) = (tenant("a"), tenant("b"));
    for i in 0..n {
        q.add(&key(&format!("a{i}")), &a, EV);
        q.add(&key(&format!("b{i}")), &b, EV);
    }
    (0..total)
        .map(|_| serve(q).expect("backlogged").starts_with('a'))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn rule4_weighted_share_within_ten_percent_over_every_window() {
    for (wa, wb) in [(1u32, 1u32), (3, 1), (1, 4), (7, 3)] {
        let q = queue(10);
        q.set_weight(&tenant("a"), wa).unwrap();
        q.set_weight(&tenant("b"), wb).unwrap();
        let served_a = dispatch_pattern(&q, 6000, 5000);
        let expected = f64::from(wa) / f64::from(wa + wb);
        for start in 0..=served_a.len() - 1000 {
            let share =
                served_a[start..start + 1000].iter().filter(|a| **a).count() as f64 / 1000.0;
            assert!(
                (share - expected).abs() <= 0.1 * expected,
                "weights {wa}:{wb}, window at {start}: share {share} vs {expected}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn rule4_quiet_tenant_waits_at_most_backlogged_tenants_dispatches() {
    let q = queue(10);
    let flooders = [tenant("a"), tenant("c"), tenant("d")];
    for (n, t) in flooders.iter().enumerate() {
        for i in 0..10_000 {
            q.add(&key(&format!("{n}-{i}")), t, EV);
        }
    }
    for round in 0..50 {
        // Serve an arbitrary number of flood keys, then wake the quiet tenant.
        for _ in 0..(round * 7 % 13) {
            serve(&q).unwrap();
        }
        q.add(&key(&format!("quiet{round}")), &tenant("b"), EV);
        let mut others = 0;
        loop {
            let name = serve(&q).unwrap();
            if name.starts_with("quiet") {
                break;
            }
            others += 1;
        }
        assert!(
            others <= flooders.len(),
            "round {round}: quiet key waited for {others} dispatches"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn rule5_events_before_resync() {
    let q = queue(10);
    let t = tenant("a");
    for i in 0..5 {
        q.add(&key(&format!("r{i}")), &t, RS);
    }
    q.add(&key("e0"), &tenant("z"), EV);
    q.add(&key("e1"), &t, EV);
    let order: Vec<String> = std::iter::from_fn(|| serve(&q)).collect();
    assert_eq!(order, ["e0", "e1", "r0", "r1", "r2", "r3", "r4"]);
}

#[tokio::test(start_paused = true)]
async fn rule5_aged_resync_is_served_under_a_steady_event_stream() {
    let max_wait = Duration::from_secs(30);
    let q = WorkQueue::new(QueueConfig {
        resync_max_wait: max_wait,
        ..QueueConfig::default()
    })
    .unwrap();
    let t = tenant("a");
    let start = Instant::now();
    q.add(&key("resync"), &t, RS);
    let mut served_at = None;
    for i in 0..1000 {
        // A new event every 100 ms; always one ready when the worker asks.
        q.add(&key(&format!("e{i}")), &t, EV);
        q.add(&key(&format!("f{i}")), &tenant("b"), EV);
        let name = serve(&q).unwrap();
        if name == "resync" {
            served_at = Some(start.elapsed());
            break;
        }
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    let served_at = served_at.expect("resync work starved");
    assert!(served_at >= max_wait, "served before aging: {served_at:?}");
    assert!(
        served_at <= max_wait + Duration::from_millis(200),
        "{served_at:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn rule6_global_cap_limits_keys_in_flight() {
    let q = queue(3);
    for i in 0..5 {
        q.add(&key(&format!("k{i}")), &tenant(&format!("t{i}")), EV);
    }
    let leases: Vec<_> = (0..3).map(|_| q.try_get().unwrap()).collect();
    assert!(q.try_get().is_none());
    assert_eq!(q.in_flight(), 3);
    let waiter = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await.map(|l| l.key().clone()) })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!waiter.is_finished(), "must wait while the cap is reached");
    drop(leases);
    let got = tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("woken when a slot frees")
        .unwrap();
    assert!(got.is_some());
}

#[tokio::test(start_paused = true)]
async fn rule6_tenant_cap_leaves_workers_for_other_tenants() {
    let q = capped(10, 2);
    let (a, b) = (tenant("a"), tenant("b"));
    for i in 0..10 {
        q.add(&key(&format!("a{i}")), &a, EV);
    }
    q.add(&key("b0"), &b, EV);
    let l1 = q.try_get().unwrap();
    let l2 = q.try_get().unwrap();
    let l3 = q.try_get().unwrap();
    let mut got: Vec<String> = [&l1, &l2, &l3]
        .iter()
        .map(|l| l.key().name.to_string())
        .collect();
    got.sort();
    assert_eq!(got, ["a0", "a1", "b0"]);
    assert!(q.try_get().is_none(), "a is at its cap of 2");
    assert_eq!(q.tenant_in_flight(&a), 2);
    l1.done();
    let next = q.try_get().expect("a below its cap again");
    assert!(next.key().name.starts_with('a'));
}

#[tokio::test(start_paused = true)]
async fn rule7_shutdown_stops_waits_and_reports() {
    let q = queue(10);
    let t = tenant("a");
    for name in ["fast", "slow", "queued", "dirty"] {
        q.add(&key(name), &t, EV);
    }
    q.add_after(&key("delayed"), &t, Duration::from_secs(60), EV);
    // An idle key waiting only for its periodic resync: not dropped work.
    q.add_after(&key("resync"), &t, Duration::from_secs(60), RS);
    let mut leases: Vec<_> = (0..3).map(|_| q.try_get().unwrap()).collect();
    // In order: fast, slow, queued; "dirty" stays queued; make "queued" dirty while in flight.
    let queued_lease = leases.pop().unwrap();
    q.add(&key("queued"), &t, EV);
    queued_lease.done(); // back in the queue
    q.add(&key("slow"), &t, EV); // slow is now dirty
    let waiter = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await.is_none() })
    };
    let fast = leases.remove(0);
    let slow = leases.remove(0);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        fast.done();
    });
    let start = Instant::now();
    let report = q.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(5),
        "waited the full grace"
    );
    assert!(
        waiter.await.unwrap(),
        "waiting get returns None after shutdown"
    );
    assert_eq!(
        report.dropped,
        [key("delayed"), key("dirty"), key("queued"), key("slow")]
    );
    assert_eq!(report.in_flight_at_start, [key("fast"), key("slow")]);
    assert_eq!(report.abandoned, [key("slow")]);
    assert!(!report.drained());
    assert_eq!(q.add(&key("new"), &t, EV), AddOutcome::Closed);
    slow.done();
    assert!(q.try_get().is_none());
    assert_eq!(q.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn rule7_shutdown_returns_early_when_drained() {
    let q = queue(10);
    q.add(&key("x"), &tenant("a"), EV);
    let lease = q.try_get().unwrap();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        lease.done();
    });
    let start = Instant::now();
    let report = q.shutdown(Duration::from_secs(30)).await;
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert!(report.drained());
    assert!(report.dropped.is_empty());
}

#[test]
fn bad_config_and_weight_are_typed_errors() {
    let zero = |max_in_flight, per_tenant_cap: usize| {
        WorkQueue::new(QueueConfig {
            max_in_flight,
            per_tenant_cap: Some(per_tenant_cap),
            ..QueueConfig::default()
        })
        .err()
    };
    assert_eq!(zero(0, 1), Some(QueueError::ZeroMaxInFlight));
    assert_eq!(zero(1, 0), Some(QueueError::ZeroTenantCap));
    let q = queue(1);
    assert_eq!(
        q.set_weight(&tenant("a"), 0),
        Err(QueueError::ZeroWeight(tenant("a")))
    );
}
