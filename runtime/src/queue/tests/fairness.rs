//! Rule 4 and 6: weighted shares under contention with several keys of each tenant in flight,
//! the bound for a newly active tenant, work conservation, the idle reserve and the optional
//! cap.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;

use super::{capped, key, queue, reserved, serve, tenant};
use crate::queue::{AddOutcome, Lease, Priority, WorkQueue};

const EV: Priority = Priority::Event;

/// A deterministic pseudo-random sequence (a 64-bit LCG), to pick which lease finishes next.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
}

/// Tenants `t0…` with `weights`, each with `keys` keys re-added as soon as they finish, so
/// every tenant stays backlogged; the queue's workers are all busy (`in_flight`, if given,
/// holds the keys in flight at each dispatch) and a pseudo-random lease finishes before each
/// dispatch.
/// Returns the tenant index of each of `total` dispatches.
fn contended(
    q: &WorkQueue,
    weights: &[u32],
    keys: usize,
    total: usize,
    seed: u64,
    in_flight: Option<RangeInclusive<usize>>,
) -> Vec<usize> {
    for (i, w) in weights.iter().enumerate() {
        q.set_weight(&tenant(&format!("t{i}")), *w).unwrap();
        for k in 0..keys {
            q.add(&key(&format!("t{i}-{k}")), &tenant(&format!("t{i}")), EV);
        }
    }
    let index = |l: &Lease| l.tenant().as_str()[1..].parse::<usize>().unwrap();
    let mut rng = Lcg(seed);
    let mut held: Vec<Lease> = Vec::new();
    let mut order = Vec::with_capacity(total);
    while order.len() < total {
        while let Some(lease) = q.try_get() {
            order.push(index(&lease));
            held.push(lease);
        }
        assert!(!held.is_empty(), "nothing in flight and nothing ready");
        assert_eq!(held.len(), q.in_flight());
        if let Some(expected) = &in_flight {
            assert!(
                expected.contains(&held.len()),
                "{} keys in flight at a dispatch, expected {expected:?}",
                held.len()
            );
        }
        let lease = held.swap_remove(rng.next(held.len()));
        let (k, t) = (lease.key().clone(), lease.tenant().clone());
        lease.done();
        q.add(&k, &t, EV);
    }
    order.truncate(total);
    order
}

