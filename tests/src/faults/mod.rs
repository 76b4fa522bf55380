//! A fault-injection layer for a kube [`Client`](kube::Client): conflicts, throttling, server
//! errors, latency and held, delayed, cut or expired watches, switched at run time through a
//! shared handle.
//!
//! [`Faults`] is the handle; [`Faults::client`] builds a client whose every request passes
//! through a [`FaultLayer`] (a tower layer, outermost on kube's own service stack). The layer
//! answers some requests itself instead of sending them, the way the API server would answer
//! them under load or contention, and controls the bodies of open watches:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_tests::faults::{Faults, Schedule, Verb};
//! use std::time::Duration;
//!
//! let faults = Faults::new();
//! let client = faults.client(idem_tests::shared().config())?;
//! faults.conflicts(Schedule::Every(3)); // every third write: 409 Conflict
//! faults.too_many_requests(Schedule::Next(2), Duration::from_secs(1)); // 429, Retry-After: 1
//! faults.expire_watches(); // open watches get an ERROR 410 event: the watcher relists
//! let lists = faults.requests()[&Verb::List];
//! # let _ = (client, lists); Ok(()) }
//! ```
//!
//! The injected faults act outside kube's built-in retry (`kube::Config::default_retry`), so an
//! injected 429 reaches the caller as an error, like a 429 that outlasted the retries.

mod body;
mod service;
mod verb;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub use body::{FaultBody, GONE_EVENT};
pub use service::{FaultLayer, FaultService};
pub use verb::Verb;

use body::{END, EXPIRE, WatchCtl};

/// Which of the requests a fault applies to get it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    /// None (the default).
    #[default]
    Off,
    /// The next `n` matching requests, then none.
    Next(u32),
    /// Every `n`-th matching request, counted from when the schedule was set (`Every(1)`: all
    /// of them; `Every(0)`: none).
    Every(u32),
}

/// How many faults the layer injected, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Injected {
    /// Writes answered with 409 Conflict.
    pub conflicts: u64,
    /// Requests answered with 429 Too Many Requests.
    pub too_many_requests: u64,
    /// Requests answered with 500 Internal Server Error.
    pub server_errors: u64,
    /// Watch responses ended early by [`Faults::cut_watches`].
    pub watches_cut: u64,
    /// Watch responses given an `ERROR` 410 event by [`Faults::expire_watches`].
    pub watches_expired: u64,
}

/// A shared handle on the faults of one or more clients (cheap to clone; clones share state).
///
/// Every switch takes effect for the next request; counters only grow. Nothing is injected
/// until a switch is set.
#[derive(Clone, Default)]
pub struct Faults {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    watches: Mutex<Vec<Weak<WatchCtl>>>,
    hold: Arc<AtomicBool>,
    /// How long each watch event is kept from the client, in nanoseconds.
    delay: Arc<AtomicU64>,
}

#[derive(Default)]
struct State {
    conflicts: Rule,
    too_many: Rule,
    too_many_writes: Rule,
    retry_after: Duration,
    server_errors: Rule,
    latency: Duration,
    requests: BTreeMap<Verb, u64>,
    sent: BTreeMap<Verb, u64>,
    injected: Injected,
}

/// A [`Schedule`] and how many requests it has matched since it was set.
#[derive(Default)]
struct Rule {
    schedule: Schedule,
    matched: u64,
}

impl Rule {
    fn set(&mut self, schedule: Schedule) {
        *self = Rule {
            schedule,
            matched: 0,
        };
    }

    /// Whether this matching request gets the fault.
    fn fire(&mut self) -> bool {
        match &mut self.schedule {
            Schedule::Off => false,
            Schedule::Next(n) if *n > 0 => {
                *n -= 1;
                true
            }
            Schedule::Next(_) => false,
            Schedule::Every(n) => {
                self.matched += 1;
                *n > 0 && self.matched.is_multiple_of(u64::from(*n))
            }
        }
    }
}

/// What the layer does with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    /// Send it.
    Forward,
    /// Answer 409 Conflict.
    Conflict,
    /// Answer 429 with `Retry-After` in whole seconds.
    TooManyRequests(u64),
    /// Answer 500.
    ServerError,
}

impl Faults {
    /// A handle with every fault off.
    pub fn new() -> Self {
        Self::default()
    }

