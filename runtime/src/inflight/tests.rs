//! Tests of [`RequestSlots`]: fair grants, work conservation, the cap, bypasses and cancel
//! safety, with a fake API server behind a real `kube::Client` under `tokio::time::pause`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::client::Body;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{AdaptiveLimit, RequestSlots, current_tenant, is_watch, scoped, scoped_weighted};
use crate::TenantKey;

/// How long the fake server works on one request.
const WORK: Duration = Duration::from_millis(100);

/// A saturated API server: it works on `parallel` requests at a time, FIFO, [`WORK`] each,
/// and records how many requests it held at once.
#[derive(Clone)]
struct FakeServer {
    cpu: Arc<Semaphore>,
    held: Arc<AtomicUsize>,
    max_held: Arc<AtomicUsize>,
    /// Above this many held, a request is refused at once with 429 (as a priority level
    /// whose queues are full).
    reject_above: usize,
}

impl FakeServer {
    fn new(parallel: usize) -> Self {
        Self {
            cpu: Arc::new(Semaphore::new(parallel)),
            held: Arc::new(AtomicUsize::new(0)),
            max_held: Arc::new(AtomicUsize::new(0)),
            reject_above: usize::MAX,
        }
    }

    fn rejecting_above(parallel: usize, reject_above: usize) -> Self {
        Self {
            reject_above,
            ..Self::new(parallel)
        }
    }

    fn max_held(&self) -> usize {
        self.max_held.load(Ordering::SeqCst)
    }
}

impl tower::Service<http::Request<Body>> for FakeServer {
    type Response = http::Response<Body>;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let now = this.held.fetch_add(1, Ordering::SeqCst) + 1;
            this.max_held.fetch_max(now, Ordering::SeqCst);
            if now > this.reject_above {
                this.held.fetch_sub(1, Ordering::SeqCst);
                let mut refused = http::Response::new(Body::empty());
                *refused.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                return Ok(refused);
            }
            {
                let _cpu = this.cpu.acquire().await.expect("never closed");
                tokio::time::sleep(WORK).await;
            }
            this.held.fetch_sub(1, Ordering::SeqCst);
            Ok(http::Response::new(Body::empty()))
        })
    }
}

fn fake_client(server: &FakeServer) -> kube::Client {
    kube::Client::new(server.clone(), "default")
}

async fn get(client: &kube::Client, query: &str) {
    let req = http::Request::get(format!("/api/v1/namespaces/x/configmaps{query}"))
        .body(Body::empty())
        .expect("valid request");
    client.send(req).await.expect("the fake answers");
}

/// `tasks` reconciles of tenant `flood`, each making `each` requests one after another.
fn flood(client: &kube::Client, tasks: usize, each: usize) -> Vec<tokio::task::JoinHandle<()>> {
    (0..tasks)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(scoped(TenantKey::new("flood"), async move {
                for _ in 0..each {
                    get(&client, "").await;
                }
            }))
        })
        .collect()
}

/// The time a quiet tenant's reconcile of 4 sequential requests takes while 32 reconciles
/// of another tenant keep the fake server (2 at a time) busy, through `client`.
async fn quiet_after_flood(client: &kube::Client) -> Duration {
    let flooding = flood(client, 32, 20);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let c = client.clone();
    tokio::spawn(scoped(TenantKey::new("quiet"), async move {
        for _ in 0..4 {
            get(&c, "").await;
        }
    }))
    .await
    .expect("quiet reconcile");
    let took = started.elapsed();
    for f in flooding {
        f.abort();
    }
    took
}