/// Assert that in every window of `window` dispatches each tenant's count is within 10 % of
/// its weighted share.
fn assert_shares(order: &[usize], weights: &[u32], window: usize) {
    let sum: u32 = weights.iter().sum();
    let mut counts = vec![0usize; weights.len()];
    for &t in &order[..window] {
        counts[t] += 1;
    }
    for start in 0..=order.len() - window {
        if start > 0 {
            counts[order[start - 1]] -= 1;
            counts[order[start + window - 1]] += 1;
        }
        for (t, &w) in weights.iter().enumerate() {
            let expected = window as f64 * f64::from(w) / f64::from(sum);
            let got = counts[t] as f64;
            assert!(
                (got - expected).abs() <= 0.1 * expected,
                "weights {weights:?}, window at {start}: tenant {t} got {got}, expected {expected:.1}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn rule4_weighted_shares_within_ten_percent_with_many_keys_in_flight() {
    let sets: [&[u32]; 9] = [
        &[1, 1],
        &[1, 4],
        &[3, 7],
        &[1, 100],
        &[50, 100],
        &[1, 2, 3, 4],
        &[10, 20, 30, 40],
        &[5, 25, 70],
        &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
    ];
    for (i, weights) in sets.into_iter().enumerate() {
        let q = queue(8);
        // 8 keys in flight at every dispatch, several of each tenant.
        let order = contended(&q, weights, 40, 6_000, i as u64 + 1, Some(8..=8));
        assert_shares(&order, weights, 1_000);
    }
}

#[tokio::test(start_paused = true)]
async fn rule4_weight_above_the_cap_still_counts() {
    // With a cap of 4 and 4 workers, the old DRR ended a tenant's turn when it reached the
    // cap, so a weight of 8 acted like 4. SFQ has no turns: 8 : 1 holds.
    let q = capped(4, 4);
    let order = contended(&q, &[8, 1], 40, 4_500, 7, Some(4..=4));
    assert_shares(&order, &[8, 1], 1_000);
}

#[tokio::test(start_paused = true)]
async fn rule4_weight_lookup_applies_a_changed_weight_without_set_weight() {
    let q = queue(4);
    let weights = Arc::new(Mutex::new(HashMap::from([("t0".to_owned(), 1u32)])));
    let w = Arc::clone(&weights);
    q.set_weight_lookup(move |t| w.lock().unwrap().get(t.as_str()).copied());
    let before = contended(&q, &[1, 1], 20, 2_000, 3, Some(4..=4));
    assert_shares(&before, &[1, 1], 1_000);
    weights.lock().unwrap().insert("t0".to_owned(), 4);
    // Same queue and keys, so `contended` re-adds deduped keys and keeps going.
    let after = contended(&q, &[1, 1], 20, 3_000, 4, Some(4..=4));
    // The first few dispatches may still carry the old tags; judge the rest.
    assert_shares(&after[100..], &[4, 1], 1_000);
}

#[tokio::test(start_paused = true)]
async fn rule4_new_tenant_is_served_after_at_most_one_dispatch_per_active_tenant() {
    let q = queue(10);
    let flooders = [(tenant("a"), 100u32), (tenant("c"), 50), (tenant("d"), 1)];
    for (n, (t, w)) in flooders.iter().enumerate() {
        q.set_weight(t, *w).unwrap();
        for i in 0..10_000 {
            q.add(&key(&format!("{n}-{i}")), t, EV);
        }
    }
    for round in 0..100 {
        for _ in 0..(round * 37 % 251) {
            serve(&q).unwrap();
        }
        q.add(&key(&format!("quiet{round}")), &tenant("b"), EV);
        let mut others = 0;
        while !serve(&q).unwrap().starts_with("quiet") {
            others += 1;
        }
        assert!(
            others <= flooders.len(),
            "round {round}: the new tenant waited for {others} dispatches"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn rule6_work_conserving_a_lone_tenant_uses_every_worker() {
    let q = queue(10);
    for i in 0..20 {
        q.add(&key(&format!("a{i}")), &tenant("a"), EV);
    }
    q.add(&key("b0"), &tenant("b"), EV);
    let held: Vec<Lease> = std::iter::from_fn(|| q.try_get()).collect();
    assert_eq!(held.len(), 10, "every worker busy");
    assert_eq!(q.tenant_in_flight(&tenant("a")), 9);
    assert_eq!(q.tenant_in_flight(&tenant("b")), 1);
    drop(held);
    // With an explicit cap the same load leaves workers idle.
    let q = capped(10, 2);
    let held = backlog(&q, "a", 20);
    assert_eq!(held.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn rule6_the_last_worker_waits_for_a_tenant_with_nothing_in_flight() {
    // The default reserve: one of 10 workers. A lone tenant's backlog takes 9.
    let q = reserved(10, 1);
    let mut held = backlog(&q, "a", 20);
    assert_eq!(held.len(), 9, "the last worker is kept");
    assert!(q.try_get().is_none());
    // Another tenant's change starts at once, without waiting for `a` to finish anything.
    q.add(&key("b0"), &tenant("b"), EV);
    let b = q
        .try_get()
        .expect("the reserved worker goes to the tenant with none running");
    assert_eq!(b.key().name.as_ref(), "b0");
    // Every worker is busy now. When one of `a`'s finishes, the free worker is the last one
    // again: kept (a third tenant's change would start at once), not `a`'s.
    assert!(q.try_get().is_none());
    held.pop().unwrap().done();
    assert!(q.try_get().is_none(), "the one free worker is kept");
    q.add(&key("c0"), &tenant("c"), EV);
    let c = q
        .try_get()
        .expect("a third tenant's change starts at once too");
    assert_eq!(c.key().name.as_ref(), "c0");
    // Once `b` and `c` are done, `a` takes every worker but the last again.
    b.done();
    c.done();
    held.extend(std::iter::from_fn(|| q.try_get()));
    assert_eq!(held.len(), 9);
    assert_eq!(q.tenant_in_flight(&tenant("a")), 9);
    drop(held);

    // With no reserve the same backlog takes every worker, and `b` waits for one.
    let q = reserved(10, 0);
    let held = backlog(&q, "a", 20);
    assert_eq!(held.len(), 10);
    q.add(&key("b0"), &tenant("b"), EV);
    assert!(q.try_get().is_none(), "b waits for a worker");
    drop(held);

    // At most a quarter of the workers is kept: none with 3 workers, 2 of 8 when 5 are asked.
    for (workers, asked, taken) in [(3, 1, 3), (4, 1, 3), (8, 5, 6)] {
        let q = reserved(workers, asked);
        let held = backlog(&q, "a", 20);
        assert_eq!(held.len(), taken, "{workers} workers, reserve {asked}");
    }
}

#[tokio::test(start_paused = true)]
async fn rule6_the_reserved_worker_serves_lone_changes_past_busy_tenants_not_backlogs() {
    let q = reserved(10, 1);
    let held = backlog(&q, "a", 20);
    assert_eq!(held.len(), 9);
    // `b`'s change, then its next ones right after: served though `b` was just served (its
    // tag ties with or trails `a`'s), since the one key is all `b` has to do. Its key stays
    // known between changes (a resync is due later, as the controller schedules one), so
    // the queue remembers `b`'s tags.
    for _ in 0..3 {
        lone_change(&q, "b");
    }
    // A tenant with a backlog gets the reserved worker at its turn only: `c` becomes active
    // (its turn comes at once), then, served, waits behind `a` with the rest of its backlog.
    for i in 0..3 {
        q.add(&key(&format!("c{i}")), &tenant("c"), EV);
    }
    let c0 = q.try_get().expect("a newly active tenant's turn");
    assert_eq!(c0.key().name.as_ref(), "c0");
    c0.done();
    assert!(
        q.try_get().is_none(),
        "a backlog behind a busy tenant waits for its turn"
    );
    // Resync work never takes the reserved worker.
    q.add(&key("d0"), &tenant("d"), Priority::Resync);
    assert!(q.try_get().is_none(), "resync work is not a change");
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn rule4_lone_changes_served_out_of_turn_do_not_delay_a_newly_active_tenant() {
    // `a` (weight 100) keeps 3 of 4 workers busy; `b` makes lone changes, each served out of
    // turn by the reserved worker. Then `c` becomes active: it is still served after at most
    // one dispatch of `a` (charged, those changes pushed `c` behind `a`'s backlog).
    let q = reserved(4, 1);
    q.set_weight(&tenant("a"), 100).unwrap();
    let mut held = backlog(&q, "a", 1_000);
    assert_eq!(held.len(), 3);
    for _ in 0..5 {
        lone_change(&q, "b");
    }
    q.add(&key("c0"), &tenant("c"), EV);
    q.add(&key("c1"), &tenant("c"), EV);
    let mut before = 0;
    loop {
        match q.try_get() {
            Some(lease) if lease.tenant().as_str() == "c" => break,
            Some(lease) => {
                before += 1;
                held.push(lease);
            }
            None => held.remove(0).done(),
        }
        assert!(before <= 1, "`a` was served {before} times before `c`");
    }
}

#[tokio::test(start_paused = true)]
async fn rule6_a_key_raised_to_event_work_wakes_a_worker_for_the_reserve() {
    let q = Arc::new(reserved(4, 1));
    let held = backlog(&q, "a", 6);
    assert_eq!(held.len(), 3);
    q.add(&key("d0"), &tenant("d"), Priority::Resync);
    let worker = {
        let q = Arc::clone(&q);
        tokio::spawn(async move { q.get().await.map(|l| l.key().name.to_string()) })
    };
    tokio::task::yield_now().await;
    assert!(!worker.is_finished(), "a resync does not take the reserve");
    // The user changes `d0`: its waiting resync is raised to event work, a lone change.
    assert_eq!(q.add(&key("d0"), &tenant("d"), EV), AddOutcome::Deduped);
    let got = tokio::time::timeout(Duration::from_secs(60), worker)
        .await
        .expect("the waiting worker was woken")
        .unwrap();
    assert_eq!(got.as_deref(), Some("d0"));
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn rule6_the_idle_reserve_keeps_weighted_shares() {
    // Backlogged tenants keep their weighted shares with the reserve on: a light tenant
    // whose keys all finished takes the reserved worker only when SFQ gives it its turn.
    for (i, weights) in [&[1u32, 4][..], &[1, 100], &[1, 2, 3, 4]]
        .into_iter()
        .enumerate()
    {
        let q = reserved(8, 1);
        let order = contended(&q, weights, 40, 6_000, i as u64 + 11, Some(7..=8));
        assert_shares(&order, weights, 1_000);
    }
}

/// A change of tenant `name`'s one key `name`, which must get a worker at once; its key
/// stays known afterwards (a resync is due in an hour, as the controller schedules one), so
/// the queue keeps the tenant's tags.
fn lone_change(q: &WorkQueue, name: &str) {
    q.add(&key(name), &tenant(name), EV);
    let lease = q.try_get().expect("a lone change gets the reserved worker");
    assert_eq!(lease.key().name.as_ref(), name);
    q.add_after(
        &key(name),
        &tenant(name),
        Duration::from_secs(3600),
        Priority::Resync,
    );
    lease.done();
}

/// Queues `keys` keys of `name` (`{name}0`, `{name}1`, …) and takes every lease the queue
/// hands out now.
fn backlog(q: &WorkQueue, name: &str, keys: usize) -> Vec<Lease> {
    for i in 0..keys {
        q.add(&key(&format!("{name}{i}")), &tenant(name), EV);
    }
    std::iter::from_fn(|| q.try_get()).collect()
}

/// Dispatch counts of all-backlogged tenants, prefix by prefix.
/// With `reserve` idle workers kept (with every tenant backlogged, the reserve serves only a
/// tenant whose turn came, so the bound holds with it too).
fn sfq_bound_holds(
    weights: &[u32],
    workers: usize,
    reserve: usize,
    seed: u64,
) -> Result<(), String> {
    let q = reserved(workers, reserve);
    let kept = reserve.min(workers / 4);
    let order = contended(
        &q,
        weights,
        3 * workers,
        2_000,
        seed,
        Some(workers - kept..=workers),
    );
    let mut n = vec![0u32; weights.len()];
    for (i, &t) in order.iter().enumerate() {
        n[t] += 1;
        for a in 0..weights.len() {
            for b in a + 1..weights.len() {
                let (wa, wb) = (f64::from(weights[a]), f64::from(weights[b]));
                let gap = (f64::from(n[a]) / wa - f64::from(n[b]) / wb).abs();
                if gap > 1.0 / wa + 1.0 / wb + 1e-9 {
                    return Err(format!(
                        "after {i} dispatches: n = {n:?}, weights {weights:?}, gap {gap}"
                    ));
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// SFQ's fairness bound (Goyal et al. 1996, Theorem 1, unit cost): for backlogged
    /// tenants, |n_a/w_a − n_b/w_b| ≤ 1/w_a + 1/w_b at every point, whatever the weights,
    /// the number of workers and the order in which keys finish.
    #[test]
    fn sfq_fairness_bound(
        weights in proptest::collection::vec(1u32..=100, 2..6),
        workers in 1usize..12,
        reserve in 0usize..=2,
        seed in any::<u64>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let result = rt.block_on(async { sfq_bound_holds(&weights, workers, reserve, seed) });
        prop_assert!(result.is_ok(), "{}", result.unwrap_err());
    }
}
