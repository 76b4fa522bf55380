//! A fair share of API requests in flight: a cap on one client's concurrent requests whose free
//! slots go to the tenant with the fewest requests in flight, so one tenant's flood cannot
//! slow down another tenant's writes.
//!
//! The fair work queue shares *reconciles* among tenants; this shares the *requests* those
//! reconciles make. Without it, a tenant that keeps 16 reconciles busy also keeps ~16 writes
//! queued at a saturated API server, and a quiet tenant's next write waits behind all of them
//! there. The API server's own answer to this is API Priority and Fairness: a
//! priority level has a number of seats, and flows queue fairly for them. A controller runs as
//! one user, i.e. one flow, so APF cannot tell its tenants apart; [`RequestSlots`] does the
//! same on the client side, with idem's tenants as the flows:
//!
//! - at most `slots` requests made inside a reconcile are in flight at once;
//! - a free slot goes to the waiting tenant with the fewest requests in flight (ties: the one
//!   whose first waiting request is oldest), so a tenant that becomes active gets the next free slot however
//!   many requests others have queued, and busy tenants share the slots equally (max-min
//!   fairness, as APF's fair queuing gives flows of one priority level equal shares);
//! - it keeps an *idle reserve* (1 slot by default, [`RequestSlots::with_idle_reserve`]; at
//!   most a quarter of the cap, none below a cap of 4): once only the reserve is free, a slot
//!   goes only to a tenant with no request in flight, so a tenant that becomes active sends
//!   its first request at once instead of waiting for a busy tenant's request to end (the
//!   fair queue keeps a worker the same way, `QueueConfig::idle_reserve`);
//! - otherwise it is work-conserving: a tenant alone may hold every slot but the reserve;
//! - among one tenant's waiting requests, those of the reconcile that started first go first,
//!   so a tenant's reconciles finish one after another instead of all together at the end
//!   (the same throughput, but workers come free sooner for whoever waits for one).
//!
//! The tenant of a request is the one of the reconcile in whose task it runs: the controller's
//! workers run each reconcile inside [`scoped`]. Requests outside any reconcile (the
//! controller's LISTs and watches, leader-election renewals) and every `watch=true` request
//! bypass the cap and do not count against it. A slot is held from just before the request is
//! sent until its response headers arrive.
//!
//! The cap is fixed ([`RequestSlots::new`]) or tunes itself ([`RequestSlots::adaptive`]). A
//! self-tuning cap is two: each tenant's requests in flight are capped (times its weight) by
//! a cap that grows while the API server's latency stays flat and shrinks when latency rises
//! or the server answers 429, so one tenant's flood cannot raise everyone's latency; the
//! total, which many tenants together reach (a fleet being created), falls only on 429s (see
//! [`limit`]). [`RequestSlots::register`] publishes them as the gauges
//! `idem_request_slots_limit` (the total) and `idem_request_slots_tenant_limit`.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use kube::client::Body;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::oneshot;

use crate::key::TenantKey;

pub mod limit;

pub use self::limit::AdaptiveLimit;
use self::limit::{Class, Tuner};

tokio::task_local! {
    static SCOPE: (TenantKey, u64, u32);
}