    /// The tower layer that applies this handle's faults, for a hand-built client stack
    /// (`kube::client::ClientBuilder::with_layer`).
    pub fn layer(&self) -> FaultLayer {
        FaultLayer::new(self.clone())
    }

    /// A client for `config` (e.g. [`crate::ControlPlane::config`]) with kube's default
    /// service stack and this handle's [`FaultLayer`] outermost.
    ///
    /// # Errors
    /// [`crate::Error::Kube`] when kube cannot build a client from `config` (TLS or auth
    /// settings).
    ///
    /// # Panics
    /// Outside a Tokio runtime (kube's client spawns its connection task).
    pub fn client(&self, config: kube::Config) -> crate::Result<kube::Client> {
        let builder = kube::client::ClientBuilder::try_from(config)?;
        Ok(builder.with_layer(&self.layer()).build())
    }

    /// Answer writes ([`Verb::is_write`]) on `schedule` with 409 Conflict (reason `Conflict`,
    /// as for a stale resourceVersion or an apply conflict), without sending them.
    pub fn conflicts(&self, schedule: Schedule) {
        self.state().conflicts.set(schedule);
    }

    /// Answer requests of any verb on `schedule` with 429 Too Many Requests and a
    /// `Retry-After` header (and `details.retryAfterSeconds`) of `retry_after` in whole
    /// seconds, rounded up (RFC 9110 `delay-seconds`; the API server's priority-and-fairness
    /// rejection), without sending them.
    pub fn too_many_requests(&self, schedule: Schedule, retry_after: Duration) {
        let mut state = self.state();
        state.too_many.set(schedule);
        state.retry_after = retry_after;
    }

    /// As [`Faults::too_many_requests`], but counting and answering only writes
    /// ([`Verb::is_write`]): a 429 that must reach the code under test rather than a watch
    /// of its caches, whose requests the client's reflectors may make at any moment.
    pub fn too_many_writes(&self, schedule: Schedule, retry_after: Duration) {
        let mut state = self.state();
        state.too_many_writes.set(schedule);
        state.retry_after = retry_after;
    }

    /// Answer requests of any verb on `schedule` with 500 Internal Server Error (reason
    /// `InternalError`), without sending them.
    pub fn server_errors(&self, schedule: Schedule) {
        self.state().server_errors.set(schedule);
    }

    /// Delay every request by `latency` before it is sent (zero: none, the default).
    pub fn latency(&self, latency: Duration) {
        self.state().latency = latency;
    }

    /// Turn every fault switch off (schedules, latency, held and delayed watches); counters
    /// are kept.
    pub fn clear(&self) {
        {
            let mut state = self.state();
            state.conflicts.set(Schedule::Off);
            state.too_many.set(Schedule::Off);
            state.too_many_writes.set(Schedule::Off);
            state.server_errors.set(Schedule::Off);
            state.latency = Duration::ZERO;
        }
        self.hold_watches(false);
        self.delay_watches(Duration::ZERO);
    }

    /// Deliver every watch event (of open and newly opened watches) `delay` after it reached
    /// the client's connection, in order, as a client of a lagging API server sees them (its
    /// watch cache behind the others' and etcd's: every request other than a watch is
    /// answered at once, and up to date). The delay applies to events that arrive from now
    /// on; those already waiting keep theirs. Zero (the default) ends it. Cutting or expiring a
    /// watch discards its waiting events, as [`Faults::hold_watches`] does.
    pub fn delay_watches(&self, delay: Duration) {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.inner.delay.store(nanos, Ordering::SeqCst);
    }

    /// Hold (`true`) or release (`false`) watch responses: while held, no event of an open or
    /// newly opened watch reaches the client (they wait, unread, in the connection), as on a
    /// stalled link. Releasing delivers them in order, unless the watch was cut or expired
    /// meanwhile, which discards them.
    pub fn hold_watches(&self, hold: bool) {
        self.inner.hold.store(hold, Ordering::SeqCst);
        if !hold {
            for ctl in self.live_watches() {
                ctl.wake();
            }
        }
    }

    /// End every open watch response now, as when the connection closes cleanly (the API
    /// server's watch timeout). kube's watcher then watches again from the last
    /// resourceVersion it saw: no relist. Returns how many watches were cut.
    pub fn cut_watches(&self) -> usize {
        let n = self.order_watches(END);
        self.state().injected.watches_cut += n as u64;
        n
    }

