//! An idempotence test kit: given a reconcile, a primary object and the local control plane,
//! one call checks that the reconcile is safe to repeat, to race, to crash, to run under API
//! faults and against another field manager's edits, and reports each failure with evidence.
//!
//! The guarantees are the three of the project's brief (repeat-, concurrency- and crash-safe)
//! plus three that follow from them on a real API server: convergence under faults
//! (409/429/5xx/latency/cut watches), read-repair of drift made by another field manager
//! (server-side apply), and safety of stale reads (watch events arriving late while the spec
//! flips back and forth). Each is one module: [`Check`] lists them.
//!
//! A [`Subject`] is any code that can reconcile one object with a [`kube::Client`] it is
//! given; for a reconciler run by idem-runtime's `Driver`, [`DriverSubject`] says only the
//! primary object (the session, the reconcile and the children follow from the reconciler's
//! declared child kinds) and [`Kit::driven`] runs it. Every request of the reconcile must go through
//! that client: the kit counts them there (and the API server confirms the count: the client
//! acts as a user of the kit's own, whose requests the server counts under a FlowSchema of
//! their own), aborts the reconcile after the k-th one (crash) and injects faults into it.
//!
//! ```no_run
//! # async fn demo<S: idem_tests::kit::Subject>(subject: S) -> Result<(), idem_tests::kit::Error> {
//! let report = idem_tests::kit::Kit::new(idem_tests::shared(), subject).run_all().await?;
//! report.assert_idempotent();
//! # Ok(()) }
//! ```
//!
//! Each check makes instances of the primary object of its own (fresh names, so that no run
//! inherits another's state) and compares [`EndState`]s anonymised by name, uid and time.

mod crash;
mod driven;
mod faults;
mod harness;
mod identity;
mod once;
mod probe;
mod race;
mod repeat;
mod report;
mod stale;
mod state;
mod tamper;

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::apply::Labels;
use kube::core::ApiResource;
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
pub use tower::BoxError;

pub use driven::{Driven, DriverSession, DriverSubject, Primary, declared_children};
pub use probe::{ABORTED, Sent};
pub use report::{Check, CheckReport, Report};
pub use state::EndState;

use crate::ControlPlane;

/// The code under test: how to make a primary object, which of its children to compare, and
/// how to reconcile it once with a given client.
///
/// The kit calls [`Subject::session`] once per client it makes (a session is what one
/// controller process keeps between reconciles: watch caches, a context) and then
/// [`Subject::reconcile`] for each pass, handing it the primary object as just read from the
/// API server (as a controller's watch cache would). A session must make all its requests,
/// and be ready (caches listed), before `session` returns; its requests are not counted.
/// Requests made during `reconcile` are.
pub trait Subject: Send + Sync {
    /// The primary kind (e.g. `Tenant`).
    type Primary: Resource<DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static;
    /// What the reconciles made with one client share; `()` when nothing.
    type Session: Send + Sync;

    /// A primary object to create, named `name` (the kit sets `metadata.name` to `name`
    /// anyway; set `metadata.namespace` for a namespaced kind).
    fn primary(&self, name: &str) -> Self::Primary;

    /// The children of `primary` the end state includes.
    fn children(&self, primary: &Self::Primary) -> Children;

    /// Prepares a session on `client` (every request of the reconciles goes through it).
    ///
    /// # Errors
    /// Any; the kit reports it as a set-up failure.
    fn session(
        &self,
        client: Client,
    ) -> impl Future<Output = Result<Self::Session, BoxError>> + Send;

