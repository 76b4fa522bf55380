//! Throughput of add + get + done on 10,000 keys over 100 tenants: idem's fair queue against
//! a plain VecDeque + HashSet FIFO (dedupe only, no fairness, no in-flight tracking), both
//! measured in the same run. Prints both figures in ops/s and their ratio.
//!
//! One iteration adds every key, then takes and finishes every key one by one: 30,000 ops
//! (for the baseline, "done" is dropping the key: it tracks nothing in flight).

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::hint::black_box;
use std::rc::Rc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idem_runtime::metrics::Metrics;
use idem_runtime::queue::{Priority, QueueConfig, WorkQueue};
use idem_runtime::{ObjectKey, TenantKey};
use prometheus_client::registry::Registry;

const KEYS: usize = 10_000;
const TENANTS: usize = 100;
const OPS_PER_ITER: u64 = 3 * KEYS as u64;

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
    for (k, t) in work {
        q.add(k, t, Priority::Event);
    }
    while let Some(lease) = q.try_get() {
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

type Tally = Rc<RefCell<(u64, Duration)>>;

fn measured(tally: &Tally, iters: u64, mut round: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        round();
    }
    let elapsed = start.elapsed();
    let mut t = tally.borrow_mut();
    t.0 += iters;
    t.1 += elapsed;
    elapsed
}

fn ops_per_sec(tally: &Tally) -> f64 {
    let (iters, time) = *tally.borrow();
    (iters * OPS_PER_ITER) as f64 / time.as_secs_f64()
}

fn bench(c: &mut Criterion) {
    let work = workload();
    let (fair, fair_metrics, fifo): (Tally, Tally, Tally) = Default::default();
    let mut group = c.benchmark_group("queue_add_get_done_10k_keys_100_tenants");
    group.throughput(Throughput::Elements(OPS_PER_ITER));

    group.bench_function("fifo_baseline", |b| {
        let mut q = Fifo::default();
        b.iter_custom(|iters| measured(&fifo, iters, || fifo_round(&mut q, &work)));
    });
    group.bench_function("fair_queue", |b| {
        let q = WorkQueue::new(QueueConfig::default()).expect("valid config");
        b.iter_custom(|iters| measured(&fair, iters, || fair_round(&q, &work)));
    });
    group.bench_function("fair_queue_with_metrics", |b| {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry).queue("bench");
        let q = WorkQueue::with_metrics(QueueConfig::default(), metrics).expect("valid config");
        b.iter_custom(|iters| measured(&fair_metrics, iters, || fair_round(&q, &work)));
    });
    group.finish();

    let (base, ours, ours_m) = (ops_per_sec(&fifo), ops_per_sec(&fair), ops_per_sec(&fair_metrics));
    println!("fifo baseline:           {:>12.0} ops/s", base);
    println!(
        "fair queue:              {:>12.0} ops/s  ratio {:.2}x of baseline",
        ours,
        ours / base
    );
    println!(
        "fair queue with metrics: {:>12.0} ops/s  ratio {:.2}x of baseline",
        ours_m,
        ours_m / base
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