    /// Send every open watch an `ERROR` event with status 410 Gone ([`GONE_EVENT`]) and end
    /// it, as the API server does when the watch's resourceVersion is too old for its watch
    /// cache. kube's watcher (like client-go's reflector) must then relist: a fresh `Init`,
    /// the objects, `InitDone`. Events still held ([`Faults::hold_watches`]) are discarded:
    /// deletions among them are known only from the relist. Returns how many watches.
    pub fn expire_watches(&self) -> usize {
        let n = self.order_watches(EXPIRE);
        self.state().injected.watches_expired += n as u64;
        n
    }

    /// How many watch responses are open (answered and not ended) now.
    pub fn open_watches(&self) -> usize {
        self.live_watches().len()
    }

    /// How many requests the layer saw, by verb, including those it answered itself.
    /// Every verb is present (zero when none was seen).
    pub fn requests(&self) -> BTreeMap<Verb, u64> {
        every_verb(&self.state().requests)
    }

    /// How many requests the layer sent on to the server, by verb: [`Faults::requests`]
    /// minus those answered with an injected error. Every verb is present.
    pub fn sent(&self) -> BTreeMap<Verb, u64> {
        every_verb(&self.state().sent)
    }

    /// How many faults the layer injected so far.
    pub fn injected(&self) -> Injected {
        self.state().injected
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().expect("faults state lock")
    }

    fn live_watches(&self) -> Vec<Arc<WatchCtl>> {
        let mut watches = self.inner.watches.lock().expect("faults watches lock");
        watches.retain(|w| w.upgrade().is_some_and(|c| !c.done.load(Ordering::SeqCst)));
        watches.iter().filter_map(Weak::upgrade).collect()
    }

    fn order_watches(&self, action: u8) -> usize {
        self.live_watches()
            .iter()
            .filter(|ctl| ctl.order(action))
            .count()
    }

    /// Counts a request of `verb` and decides its fate; also returns the latency to add.
    fn decide(&self, verb: Verb) -> (Decision, Duration) {
        let mut state = self.state();
        *state.requests.entry(verb).or_insert(0) += 1;
        let latency = state.latency;
        let decision = if state.too_many.fire() || verb.is_write() && state.too_many_writes.fire() {
            state.injected.too_many_requests += 1;
            Decision::TooManyRequests(state.retry_after.as_secs_f64().ceil() as u64)
        } else if state.server_errors.fire() {
            state.injected.server_errors += 1;
            Decision::ServerError
        } else if verb.is_write() && state.conflicts.fire() {
            state.injected.conflicts += 1;
            Decision::Conflict
        } else {
            *state.sent.entry(verb).or_insert(0) += 1;
            Decision::Forward
        };
        (decision, latency)
    }

    /// Registers a newly answered watch and returns its control, the hold flag and the delay.
    fn open_watch(&self) -> (Arc<WatchCtl>, Arc<AtomicBool>, Arc<AtomicU64>) {
        let ctl = Arc::new(WatchCtl::default());
        let mut watches = self.inner.watches.lock().expect("faults watches lock");
        watches.retain(|w| w.strong_count() > 0);
        watches.push(Arc::downgrade(&ctl));
        (
            ctl,
            Arc::clone(&self.inner.hold),
            Arc::clone(&self.inner.delay),
        )
    }
}

/// `counts` with every verb present.
fn every_verb(counts: &BTreeMap<Verb, u64>) -> BTreeMap<Verb, u64> {
    Verb::ALL
        .iter()
        .map(|v| (*v, counts.get(v).copied().unwrap_or(0)))
        .collect()
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("Faults")
            .field("conflicts", &state.conflicts.schedule)
            .field("too_many_requests", &state.too_many.schedule)
            .field("too_many_writes", &state.too_many_writes.schedule)
            .field("server_errors", &state.server_errors.schedule)
            .field("latency", &state.latency)
            .field("hold_watches", &self.inner.hold.load(Ordering::SeqCst))
            .field(
                "delay_watches",
                &Duration::from_nanos(self.inner.delay.load(Ordering::SeqCst)),
            )
            .field("injected", &state.injected)
            .finish()
    }
}

#[cfg(test)]
mod tests;