/// Orders reconciles (by start) and plain acquires (by arrival) on one scale.
static ORDER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_order() -> u64 {
    ORDER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Runs `fut` with `tenant` (weight 1) as the tenant of every request it makes through a
/// client wrapped by [`RequestSlots::client`].
pub async fn scoped<F: Future>(tenant: TenantKey, fut: F) -> F::Output {
    scoped_weighted(tenant, 1, fut).await
}

/// [`scoped`] for a tenant of fair-share `weight` (at least 1): among busy tenants, a
/// tenant's share of the slots is proportional to its weight. The controller's workers run
/// each reconcile this way, with the weight the fair queue dispatched it with.
pub async fn scoped_weighted<F: Future>(tenant: TenantKey, weight: u32, fut: F) -> F::Output {
    SCOPE
        .scope((tenant, next_order(), weight.max(1)), fut)
        .await
}

/// The tenant of the reconcile running in this task, if any (see [`scoped`]).
pub fn current_tenant() -> Option<TenantKey> {
    SCOPE.try_with(|(tenant, _, _)| tenant.clone()).ok()
}

/// A cap on concurrent API requests, shared fairly among tenants; see the [module](self) docs.
///
/// Cheap to clone: clones share the slots. Wrap the client your reconciles write with
/// ([`RequestSlots::client`]); the controller sets the tenant of each reconcile.
#[derive(Clone, Debug)]
pub struct RequestSlots {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    /// Slots in all: the cap.
    slots: usize,
    /// A tenant's slots per unit of its weight, when the caps are adaptive.
    tenant_slots: Option<usize>,
    /// Tunes `slots` and `tenant_slots` from the answers, when the caps are adaptive.
    tuner: Option<Tuner>,
    /// `slots`, published.
    gauge: Gauge,
    /// `tenant_slots`, published (when adaptive).
    tenant_gauge: Gauge,
    /// Slots asked to be kept for tenants with no request in flight (see
    /// [`State::reserved`]).
    reserve: usize,
    /// Slots granted and not yet released.
    busy: usize,
    /// Tenants with a request in flight or waiting.
    tenants: HashMap<TenantKey, Tenant>,
}

#[derive(Debug)]
struct Tenant {
    in_flight: usize,
    /// Its fair-share weight, as its latest request gave it (at least 1).
    weight: u32,
    /// Waiting requests, each with its order (the start of its reconcile, or its arrival
    /// outside one), lowest first.
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
}

impl Tenant {
    fn new(weight: u32) -> Self {
        Self {
            in_flight: 0,
            weight: weight.max(1),
            waiting: VecDeque::new(),
        }
    }

    /// Requests in flight per unit of weight, in fixed point: the tenant with the least gets
    /// the next free slot (weighted max-min fairness).
    fn load(&self) -> u64 {
        ((self.in_flight as u64) << 32) / u64::from(self.weight)
    }
}

impl State {
    /// The slots kept for tenants with no request in flight under the cap now: the asked
    /// reserve, at most a quarter of the cap (none below a cap of 4).
    fn reserved(&self) -> usize {
        self.reserve.min(self.slots / 4)
    }

    /// Whether a tenant with `in_flight` requests in flight at `weight` may take a free slot
    /// now: any tenant below its own cap and the reserve, only an idle one within the reserve.
    fn may_take(&self, in_flight: usize, weight: u32) -> bool {
        let own = self
            .tenant_limit(weight)
            .is_none_or(|limit| in_flight < limit);
        own && self.busy < self.slots
            && (in_flight == 0 || self.busy + self.reserved() < self.slots)
    }

    /// Whether a tenant's own cap, and not the total, keeps its next request waiting: only
    /// then would a higher tenant cap let more through.
    fn own_cap_binds(&self, in_flight: usize, weight: u32) -> bool {
        self.tenant_limit(weight)
            .is_some_and(|limit| in_flight >= limit)
            && self.busy + self.reserved() < self.slots
    }

    /// The most requests a tenant of `weight` may have in flight, when the caps are adaptive.
    fn tenant_limit(&self, weight: u32) -> Option<usize> {
        let weight = usize::try_from(weight).unwrap_or(usize::MAX);
        self.tenant_slots.map(|cap| cap.saturating_mul(weight))
    }

    /// Hands free slots to waiters, the tenant with the fewest in flight for its weight first.
    fn dispatch(&mut self) {
        while self.busy < self.slots {
            let next = self
                .tenants
                .iter()
                .filter(|(_, t)| self.may_take(t.in_flight, t.weight))
                .filter_map(|(k, t)| Some((t.load(), t.waiting.front()?.0, k)))
                .min()
                .map(|(_, _, k)| k.clone());
            let Some(key) = next else { return };
            let tenant = self.tenants.get_mut(&key).expect("chosen above");
            let Some((_, tx)) = tenant.waiting.pop_front() else {
                continue;
            };
            // A waiter that gave up has dropped its receiver: skip it.
            if tx.send(()).is_ok() {
                tenant.in_flight += 1;
                self.busy += 1;
            } else {
                self.forget_if_idle(&key);
            }
        }
    }

    fn forget_if_idle(&mut self, key: &TenantKey) {
        if let Some(t) = self.tenants.get_mut(key) {
            t.waiting.retain(|(_, tx)| !tx.is_closed());
            if t.in_flight == 0 && t.waiting.is_empty() {
                self.tenants.remove(key);
            }
        }
    }

    fn release(&mut self, key: &TenantKey) {
        if let Some(t) = self.tenants.get_mut(key) {
            t.in_flight = t.in_flight.saturating_sub(1);
        }
        self.busy = self.busy.saturating_sub(1);
        self.forget_if_idle(key);
        self.dispatch();
    }
}

impl RequestSlots {
    /// At most `slots` requests in flight (at least 1), a fixed cap.
    pub fn new(slots: usize) -> Self {
        Self::with(slots.max(1), None)
    }

    /// Caps that tune themselves within `bounds` (see [`limit`]): a tenant's cap (times its
    /// weight) grows while the API server's latency stays flat under it and shrinks when
    /// latency rises or the server throttles; the total starts at `bounds.max` and falls only
    /// when the server throttles.
    pub fn adaptive(bounds: AdaptiveLimit) -> Self {
        let (tuner, caps) = Tuner::new(bounds);
        let slots = Self::with(caps.total, Some(tuner));
        slots.set_caps(caps);
        slots
    }

    fn with(slots: usize, tuner: Option<Tuner>) -> Self {
        let gauge = Gauge::default();
        gauge.set(i64::try_from(slots).unwrap_or(i64::MAX));
        Self {
            state: Arc::new(Mutex::new(State {
                slots,
                tenant_slots: None,
                tuner,
                gauge,
                tenant_gauge: Gauge::default(),
                reserve: 1,
                busy: 0,
                tenants: HashMap::new(),
            })),
        }
    }

    /// Keeps `reserve` slots (default 1) for tenants with no request in flight: once only
    /// they are free, a busy tenant's requests wait and a tenant that becomes active sends its
    /// first request at once. The reserve in effect is at most a quarter of the cap, and none
    /// below a cap of 4; 0 makes the slots fully work-conserving (a tenant alone may hold
    /// every one).
    #[must_use]
    pub fn with_idle_reserve(self, reserve: usize) -> Self {
        {
            let mut s = self.lock();
            s.reserve = reserve;
            s.dispatch();
        }
        self
    }

    /// Registers the gauge `idem_request_slots_limit` (the cap now) in `registry`, and for
    /// adaptive caps `idem_request_slots_tenant_limit` (a tenant's cap per unit of weight).
    pub fn register(&self, registry: &mut Registry) {
        let s = self.lock();
        registry.register(
            "idem_request_slots_limit",
            "Requests of reconciles the API client lets into flight at once now",
            s.gauge.clone(),
        );
        if s.tenant_slots.is_some() {
            registry.register(
                "idem_request_slots_tenant_limit",
                "Requests of one tenant's reconciles let into flight at once now, per unit of weight",
                s.tenant_gauge.clone(),
            );
        }
    }

    fn set_caps(&self, caps: limit::Caps) {
        let mut s = self.lock();
        let from = (s.slots, s.tenant_slots);
        s.slots = caps.total;
        s.tenant_slots = Some(caps.tenant);
        s.gauge.set(i64::try_from(caps.total).unwrap_or(i64::MAX));
        s.tenant_gauge
            .set(i64::try_from(caps.tenant).unwrap_or(i64::MAX));
        tracing::debug!(
            ?from,
            total = caps.total,
            tenant = caps.tenant,
            "request slots retuned"
        );
        s.dispatch();
    }

    /// One answered request of class `class` that took `latency` once sent.
    fn observe(&self, class: Class, latency: std::time::Duration, throttled: bool) {
        let next = {
            let mut s = self.lock();
            let busy = s.busy;
            s.tuner
                .as_mut()
                .and_then(|t| t.observe(class, latency, throttled, busy))
        };
        if let Some(caps) = next {
            self.set_caps(caps);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cap now (for a fixed cap, the one it was made with).
    pub fn slots(&self) -> usize {
        self.lock().slots
    }

    /// A tenant's cap per unit of its weight now, when the caps are adaptive.
    pub fn tenant_slots(&self) -> Option<usize> {
        self.lock().tenant_slots
    }

    /// Requests in flight now (slots held).
    pub fn busy(&self) -> usize {
        self.lock().busy
    }

    /// Waits for a slot for `tenant`; the slot is freed when the [`SlotPermit`] is dropped.
    ///
    /// # Cancel safety
    /// Cancel safe: a slot granted to a waiter that is dropped is released.
    pub async fn acquire(&self, tenant: TenantKey) -> SlotPermit {
        self.acquire_in_order(tenant, next_order(), 1).await
    }

    /// [`acquire`](Self::acquire) for a request whose place among its tenant's waiters (and
    /// in ties between tenants) is `order`, lowest first, for a tenant of `weight`.
    async fn acquire_in_order(&self, tenant: TenantKey, order: u64, weight: u32) -> SlotPermit {
        let rx = {
            let mut s = self.lock();
            s.tenants
                .entry(tenant.clone())
                .or_insert_with(|| Tenant::new(weight))
                .weight = weight.max(1);
            let waiting_anywhere = s.tenants.values().any(|t| !t.waiting.is_empty());
            let in_flight = s.tenants.get(&tenant).map_or(0, |t| t.in_flight);
            if s.may_take(in_flight, weight.max(1)) && !waiting_anywhere {
                s.busy += 1;
                s.tenants
                    .entry(tenant.clone())
                    .or_insert_with(|| Tenant::new(1))
                    .in_flight += 1;
                None
            } else {
                let own_cap_binds = s.own_cap_binds(in_flight, weight.max(1));
                if let Some(tuner) = s.tuner.as_mut().filter(|_| own_cap_binds) {
                    tuner.saturated();
                }
                let (tx, rx) = oneshot::channel();
                let waiting = &mut s
                    .tenants
                    .entry(tenant.clone())
                    .or_insert_with(|| Tenant::new(1))
                    .waiting;
                let at = waiting.partition_point(|(o, _)| *o <= order);
                waiting.insert(at, (order, tx));
                // Normally a no-op (waiters exist only while no free slot may go to them); it
                // keeps a free slot from idling should that ever not hold.
                s.dispatch();
                Some(rx)
            }
        };
        if let Some(rx) = rx {
            let mut wait = Waiting {
                slots: self.clone(),
                tenant: tenant.clone(),
                rx: Some(rx),
            };
            let granted = wait.rx.as_mut().expect("set above").await;
            wait.rx = None;
            if granted.is_err() {
                // Not reached: a sender is dropped only after its receiver closed. Count the
                // slot anyway, so the permit's release stays balanced.
                let mut s = self.lock();
                s.busy += 1;
                s.tenants
                    .entry(tenant.clone())
                    .or_insert_with(|| Tenant::new(1))
                    .in_flight += 1;
            }
        }
        SlotPermit {
            slots: self.clone(),
            tenant,
        }
    }

    /// `client` with every non-watch request made inside a reconcile ([`scoped`]) holding one
    /// of these slots until its response headers arrive. Requests outside any reconcile and
    /// watches pass through without a slot.
    pub fn client(&self, client: kube::Client) -> kube::Client {
        let namespace = client.default_namespace().to_owned();
        kube::Client::new(
            SlotService {
                client,
                slots: self.clone(),
            },
            namespace,
        )
    }
}

/// One slot of a [`RequestSlots`], held by one request; dropping it frees the slot for the
/// next waiting tenant.
#[derive(Debug)]
pub struct SlotPermit {
    slots: RequestSlots,
    tenant: TenantKey,
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        self.slots.lock().release(&self.tenant);
    }
}

/// A queued acquire; on drop it gives back a slot granted meanwhile.
struct Waiting {
    slots: RequestSlots,
    tenant: TenantKey,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        rx.close();
        let mut s = self.slots.lock();
        if rx.try_recv().is_ok() {
            s.release(&self.tenant);
        } else {
            s.forget_if_idle(&self.tenant);
        }
    }
}

/// Whether `uri` asks for a watch (`watch=true` or `watch=1`), which holds no slot.
fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1"))
    })
}