#[tokio::test(start_paused = true)]
async fn a_quiet_tenant_is_not_slowed_by_another_tenants_queued_requests() {
    // Alone: 4 × WORK. Without slots the quiet requests queue behind ~32 at the server
    // (16 × WORK each); with 4 slots behind at most 4 (≈ 2 × WORK, plus waiting for the
    // next free slot).
    let plain = quiet_after_flood(&fake_client(&FakeServer::new(2))).await;
    let slots = RequestSlots::new(4);
    let fair = quiet_after_flood(&slots.client(fake_client(&FakeServer::new(2)))).await;
    println!("quiet tenant's 4 requests: {plain:?} without slots, {fair:?} with 4 slots");
    assert!(
        plain >= WORK * 4 * 10,
        "the fake server was not saturated: {plain:?}"
    );
    assert!(
        fair <= WORK * 4 * 4,
        "quiet tenant waited behind the flood: {fair:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_cap_bounds_requests_at_the_server_and_a_tenant_alone_uses_every_slot() {
    for (cap, reserve, used) in [
        (1, 0, 1),
        (4, 0, 4),
        (8, 0, 8),
        (3, 1, 3),
        (4, 1, 3),
        (8, 1, 7),
    ] {
        let server = FakeServer::new(2);
        let slots = RequestSlots::new(cap).with_idle_reserve(reserve);
        let client = slots.client(fake_client(&server));
        for f in flood(&client, 32, 3) {
            f.await.expect("flood reconcile");
        }
        // Work-conserving but for the idle reserve: one tenant alone fills every other
        // slot; and never more.
        assert_eq!(server.max_held(), used, "cap {cap}, reserve {reserve}");
        assert_eq!(slots.busy(), 0, "every slot released");
    }
    let server = FakeServer::new(2);
    for f in flood(&fake_client(&server), 32, 1) {
        f.await.expect("flood reconcile");
    }
    assert_eq!(
        server.max_held(),
        32,
        "without slots every request reaches the server"
    );
}

#[tokio::test(start_paused = true)]
async fn busy_tenants_share_the_slots_in_proportion_to_their_weights() {
    // Two tenants keep 16 reconciles each waiting for slots; tenant "heavy" has weight 4.
    // Over the same time, heavy's requests answered ÷ light's ≈ 4 (weighted max-min
    // fairness); with equal weights they would be equal.
    for (weight, want) in [(4u32, 4.0f64), (1, 1.0)] {
        // 11 slots, 1 kept for idle tenants: 8 + 2 at weights 4 and 1, 5 + 5 at equal
        // weights.
        let server = FakeServer::new(11);
        let slots = RequestSlots::new(11);
        let client = slots.client(fake_client(&server));
        let answered: Arc<[AtomicUsize; 2]> = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let mut tasks = Vec::new();
        for (i, (name, w)) in [("heavy", weight), ("light", 1)].into_iter().enumerate() {
            for _ in 0..16 {
                let (client, answered) = (client.clone(), Arc::clone(&answered));
                tasks.push(tokio::spawn(scoped_weighted(
                    TenantKey::new(name),
                    w,
                    async move {
                        loop {
                            get(&client, "").await;
                            answered[i].fetch_add(1, Ordering::SeqCst);
                        }
                    },
                )));
            }
        }
        tokio::time::sleep(WORK * 200).await;
        for t in tasks {
            t.abort();
        }
        let heavy = answered[0].load(Ordering::SeqCst) as f64;
        let light = answered[1].load(Ordering::SeqCst) as f64;
        let ratio = heavy / light;
        println!("weight {weight}: heavy {heavy}, light {light}, ratio {ratio:.2}");
        assert!(
            (ratio - want).abs() <= want * 0.1,
            "weight {weight}: heavy {heavy} ÷ light {light} = {ratio:.2}, want ≈ {want}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_free_slot_goes_to_the_tenant_with_fewest_in_flight() {
    let slots = RequestSlots::new(2);
    let a = TenantKey::new("a");
    let b = TenantKey::new("b");
    let first = slots.acquire(a.clone()).await;
    let second = slots.acquire(a.clone()).await;
    // Three more of tenant a queue first, then one of b.
    let mut queued_a: Vec<_> = (0..3).map(|_| Box::pin(slots.acquire(a.clone()))).collect();
    for w in &mut queued_a {
        assert!(w.as_mut().now_or_never().is_none(), "all slots are taken");
    }
    let mut queued_b = Box::pin(slots.acquire(b.clone()));
    assert!(queued_b.as_mut().now_or_never().is_none());
    drop(first);
    let b_permit = queued_b
        .as_mut()
        .now_or_never()
        .expect("b has none in flight: it gets the freed slot");
    assert!(queued_a[0].as_mut().now_or_never().is_none());
    drop(second);
    // Now a has 0 in flight and b 1: a's oldest waiter is next.
    let a_permit = queued_a[0].as_mut().now_or_never().expect("a's turn");
    assert!(queued_a[1].as_mut().now_or_never().is_none());
    drop((a_permit, b_permit));
    assert!(queued_a[1].as_mut().now_or_never().is_some());
    assert!(queued_a[2].as_mut().now_or_never().is_some());
}

/// Acquires `n` slots for `tenant` that are granted at once.
async fn hold(slots: &RequestSlots, tenant: &TenantKey, n: usize) -> Vec<super::SlotPermit> {
    let mut held = Vec::new();
    for i in 0..n {
        let permit = slots.acquire(tenant.clone()).now_or_never();
        held.push(permit.unwrap_or_else(|| panic!("slot {i} of {tenant} was not free")));
    }
    held
}

#[tokio::test(start_paused = true)]
async fn the_idle_reserve_is_kept_for_a_tenant_with_nothing_in_flight() {
    let busy = TenantKey::new("busy");
    let quiet = TenantKey::new("quiet");
    // Cap 8, the default reserve of 1: the busy tenant gets 7 slots and waits for the 8th.
    let slots = RequestSlots::new(8);
    let mut flood = hold(&slots, &busy, 7).await;
    let mut busy_waits = Box::pin(slots.acquire(busy.clone()));
    assert!(
        busy_waits.as_mut().now_or_never().is_none(),
        "a busy tenant took the reserve"
    );
    // A tenant with nothing in flight gets it at once, ahead of the waiting busy tenant.
    let first = slots.acquire(quiet.clone()).now_or_never();
    let first = first.expect("the reserve is free for a tenant with none in flight");
    assert_eq!(slots.busy(), 8);
    // Its second request is no longer idle work: it waits like any other.
    let mut second = Box::pin(slots.acquire(quiet.clone()));
    assert!(second.as_mut().now_or_never().is_none(), "the cap is full");
    // A slot freed while both tenants have requests in flight is the reserve again: neither
    // takes it.
    drop(flood.pop());
    assert_eq!(slots.busy(), 7);
    assert!(second.as_mut().now_or_never().is_none());
    assert!(busy_waits.as_mut().now_or_never().is_none());
    // Once quiet's first request is answered it has none in flight: its second goes next,
    // before the busy tenant's older waiter, and the reserve stays free.
    drop(first);
    let second = second
        .as_mut()
        .now_or_never()
        .expect("quiet has none in flight");
    assert_eq!(
        slots.busy(),
        7,
        "only the reserve is free: the busy tenant still waits"
    );
    assert!(busy_waits.as_mut().now_or_never().is_none());
    drop(second);
    let _granted = busy_waits
        .as_mut()
        .now_or_never()
        .expect("below the reserve");
    assert_eq!(slots.busy(), 7);
    let mut busy_again = Box::pin(slots.acquire(busy.clone()));
    assert!(
        busy_again.as_mut().now_or_never().is_none(),
        "the reserve is kept"
    );
    drop(busy_again);

    // With no reserve, one tenant may hold every slot.
    let slots = RequestSlots::new(8).with_idle_reserve(0);
    let _all = hold(&slots, &busy, 8).await;
    // The reserve is at most a quarter of the cap: 2 of 8 however many are asked for, none
    // of 3.
    let slots = RequestSlots::new(8).with_idle_reserve(5);
    let _six = hold(&slots, &busy, 6).await;
    assert!(slots.acquire(busy.clone()).now_or_never().is_none());
    let _two = hold(&slots, &quiet, 1).await;
    let _other = hold(&slots, &TenantKey::new("other"), 1).await;
    let slots = RequestSlots::new(3).with_idle_reserve(1);
    let _three = hold(&slots, &busy, 3).await;
}

#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_after_its_grant_gives_the_slot_back() {
    let slots = RequestSlots::new(1);
    let held = slots.acquire(TenantKey::new("a")).await;
    let mut waiter = Box::pin(slots.acquire(TenantKey::new("b")));
    assert!(waiter.as_mut().now_or_never().is_none());
    drop(held); // grants the slot to the waiter, which never sees it
    assert_eq!(slots.busy(), 1);
    drop(waiter);
    assert_eq!(slots.busy(), 0);
    // And a waiter dropped before any grant leaves nothing behind.
    let held = slots.acquire(TenantKey::new("a")).await;
    let mut waiter = Box::pin(slots.acquire(TenantKey::new("c")));
    assert!(waiter.as_mut().now_or_never().is_none());
    drop(waiter);
    drop(held);
    assert_eq!(slots.busy(), 0);
    let again = slots.acquire(TenantKey::new("d")).now_or_never();
    assert!(again.is_some(), "the slot is free");
}

#[tokio::test(start_paused = true)]
async fn watches_and_requests_outside_a_reconcile_take_no_slot() {
    let server = FakeServer::new(100);
    let slots = RequestSlots::new(1);
    let client = slots.client(fake_client(&server));
    let held = slots.acquire(TenantKey::new("a")).await;
    // The only slot is taken: a tenant's watch and an untenanted GET still go through.
    let c = client.clone();
    scoped(TenantKey::new("b"), async move {
        get(&c, "?watch=true&resourceVersion=1").await
    })
    .await;
    assert_eq!(current_tenant(), None);
    get(&client, "").await;
    // A tenant's GET waits for the slot.
    let c = client.clone();
    let mut blocked = Box::pin(scoped(
        TenantKey::new("b"),
        async move { get(&c, "").await },
    ));
    tokio::select! {
        () = &mut blocked => panic!("a tenant's GET went through with no free slot"),
        () = tokio::time::sleep(WORK * 10) => {}
    }
    drop(held);
    blocked.await;
    assert!(is_watch(&"/api/v1/pods?watch=1".parse().expect("uri")));
    assert!(!is_watch(
        &"/api/v1/pods?watchers=true".parse().expect("uri")
    ));
}

#[tokio::test(start_paused = true)]
async fn a_tenant_that_asks_again_at_once_does_not_overtake_an_older_waiter() {
    // One slot; a and b take turns asking again the moment their request ends, c waits.
    // Among tenants with nothing in flight the oldest waiting request goes first, so c is
    // served within two releases however often the others come back.
    let slots = RequestSlots::new(1);
    let mut held = slots.acquire(TenantKey::new("a")).await;
    let mut b = Box::pin(slots.acquire(TenantKey::new("b")));
    assert!(b.as_mut().now_or_never().is_none());
    let mut c = Box::pin(slots.acquire(TenantKey::new("c")));
    assert!(c.as_mut().now_or_never().is_none());
    drop(held);
    held = b.as_mut().now_or_never().expect("b waited first");
    let mut a = Box::pin(slots.acquire(TenantKey::new("a")));
    assert!(a.as_mut().now_or_never().is_none());
    drop(held);
    assert!(
        a.as_mut().now_or_never().is_none(),
        "a came back after c and must not overtake it"
    );
    let c_permit = c.as_mut().now_or_never().expect("c is served next");
    drop(c_permit);
    assert!(a.as_mut().now_or_never().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_tenants_older_reconcile_finishes_first() {
    // 8 reconciles of one tenant start together, 5 requests each, through 2 slots. Served
    // by arrival they would all end near the end (round robin); served by reconcile start
    // half of them end by half time (a reconcile's next request is not waiting yet when its
    // slot frees, so the next-oldest ones interleave with it).
    let server = FakeServer::new(2);
    let client = RequestSlots::new(2).client(fake_client(&server));
    let started = Instant::now();
    let ends: Vec<_> = (0..8)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(scoped(TenantKey::new("flood"), async move {
                for _ in 0..5 {
                    get(&client, "").await;
                }
                started.elapsed()
            }))
        })
        .collect();
    let mut ends: Vec<Duration> = futures::future::try_join_all(ends)
        .await
        .expect("reconciles");
    ends.sort();
    println!("reconciles ended after {ends:?}");
    assert!(
        ends[3] <= WORK * 10,
        "the oldest reconciles waited for the others: {ends:?}"
    );
    assert_eq!(
        ends[7],
        WORK * 20,
        "the same throughput: 40 requests, 2 at a time"
    );
}

#[tokio::test(start_paused = true)]
async fn an_adaptive_cap_grows_to_what_the_server_serves_without_queueing() {
    // The server works on 8 requests at once; a flood of 64 reconciles of one tenant asks for
    // more. From 2 the tenant's cap grows while latency stays flat and stops where requests
    // start to queue; the idle reserve (kept from the total) does not move it.
    for (parallel, reserve, low, high) in [(8, 0, 8, 16), (2, 0, 2, 4), (8, 1, 8, 16), (2, 1, 2, 4)]
    {
        let server = FakeServer::new(parallel);
        let slots = RequestSlots::adaptive(AdaptiveLimit {
            initial: 2,
            min: 1,
            max: 64,
        })
        .with_idle_reserve(reserve);
        let client = slots.client(fake_client(&server));
        for f in flood(&client, 64, 40) {
            f.await.expect("flood reconcile");
        }
        let cap = slots.tenant_slots().expect("adaptive");
        println!("server of {parallel}, reserve {reserve}: cap settled at {cap}");
        assert!(server.max_held() <= high, "a lone tenant went past its cap");
        assert!(
            (low..=high).contains(&cap),
            "server of {parallel}, reserve {reserve}: cap {cap} not in {low}..={high}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_adaptive_cap_shrinks_when_the_server_throttles() {
    // A priority level that refuses beyond 6 requests at once; the tenant's cap starts at 32.
    for reserve in [0, 1] {
        let server = FakeServer::rejecting_above(4, 6);
        let slots = RequestSlots::adaptive(AdaptiveLimit {
            initial: 32,
            min: 1,
            max: 64,
        })
        .with_idle_reserve(reserve);
        let client = slots.client(fake_client(&server));
        // The tenant's cap once every WORK: it probes one past the limit, draws a 429 and is
        // cut (additive increase, multiplicative decrease).
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (watched, into) = (slots.clone(), Arc::clone(&seen));
        let watch = tokio::spawn(async move {
            loop {
                tokio::time::sleep(WORK).await;
                let cap = watched.tenant_slots().expect("adaptive");
                into.lock().expect("not poisoned").push(cap);
            }
        });
        for f in flood(&client, 64, 20) {
            f.await.expect("flood reconcile");
        }
        watch.abort();
        let seen = seen.lock().expect("not poisoned").clone();
        let late = &seen[seen.len() / 2..];
        let mean = late.iter().sum::<usize>() as f64 / late.len() as f64;
        let (top, total) = (late.iter().max().copied().unwrap_or(0), slots.slots());
        println!(
            "throttled above 6, reserve {reserve}: tenant cap mean {mean:.1}, top {top}, total {total}"
        );
        assert!(
            top <= 7 && mean <= 6.0,
            "reserve {reserve}: the cap stayed above the server's limit: mean {mean:.1}, top {top}"
        );
        assert!(total < 64, "the total did not fall on 429s: {total}");
    }
}

#[tokio::test(start_paused = true)]
async fn many_tenants_together_are_bounded_by_the_total_not_a_tenants_cap() {
    // A server that works on 4 requests at once. One tenant alone: its cap settles where its
    // requests would queue. Then 32 tenants with 4 reconciles each: together they keep more
    // in flight than one tenant's cap, bounded only by the total (the server's throttling,
    // here none: 64).
    let server = FakeServer::new(4);
    let slots = RequestSlots::adaptive(AdaptiveLimit {
        initial: 2,
        min: 1,
        max: 64,
    });
    let client = slots.client(fake_client(&server));
    for f in flood(&client, 64, 40) {
        f.await.expect("flood reconcile");
    }
    let alone = server.max_held();
    let cap = slots.tenant_slots().expect("adaptive");
    println!("one tenant: cap {cap}, at most {alone} at the server");
    assert!(alone <= 8, "one tenant's flood was not capped: {alone}");
    server.max_held.store(0, Ordering::SeqCst);
    let mut tasks = Vec::new();
    for t in 0..32 {
        for _ in 0..4 {
            let client = client.clone();
            tasks.push(tokio::spawn(scoped(
                TenantKey::new(format!("t{t}")),
                async move {
                    for _ in 0..10 {
                        get(&client, "").await;
                    }
                },
            )));
        }
    }
    for t in tasks {
        t.await.expect("tenant reconcile");
    }
    let held = server.max_held();
    println!("32 tenants: at most {held} at the server");
    assert!(
        held >= 32,
        "the tenants together were held to a tenant's cap: {held} at the server"
    );
}

#[tokio::test(start_paused = true)]
async fn an_adaptive_cap_still_lets_a_quiet_tenant_through() {
    let slots = RequestSlots::adaptive(AdaptiveLimit::default());
    let fair = quiet_after_flood(&slots.client(fake_client(&FakeServer::new(2)))).await;
    println!("quiet tenant's 4 requests with an adaptive cap: {fair:?}");
    assert!(
        fair <= WORK * 4 * 4,
        "quiet tenant waited behind the flood: {fair:?}"
    );
}

#[test]
fn the_cap_is_published() {
    let slots = RequestSlots::new(3);
    let mut registry = prometheus_client::registry::Registry::default();
    slots.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
    assert!(text.contains("idem_request_slots_limit 3"), "{text}");
}
