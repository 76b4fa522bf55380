//! Throughput of add + get + done on 10,000 keys over 100 tenants of weights 1–4: idem's fair
//! queue (Start-time Fair Queuing, its default idle reserve, no per-tenant cap) against a plain
//! VecDeque + HashSet FIFO (dedupe only, no fairness, no in-flight tracking), both measured
//! in the same run. Prints both figures in ops/s and their ratio.
//!
//! One iteration sets the tenants' weights, adds every key, then takes and finishes every key
//! with up to 16 keys in flight at a time (as 16 workers would): 30,000 ops. Tenants go idle at the
//! end of each iteration and are forgotten, so the figure includes that churn. For the
//! baseline, "done" is dropping the key: it tracks nothing in flight.

use std::collections::{HashSet, VecDeque};
use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idem_runtime::metrics::Metrics;
use idem_runtime::queue::{Priority, QueueConfig, WorkQueue};
use idem_runtime::{ObjectKey, TenantKey};
use prometheus_client::registry::Registry;

const KEYS: usize = 10_000;
const TENANTS: usize = 100;
const OPS_PER_ITER: u64 = 3 * KEYS as u64;
/// Keys in flight at once (the workers).
const WORKERS: usize = 16;

fn config() -> QueueConfig {
    QueueConfig {
        max_in_flight: WORKERS,
        ..QueueConfig::default()
    }
}

fn workload() -> Vec<(ObjectKey, TenantKey)> {
    (0..KEYS)
        .map(|i| {
            let t = i % TENANTS;
            (
                ObjectKey::namespaced("TenantApp", &format!("tenant-{t}"), &format!("app-{i}")),
                TenantKey::new(format!("tenant-{t}")),
            )
        })
        .collect()
}

/// The baseline: a deduplicating FIFO as plain as it gets.
#[derive(Default)]
struct Fifo {
    queue: VecDeque<ObjectKey>,
    waiting: HashSet<ObjectKey>,
}

impl Fifo {
    fn add(&mut self, key: &ObjectKey) {
        if self.waiting.insert(key.clone()) {
            self.queue.push_back(key.clone());
        }
    }
    fn get(&mut self) -> Option<ObjectKey> {
        let key = self.queue.pop_front()?;
        self.waiting.remove(&key);
        Some(key)
    }
}

fn fair_round(q: &WorkQueue, work: &[(ObjectKey, TenantKey)]) {
    for (i, (_, t)) in work.iter().enumerate().take(TENANTS) {
        q.set_weight(t, 1 + (i % 4) as u32).expect("weight ≥ 1");
    }
    for (k, t) in work {
        q.add(k, t, Priority::Event);
    }
    let mut held = VecDeque::with_capacity(WORKERS);
    loop {
        while held.len() < WORKERS {
            match q.try_get() {
                Some(lease) => held.push_back(lease),
                None => break,
            }
        }
        let Some(lease) = held.pop_front() else {
            break;
        };
        black_box(lease.key());
        lease.done();
    }
}

fn fifo_round(q: &mut Fifo, work: &[(ObjectKey, TenantKey)]) {
    for (k, _) in work {
        q.add(k);
    }
    while let Some(key) = q.get() {
        drop(black_box(key)); // "done"
    }
}

/// Median of `samples` (sorted in place).
fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Ops/s of one round of `round`.
fn rate(mut round: impl FnMut()) -> f64 {
    let start = Instant::now();
    round();
    OPS_PER_ITER as f64 / start.elapsed().as_secs_f64()
}

/// Baseline and fair queue measured alternately, round by round, so both see the same machine
/// load (this machine is shared); returns the medians of baseline, fair, fair+metrics and of
/// the per-pair ratio.
fn interleaved(work: &[(ObjectKey, TenantKey)], pairs: usize) -> [f64; 4] {
    let mut fifo = Fifo::default();
    let fair = WorkQueue::new(config()).expect("valid config");
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry).queue("bench");
    let fair_m = WorkQueue::with_metrics(config(), metrics).expect("valid config");
    let (mut base, mut ours, mut ours_m, mut ratio) = (vec![], vec![], vec![], vec![]);
    for _ in 0..pairs {
        let b = rate(|| fifo_round(&mut fifo, work));
        let o = rate(|| fair_round(&fair, work));
        let m = rate(|| fair_round(&fair_m, work));
        base.push(b);
        ours.push(o);
        ours_m.push(m);
        ratio.push(o / b);
    }
    [
        median(&mut base),
        median(&mut ours),
        median(&mut ours_m),
        median(&mut ratio),
    ]
}

fn bench(c: &mut Criterion) {
    let work = workload();
    let mut group = c.benchmark_group("queue_add_get_done_10k_keys_100_tenants_16_in_flight");
    group.throughput(Throughput::Elements(OPS_PER_ITER));
    group.bench_function("fifo_baseline", |b| {
        let mut q = Fifo::default();
        b.iter(|| fifo_round(&mut q, &work));
    });
    group.bench_function("fair_queue", |b| {
        let q = WorkQueue::new(config()).expect("valid config");
        b.iter(|| fair_round(&q, &work));
    });
    group.bench_function("fair_queue_with_metrics", |b| {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry).queue("bench");
        let q = WorkQueue::with_metrics(config(), metrics).expect("valid config");
        b.iter(|| fair_round(&q, &work));
    });
    group.finish();

    let [base, ours, ours_m, ratio] = interleaved(&work, 200);
    println!("interleaved, median of 200 rounds of 30,000 ops each:");
    println!("  fifo baseline (VecDeque+HashSet): {base:>12.0} ops/s");
    println!("  fair queue:                       {ours:>12.0} ops/s");
    println!("  fair queue with metrics:          {ours_m:>12.0} ops/s");
    println!("  fair / baseline:                  {ratio:>12.2}x");
}

criterion_group!(benches, bench);
criterion_main!(benches);
