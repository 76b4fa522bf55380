//! Property tests: random sequences of add / add_after / get / done / time passing never hand
//! out a key twice at once and never lose one.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::{key, tenant};
use crate::queue::core::{Bypass, Core, Now};
use crate::queue::{Priority, QueueConfig};

#[derive(Clone, Debug)]
enum Op {
    Add {
        k: u8,
        t: u8,
        resync: bool,
        /// 0: a plain add, 1: a repair add, 2: a spec change.
        bypass: u8,
    },
    AddAfter {
        k: u8,
        t: u8,
        ms: u16,
        resync: bool,
    },
    Get,
    Done(usize),
    Retry(usize, u16),
    Advance(u16),
    Remove(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..12, 0u8..4, any::<bool>(), 0u8..3)
            .prop_map(|(k, t, resync, bypass)| Op::Add { k, t, resync, bypass }),
        2 => (0u8..12, 0u8..4, 0u16..300, any::<bool>())
            .prop_map(|(k, t, ms, resync)| Op::AddAfter { k, t, ms, resync }),
        3 => Just(Op::Get),
        2 => (0usize..8).prop_map(Op::Done),
        1 => (0usize..8, 1u16..400).prop_map(|(i, ms)| Op::Retry(i, ms)),
        1 => (0u16..500).prop_map(Op::Advance),
        1 => (0u8..12).prop_map(Op::Remove),
    ]
}

fn prio(resync: bool) -> Priority {
    if resync {
        Priority::Resync
    } else {
        Priority::Event
    }
}

/// The model: which keys are in flight, and which are owed a dispatch (added since their last
/// dispatch began).
#[derive(Default)]
struct Model {
    in_flight: HashMap<String, u32>,
    owed: HashSet<String>,
    per_tenant: HashMap<String, usize>,
}

impl Model {
    fn dispatched(&mut self, name: &str, slot: u32, tenant: &str, cfg: &QueueConfig) {
        assert!(
            self.in_flight.insert(name.to_owned(), slot).is_none(),
            "key {name} handed out twice"
        );
        self.owed.remove(name);
        assert!(
            self.in_flight.len() <= cfg.max_in_flight,
            "global cap broken"
        );
        let n = self.per_tenant.entry(tenant.to_owned()).or_default();
        *n += 1;
        assert!(
            cfg.per_tenant_cap.is_none_or(|cap| *n <= cap),
            "tenant cap broken"
        );
    }
}

fn run(ops: Vec<Op>, cfg: QueueConfig) {
    let mut core = Core::new(cfg.clone(), None);
    let mut now = Instant::now();
    let mut model = Model::default();
    let mut held: Vec<(String, u32, String)> = Vec::new();
    let name = |k: u8| format!("k{k}");
    // A key keeps its first tenant while active; the model needs the tenant for caps only.
    for op in ops {
        match op {
            Op::Add {
                k,
                t,
                resync,
                bypass,
            } => {
                core.add(
                    &key(&name(k)),
                    &tenant(&format!("t{t}")),
                    prio(resync),
                    [Bypass::Never, Bypass::Repair, Bypass::Always][usize::from(bypass)],
                    &mut Now::at(now),
                );
                model.owed.insert(name(k));
            }
            Op::AddAfter { k, t, ms, resync } => {
                let d = Duration::from_millis(u64::from(ms));
                core.add_after(
                    &key(&name(k)),
                    &tenant(&format!("t{t}")),
                    d,
                    prio(resync),
                    &mut Now::at(now),
                );
                model.owed.insert(name(k));
            }
            Op::Get => {
                if let Some(d) = core.pop(&mut Now::at(now)) {
                    let n = d.key.name.to_string();
                    model.dispatched(&n, d.slot, d.tenant.as_str(), &cfg);
                    held.push((n, d.slot, d.tenant.as_str().to_owned()));
                }
            }
            Op::Retry(i, ms) => {
                if !held.is_empty() {
                    let (n, slot, t) = held.remove(i % held.len());
                    let d = Duration::from_millis(u64::from(ms));
                    assert!(core.done(slot, Some(d), &mut Now::at(now)));
                    model.in_flight.remove(&n);
                    model.owed.insert(n);
                    *model.per_tenant.get_mut(&t).unwrap() -= 1;
                }
            }
            Op::Done(i) => {
                if !held.is_empty() {
                    let (n, slot, t) = held.remove(i % held.len());
                    assert!(core.done(slot, None, &mut Now::at(now)));
                    model.in_flight.remove(&n);
                    *model.per_tenant.get_mut(&t).unwrap() -= 1;
                }
            }
            Op::Advance(ms) => now += Duration::from_millis(u64::from(ms)),
            Op::Remove(k) => {
                core.remove(&key(&name(k)));
                model.owed.remove(&name(k));
            }
        }
        assert!(core.len() <= 12, "dedupe: more queued entries than keys");
    }
    // Drain: finish everything, let every delay and aging bound pass, serve until empty.
    for (n, slot, t) in held.drain(..) {
        assert!(core.done(slot, None, &mut Now::at(now)));
        model.in_flight.remove(&n);
        *model.per_tenant.get_mut(&t).unwrap() -= 1;
    }
    now += Duration::from_secs(3600);
    let mut rounds = 0;
    while let Some(d) = core.pop(&mut Now::at(now)) {
        let n = d.key.name.to_string();
        model.dispatched(&n, d.slot, d.tenant.as_str(), &cfg);
        assert!(core.done(d.slot, None, &mut Now::at(now)));
        model.in_flight.remove(&n);
        *model.per_tenant.get_mut(d.tenant.as_str()).unwrap() -= 1;
        rounds += 1;
        assert!(
            rounds <= 12,
            "a drained queue must not keep handing out keys"
        );
    }
    assert!(model.owed.is_empty(), "lost keys: {:?}", model.owed);
    assert_eq!(core.in_flight(), 0);
    assert_eq!(core.len(), 0);
    assert_eq!(core.tenants(), 0, "idle tenants are forgotten");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_twice_never_lost(ops in proptest::collection::vec(op(), 1..200)) {
        run(ops, QueueConfig { max_in_flight: 4, per_tenant_cap: None, ..QueueConfig::default() });
    }

    #[test]
    fn never_twice_never_lost_with_a_tenant_cap(ops in proptest::collection::vec(op(), 1..200)) {
        run(ops, QueueConfig { max_in_flight: 4, per_tenant_cap: Some(2), ..QueueConfig::default() });
    }

    #[test]
    fn never_twice_never_lost_with_tight_caps(ops in proptest::collection::vec(op(), 1..200)) {
        run(ops, QueueConfig {
            max_in_flight: 1,
            per_tenant_cap: Some(1),
            resync_max_wait: Duration::from_millis(200),
            idle_reserve: 1,
        });
    }

    #[test]
    fn never_twice_never_lost_without_a_reserve(ops in proptest::collection::vec(op(), 1..200)) {
        run(ops, QueueConfig { max_in_flight: 4, idle_reserve: 0, ..QueueConfig::default() });
    }
}