    /// Reconciles `primary` once.
    ///
    /// # Errors
    /// Any; the kit retries like a controller would (another pass), and reports an error
    /// that persists.
    fn reconcile(
        &self,
        session: &Self::Session,
        primary: Arc<Self::Primary>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// The names of the labels and the annotation idem stamps on the children of
    /// [`Subject::Primary`] ([`Labels::of`] the kind when it derives `IdempotentResource`, as
    /// [`Driven`] says). Default: idem's operator's ([`Labels::operator`]).
    fn label_names(&self) -> Labels {
        Labels::operator()
    }

    /// Removes from a child (as JSON, after the kit dropped its volatile metadata, status and
    /// idem's own bookkeeping annotation `<prefix>/applied-fingerprint`) what other
    /// controllers change on their own, if anything. Default: nothing. Not for values the
    /// reconcile generates once per instance: declare those with [`Subject::created_once`]
    /// (normalised away, a value a racing reconcile overwrote would go unnoticed).
    fn normalize(&self, _child: &mut Value) {}

    /// The values of `child` (as JSON) that the reconcile generates once, when it creates the
    /// child, and must keep from then on — a generated password, a key pair, a random suffix:
    /// JSON pointers into the child, e.g. `["/data"]` for a Secret whose keys hold generated
    /// values. Default: none.
    ///
    /// They differ between instances by design, so end states of different instances compare
    /// them by presence only (every leaf under a pointer reads `{created once}`; keys are
    /// still compared). Instead, race, crash and faults follow every version of such a child
    /// of their instance (a watch from before their first reconcile): a value that changes
    /// after the child was created fails the check — a reconcile that wrote over the value
    /// another created, or a resume that generated another — and so does the child being
    /// created more than once. Tamper leaves these values alone (a reconcile that creates once
    /// never restores them).
    fn created_once(&self, _child: &Value) -> Vec<String> {
        Vec::new()
    }

    /// Whether `primary` (as read after a pass that wrote nothing) is done, e.g. its `Ready`
    /// condition is true: until then the kit keeps reconciling (a pass every 100 ms, as the
    /// controller would on its children's events or requeue) for up to
    /// [`Options::settle_timeout`]. Default: always done, right only for a subject that
    /// converges in passes that write: one that waits quietly (for a child's deletion, for a
    /// child's status) must say when it is done, or the checks compare it half-way and fail
    /// now and then. A derived resource's subject ([`DriverSubject`]) defaults to its `Ready`
    /// condition at its generation.
    fn settled(&self, _primary: &Self::Primary) -> bool {
        true
    }

    /// `primary` with another spec, one that desires children `primary`'s does not (e.g. one
    /// more item or namespace), for the stale check ([`Check::Stale`]), which flips the spec to
    /// it and straight back. Default `None`: the stale check has nothing to flip and passes
    /// without running (its figure `flips` says so).
    fn flipped(&self, _primary: &Self::Primary) -> Option<Self::Primary> {
        None
    }
}

/// Which objects are the children of an instance: objects of the given kinds that carry the
/// label selector's labels or an ownerReference to the primary object (so that a child that
/// lost its labels still counts, as a duplicate or an orphan).
#[derive(Clone, Debug, Default)]
pub struct Children {
    /// Label selector (`key=value,…`), or `None` to go by ownerReferences alone.
    pub selector: Option<String>,
    /// The child kinds.
    pub kinds: Vec<ApiResource>,
}

impl Children {
    /// Children carrying `selector`'s labels (or owned by the primary object).
    pub fn labelled(selector: impl Into<String>) -> Self {
        Self {
            selector: Some(selector.into()),
            kinds: Vec::new(),
        }
    }

    /// Children that have an ownerReference to the primary object.
    pub fn owned() -> Self {
        Self::default()
    }

    /// Adds child kind `K`.
    #[must_use]
    pub fn kind<K: Resource<DynamicType = ()>>(mut self) -> Self {
        self.kinds.push(ApiResource::erase::<K>(&()));
        self
    }
}

/// Tuning of a kit run; [`Options::default`] is what the issue specifies.
#[derive(Clone, Debug)]
pub struct Options {
    /// Reconciles started at once by the race check (default 4; at least 2 are).
    pub racers: usize,
    /// Passes a convergence may take before the kit calls it a failure (default 10).
    pub max_passes: usize,
    /// Longest a single pass may take (default 60 s); a slower pass is a failure.
    pub pass_timeout: Duration,
    /// How long the tamper check reconciles again before calling a field not restored
    /// (default 10 s: caches may take a moment to see the change).
    pub repair_timeout: Duration,
    /// At most this many crash points (default `None`: every request of a clean convergence).
    pub crash_points: Option<usize>,
    /// Request budget under faults, relative to the fault-free count (default 1.2); each
    /// injected fault (409, 429, 500, cut or expired watch) may also cost one request (its
    /// retry): the budget is the larger of `fault_budget ×` the fault-free count and that
    /// count plus the faults injected.
    pub fault_budget: f64,
    /// A check stops listing failures after this many (default 5).
    pub max_failures: usize,
    /// How long a convergence may wait for [`Subject::settled`] (default 60 s); passes that
    /// write nothing and leave the primary with the same `Stalled` condition for its
    /// generation for 10 s end the wait sooner (it fails, naming the condition).
    pub settle_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            racers: 4,
            max_passes: 10,
            pass_timeout: Duration::from_secs(60),
            repair_timeout: Duration::from_secs(10),
            crash_points: None,
            fault_budget: 1.2,
            max_failures: 5,
            settle_timeout: Duration::from_secs(60),
        }
    }
}