/// The tower service [`RequestSlots::client`] puts in front of the wrapped client.
#[derive(Clone)]
struct SlotService {
    client: kube::Client,
    slots: RequestSlots,
}

impl tower::Service<http::Request<Body>> for SlotService {
    type Response = http::Response<Body>;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let client = self.client.clone();
        let slots = self.slots.clone();
        Box::pin(async move {
            // Read when first polled, not in `call`: kube's `Client` calls its service on its
            // buffer's task but polls the returned future in the caller's task, inside the
            // reconcile's `scoped`.
            let scope = SCOPE.try_with(Clone::clone).ok();
            let Some((tenant, order, weight)) = scope.filter(|_| !is_watch(request.uri())) else {
                return client.send(request).await.map_err(Into::into);
            };
            let asked = tokio::time::Instant::now();
            let permit = slots.acquire_in_order(tenant.clone(), order, weight).await;
            let sent = tokio::time::Instant::now();
            let (method, path) = (request.method().clone(), request.uri().path().to_owned());
            let response = client.send(request).await;
            drop(permit);
            let throttled = response.as_ref().is_ok_and(|r| {
                matches!(
                    r.status(),
                    http::StatusCode::TOO_MANY_REQUESTS | http::StatusCode::SERVICE_UNAVAILABLE
                )
            });
            slots.observe(Class::of(&method), sent.elapsed(), throttled);
            tracing::debug!(
                %tenant, %method, path,
                slot_wait_ms = sent.duration_since(asked).as_millis() as u64,
                response_ms = sent.elapsed().as_millis() as u64,
                "request through a fair slot"
            );
            // `Client::send` unwraps a boxed `kube::Error` back into itself.
            response.map_err(|e| Box::new(e) as tower::BoxError)
        })
    }
}

#[cfg(test)]
mod tests;