/// Errors that keep the kit from judging the subject at all (its findings are in [`Report`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Setting up (user, FlowSchema, clients) or reading the cluster failed.
    #[error("the idem test kit could not run: {0}")]
    Setup(String),
}

/// Runs the checks on one [`Subject`] against one control plane.
pub struct Kit<'a, S> {
    cp: &'a ControlPlane,
    subject: S,
    options: Options,
    checks: Vec<Check>,
}

impl<'a, S: DriverSubject> Kit<'a, Driven<S>>
where
    <Primary<S> as Resource>::Scope: idem_runtime::apply::ChildScope,
{
    /// A kit for the [`Driver`](idem_runtime::reconciler::Driver)-based `subject` on `cp`
    /// ([`Driven`]).
    pub fn driven(cp: &'a ControlPlane, subject: S) -> Self {
        Self::new(cp, Driven(subject))
    }
}

impl<'a, S: Subject> Kit<'a, S> {
    /// A kit for `subject` on `cp`, with [`Options::default`] and every [`Check`].
    pub fn new(cp: &'a ControlPlane, subject: S) -> Self {
        Self {
            cp,
            subject,
            options: Options::default(),
            checks: Check::ALL.to_vec(),
        }
    }

    /// Replaces the options.
    #[must_use]
    pub fn options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    /// Runs only `checks` (in [`Check::ALL`] order).
    #[must_use]
    pub fn checks(mut self, checks: &[Check]) -> Self {
        self.checks = Check::ALL
            .into_iter()
            .filter(|c| checks.contains(c))
            .collect();
        self
    }

    /// Runs the selected checks (all by default) and reports each.
    ///
    /// First converges one instance from scratch with a clean client (the reference every
    /// check compares with); when it does not converge, or its reconcile made no request
    /// through the kit's client, that is the report's [`Report::cause`] and no check runs.
    ///
    /// # Errors
    /// [`Error::Setup`] when the kit cannot set itself up or read the cluster.
    pub async fn run_all(&self) -> Result<Report, Error> {
        let start = Instant::now();
        let h = harness::Harness::new(self.cp, &self.subject, &self.options).await?;
        let result = self.run_checks(&h).await;
        h.cleanup().await;
        let mut report = result?;
        report.elapsed = start.elapsed();
        Ok(report)
    }

    async fn run_checks(&self, h: &harness::Harness<'_, S>) -> Result<Report, Error> {
        let mut report = Report::default();
        let reference = h.reference().await?;
        if let Err(why) = &reference {
            report.cause = Some(why.clone());
        }
        for &check in &self.checks {
            let start = Instant::now();
            let mut r = report::CheckReport::new(check);
            match &reference {
                Err(_) => {
                    r.ran = false;
                    r.passed = false;
                }
                Ok(reference) => match check {
                    Check::Repeat => repeat::run(h, reference, &mut r).await?,
                    Check::Race => race::run(h, reference, &mut r).await?,
                    Check::Crash => crash::run(h, reference, &mut r).await?,
                    Check::Faults => faults::run(h, reference, &mut r).await?,
                    Check::Tamper => tamper::run(h, reference, &mut r).await?,
                    Check::Stale => stale::run(h, reference, &mut r).await?,
                },
            }
            r.elapsed = start.elapsed();
            report.checks.push(r);
        }
        Ok(report)
    }
}
