//! The driver: runs a [`Reconciler`] for each reconcile the controller hands out, or once for
//! a given object and client (for tests and test kits).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::Reporter;

use super::recorder::Recorder;
use kube::{Client, Resource, ResourceExt};
use tracing::Instrument;

use super::events::{Allowance, Publisher};
use super::seen::{Freshness, Seen};
use super::{
    ChildKinds, ChildWatches, Cleanup, Outcome, Pass, Reason, ReconcileError, Reconciler,
    WatchChildrenError,
};
use crate::apply::{Applier, ChildCaches, ChildScope, DriftMetrics};
use crate::controller::blocked::BLOCKED_POLL;
use crate::controller::mapping::key_of;
use crate::controller::{
    Action, Attempt, BlockedWatches, Controller, ControllerError, NamespaceTenants,
};
use crate::key::{ObjectKey, TenantKey};
use crate::queue::ShutdownReport;
use crate::resource::IdempotentResource;
use crate::status::{MAX_MESSAGE_BYTES, Readiness, StatusOutcome, StatusWriter, shorten};
use kube::core::ApiResource;

/// How long after [`DriverConfig::timeout`] a pass may still take to record the children its
/// cut-off reconcile created or pruned and to write its status, before it is cancelled whole.
pub const RECORD_GRACE: Duration = Duration::from_secs(10);

/// `work`, ended with [`ReconcileError::Timeout`] at `deadline` when it has one.
async fn until<T>(
    deadline: Option<(tokio::time::Instant, Duration)>,
    work: impl Future<Output = Result<T, ReconcileError>>,
) -> Result<T, ReconcileError> {
    match deadline {
        // Past already (a zero timeout): not started at all, as a whole pass cut at once was.
        Some((at, limit)) if tokio::time::Instant::now() >= at => {
            Err(ReconcileError::Timeout(limit))
        }
        Some((at, limit)) => tokio::time::timeout_at(at, work)
            .await
            .unwrap_or(Err(ReconcileError::Timeout(limit))),
        None => work.await,
    }
}

/// Tunables of a [`Driver`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverConfig {
    /// Consecutive failed reconciles of one object that make it `Stalled` with reason
    /// `ReconcileFailed` (retries go on at the backoff cap; kstatus: Stalled means it needs
    /// help). Default 5.
    pub stalled_after: u32,
    /// Bound on one reconcile pass's reconcile or cleanup; past it that is cancelled (every
    /// write is idempotent, the next pass completes the work) and the pass counts as a
    /// failure with [`ReconcileError::Timeout`], once it has recorded the children the cut-off
    /// part created or pruned ([`RECORD_GRACE`] more at most for that and the status).
    /// `None`: unbounded. Default 2 minutes.
    pub timeout: Option<Duration>,
    /// Events about one object published at once before its budget holds more back (a token
    /// bucket per object, as client-go's Event spam filter): what an owner does to its children
    /// (each repair, deletion or claimant is an Event) cannot have the controller write Events
    /// without bound. The next Event published says how many were held back. 0: none is
    /// published. Default 25.
    pub events_burst: u32,
    /// After the burst, one more Event per object each `events_every`. Zero: no budget, every
    /// Event is published. Default 5 minutes.
    pub events_every: Duration,
    /// Events about the objects of one tenant (the tenant of the reconcile that publishes
    /// them) published at once before its budget holds more back, whatever each object's
    /// budget has left: a tenant with many objects cannot have the controller write Events
    /// without bound either. 0: none is published. Default 500.
    pub tenant_events_burst: u32,
    /// After the tenant's burst, one more Event of the tenant each `tenant_events_every`.
    /// Zero: no tenant budget. Default 1 second.
    pub tenant_events_every: Duration,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            stalled_after: 5,
            timeout: Some(Duration::from_secs(120)),
            events_burst: 25,
            events_every: Duration::from_secs(300),
            tenant_events_burst: 500,
            tenant_events_every: Duration::from_secs(1),
        }
    }
}

/// Runs a [`Reconciler`]: see the [module docs](super) for what each reconcile does.
pub struct Driver<R: Reconciler> {
    reconciler: R,
    client: Client,
    caches: ChildCaches,
    drift: Option<DriftMetrics>,
    reporter: Option<Reporter>,
    recorder: Option<Publisher>,
    config: DriverConfig,
    /// The watches of blocking objects of the controller this driver runs, once it runs.
    blocked: Option<BlockedWatches>,
    /// What each owner's passes last reported as `NotPruned`.
    noticed: Arc<super::events::Noticed>,
    /// The controller's namespace tenants, once it runs (a `namespace_label` rule).
    namespaces: Option<NamespaceTenants>,
    /// The newest version of each object seen or written, see [`super::seen`].
    seen: Arc<Seen>,
    /// The child kinds the reconciler declares ([`Reconciler::children`]).
    kinds: ChildKinds<K<R>>,
}

type K<R> = <R as Reconciler>::Resource;

impl<R> Driver<R>
where
    R: Reconciler,
    <K<R> as Resource>::Scope: ChildScope,
{
    /// A driver of `reconciler` using `client`; Events are published as reporter
    /// `FIELD_MANAGER` (change it with [`Driver::with_reporter`]).
    pub fn new(client: Client, reconciler: R) -> Self {
        // The kind's label names are known to the child caches from now on (they keep these
        // labels of the objects they list, see `crate::cache`), before any watch starts.
        let _ = crate::apply::Labels::of::<K<R>>();
        let reporter = Reporter {
            controller: K::<R>::FIELD_MANAGER.into(),
            instance: None,
        };
        let config = DriverConfig::default();
        Self {
            recorder: Some(Self::publisher(&client, reporter.clone(), &config)),
            reporter: Some(reporter),
            reconciler,
            client,
            caches: ChildCaches::new(),
            drift: None,
            config,
            blocked: None,
            noticed: Arc::default(),
            namespaces: None,
            seen: Arc::default(),
            kinds: R::children(),
        }
    }

    /// Publish Events as `reporter` (e.g. with the pod name as `instance`).
    #[must_use]
    pub fn with_reporter(mut self, reporter: Reporter) -> Self {
        self.recorder = Some(Self::publisher(
            &self.client,
            reporter.clone(),
            &self.config,
        ));
        self.reporter = Some(reporter);
        self
    }

    /// A publisher with `client` as `reporter`, with the Event budget `config` sets.
    fn publisher(client: &Client, reporter: Reporter, config: &DriverConfig) -> Publisher {
        let object = Allowance {
            burst: config.events_burst,
            every: config.events_every,
        };
        let tenant = Allowance {
            burst: config.tenant_events_burst,
            every: config.tenant_events_every,
        };
        Publisher::new(Recorder::new(client.clone(), reporter), object, tenant)
    }

    /// Publish no Events.
    #[must_use]
    pub fn without_events(mut self) -> Self {
        self.recorder = None;
        self.reporter = None;
        self
    }

    /// Read children from `caches` (shared with other controllers) instead of a new set.
    #[must_use]
    pub fn with_caches(mut self, caches: ChildCaches) -> Self {
        self.caches = caches;
        self
    }

    /// Count repaired drift in `drift`.
    #[must_use]
    pub fn with_drift_metrics(mut self, drift: DriftMetrics) -> Self {
        self.drift = Some(drift);
        self
    }

    /// Replace the tunables.
    #[must_use]
    pub fn with_config(mut self, config: DriverConfig) -> Self {
        self.config = config;
        if let Some(reporter) = self.reporter.clone() {
            self.recorder = Some(Self::publisher(&self.client, reporter, &self.config));
        }
        self
    }

    /// The watch configuration for the children of this kind
    /// ([`super::children_config`]): only objects labelled
    /// `app.kubernetes.io/managed-by=<FIELD_MANAGER>`, which the apply engine puts on every
    /// child, so a controller does not cache every Namespace or RoleBinding of the cluster.
    pub fn children_config() -> kube::runtime::watcher::Config {
        super::children_config::<K<R>>()
    }

    /// Watches every child kind [`Reconciler::children`] declares (selected by
    /// [`Driver::children_config`]) into this driver's caches, for passes run without a
    /// controller ([`Driver::reconcile_once`], e.g. a test kit's); returns once each is listed.
    /// The watches end when the returned [`ChildWatches`] is dropped.
    ///
    /// # Errors
    /// [`WatchChildrenError`] when a watch ended before its first list.
    ///
    /// # Cancel safety
    /// Cancel safe: the watches started so far end when the future is dropped.
    pub async fn watch_children(&self) -> Result<ChildWatches, WatchChildrenError> {
        self.kinds
            .cache_all(&self.client, &Self::children_config(), &self.caches)
            .await
    }

    /// The reconciler.
    pub fn reconciler(&self) -> &R {
        &self.reconciler
    }

    /// The child caches the driver's passes read (filled by a running controller).
    pub fn caches(&self) -> &ChildCaches {
        &self.caches
    }

    /// Runs `controller` with this driver until `shutdown` resolves (the controller gets the
    /// driver's child caches and, when the kind keeps a record of the children it created
    /// ([`Reconciler::child_record`]), those records: then only recorded children, and those
    /// this process wrote, are cached whole, see [`Controller::with_child_records`]; the
    /// objects each pass finds in a child's way are watched by the controller, see
    /// [`crate::controller::blocked`]; the child kinds [`Reconciler::children`] declares
    /// reading are cached with their status, and a change of it reconciles the owner); see
    /// [`Controller::run`]. Build the controller with [`Controller::for_reconciler`] so that
    /// it owns every declared kind.
    ///
    /// # Errors
    /// [`ControllerError`] when the controller's configuration is invalid, and
    /// [`ControllerError::KindNotOwned`] when [`Reconciler::children`] declares a kind the
    /// controller does not own.
    pub async fn run(
        mut self,
        controller: Controller<K<R>>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<ShutdownReport, ControllerError> {
        let caches = self.caches.clone();
        // Known before the child watches start: what this manager owns of a child is idem's
        // (the bound on what a child may cost the caches, the changes worth a reconcile).
        caches.note_manager(K::<R>::FIELD_MANAGER);
        self.blocked = Some(controller.blocked_watches());
        self.namespaces = controller.namespace_tenants();
        let mut controller = controller
            .with_child_caches(caches)
            .declared(&self.kinds.set(), self.kinds.status_set())?;
        let mut blank = <K<R> as IdempotentResource>::Status::default();
        if R::child_record(&mut blank).is_some() {
            controller = controller.with_child_records(|obj: &K<R>| {
                Self::record_of(obj)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| c.uid)
                    .collect()
            });
        }
        controller
            .run(Self::reconcile, Arc::new(self), shutdown)
            .await
    }

    /// The reconcile function for [`Controller::run`] with the driver as its context.
    ///
    /// # Errors
    /// The pass's [`ReconcileError`] unless it was terminal (then `Stalled` is written and
    /// `Ok(Action::terminal())` returned: counted as a terminal error, not retried).
    pub async fn reconcile(
        obj: Arc<K<R>>,
        driver: Arc<Self>,
        attempt: Attempt,
    ) -> Result<Action, ReconcileError> {
        let client = driver.client.clone();
        let recorder = driver.recorder.clone();
        let tenant = Some(attempt.tenant.to_string());
        driver
            .drive(
                client,
                recorder,
                obj,
                attempt.failures,
                attempt.reason,
                tenant,
            )
            .await
    }

    /// Runs ONE reconcile of `obj` with `client` (every request of the pass goes through it;
    /// children are read from [`Driver::caches`] when a controller fills them, else from the
    /// API server), as a first attempt (no failures before), reason
    /// [`Reason::ObjectChanged`]. For tests and test kits: what the controller would do with
    /// this object, without a controller.
    ///
    /// # Errors
    /// As [`Driver::reconcile`].
    pub async fn reconcile_once(
        &self,
        client: Client,
        obj: Arc<K<R>>,
    ) -> Result<Action, ReconcileError> {
        // This client's recorder (a memory of series of its own: Events of one call never
        // count up those of another), with the driver's Event budget.
        let recorder =
            (self.recorder.as_ref())
                .zip(self.reporter.clone())
                .map(|(publisher, reporter)| {
                    publisher.with_recorder(Recorder::new(client.clone(), reporter))
                });
        self.drive(client, recorder, obj, 0, Reason::ObjectChanged, None)
            .await
    }

    async fn drive(
        &self,
        client: Client,
        recorder: Option<Publisher>,
        obj: Arc<K<R>>,
        failures: u32,
        reason: Reason,
        queued_as: Option<String>,
    ) -> Result<Action, ReconcileError> {
        // The tenant the controller queued the key under; else what the derive's rule says.
        let tenant = queued_as.unwrap_or_else(|| match obj.tenant() {
            Ok(crate::resource::TenantRef::Known(key)) => key.to_string(),
            Ok(crate::resource::TenantRef::NamespaceLabel { namespace, .. }) => {
                format!("(label of namespace {namespace})")
            }
            Err(_) => String::new(),
        });
        let object = match obj.namespace() {
            Some(ns) => format!("{}/{ns}/{}", K::<R>::kind(&()), obj.name_any()),
            None => format!("{}/{}", K::<R>::kind(&()), obj.name_any()),
        };
        let span = tracing::info_span!("reconcile", %object, %tenant, %reason);
        async move {
            let obj = match self.seen.given(obj.as_ref(), Self::record_print(&obj)) {
                Freshness::Current => obj,
                Freshness::Stale => match self.read_again(&client, &obj).await? {
                    Some(fresh) => fresh,
                    // Gone, or replaced by another object of that name (its own events follow).
                    None => return Ok(Action::await_change()),
                },
            };
            // The reconciler's part of the pass ends at the deadline; what follows it (the
            // record of the children it created or pruned, the status) gets
            // `RECORD_GRACE` more, so a pass cut off still records what it did.
            let deadline = self
                .config
                .timeout
                .map(|limit| (tokio::time::Instant::now() + limit, limit));
            let pass = self.pass(
                client.clone(),
                recorder.clone(),
                Arc::clone(&obj),
                reason,
                &tenant,
                deadline,
            );
            let result = match deadline {
                Some((at, limit)) => tokio::time::timeout_at(at + RECORD_GRACE, pass)
                    .await
                    .unwrap_or(Err(ReconcileError::Timeout(limit))),
                None => pass.await,
            };
            let error = match result {
                Ok(action) => return Ok(action),
                Err(e) => e,
            };
            let writer = Self::writer(&client, &obj);
            if error.is_terminal() {
                // One line: a server's message may hold several causes. A terminal error of
                // the reconciler's own gives its reason to the condition's reason, not again
                // at the head of its message.
                let message = match &error {
                    ReconcileError::Terminal { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                let mut message = message.replace(['\n', '\r'], " ");
                if matches!(&error, ReconcileError::Apply(e) if e.is_invalid_child())
                    || matches!(&error, ReconcileError::Status(e) if e.is_invalid_status())
                {
                    message.push_str("; not retried until the object changes");
                }
                let readiness = Readiness::Stalled {
                    reason: error.terminal_reason().to_owned(),
                    message: shorten(&message, MAX_MESSAGE_BYTES),
                };
                let written = self
                    .write_status_with(&writer, recorder.as_ref(), &obj, &readiness, &|_| {})
                    .await?;
                // Said once, when it becomes the status; a resync that meets it again (the
                // object unchanged) is not news.
                if matches!(written, StatusOutcome::Unchanged) {
                    tracing::debug!(%error, "terminal reconcile error, already the status");
                } else {
                    tracing::warn!(%error, "terminal reconcile error: stalled until the object changes");
                }
                return Ok(Action::terminal());
            }
            let failures = failures + 1;
            if failures >= self.config.stalled_after {
                let message = format!(
                    "{} or more reconciles failed in a row; retrying: {error}",
                    failures_said(failures, self.config.stalled_after)
                );
                let readiness = Readiness::Stalled {
                    reason: "ReconcileFailed".into(),
                    message: shorten(&message, MAX_MESSAGE_BYTES),
                };
                let this = Arc::clone(&obj);
                let reconciler = &self.reconciler;
                let fill = move |status: &mut <K<R> as IdempotentResource>::Status| {
                    reconciler.failed_status(&this, status);
                };
                if let Err(e) = self
                    .write_status_with(&writer, recorder.as_ref(), &obj, &readiness, &fill)
                    .await
                {
                    tracing::warn!(error = %e, "could not write the Stalled status");
                }
            }
            Err(error)
        }
        .instrument(span)
        .await
    }

    /// `obj` as the API server has it now (`None`: gone, or another object of its name): the
    /// version a pass was given is older than one this driver wrote or read.
    async fn read_again(
        &self,
        client: &Client,
        obj: &K<R>,
    ) -> Result<Option<Arc<K<R>>>, ReconcileError> {
        tracing::debug!(
            resource_version = ?obj.meta().resource_version,
            "the cached object is older than one this driver wrote or read: reading it again"
        );
        let api = <<K<R> as Resource>::Scope as ChildScope>::api::<K<R>>(
            client.clone(),
            obj.namespace().as_deref(),
        );
        let fresh = api.get_opt(&obj.name_any()).await?;
        let uid = obj.meta().uid.clone();
        match fresh {
            Some(fresh) if fresh.meta().uid == uid => {
                self.seen.stored(&fresh, Self::record_print(&fresh));
                Ok(Some(Arc::new(fresh)))
            }
            _ => {
                if let Some(uid) = uid {
                    self.seen.forget(&uid);
                }
                Ok(None)
            }
        }
    }

    /// The status writer of `obj`'s kind, in its namespace when namespaced.
    fn writer(client: &Client, obj: &K<R>) -> StatusWriter<K<R>> {
        StatusWriter::new(<<K<R> as Resource>::Scope as ChildScope>::api::<K<R>>(
            client.clone(),
            obj.namespace().as_deref(),
        ))
    }

    /// One pass: finalizer, cleanup or reconcile, status.
    async fn pass(
        &self,
        client: Client,
        recorder: Option<Publisher>,
        obj: Arc<K<R>>,
        reason: Reason,
        tenant: &str,
        deadline: Option<(tokio::time::Instant, Duration)>,
    ) -> Result<Action, ReconcileError> {
        let mut applier = Applier::new(client.clone()).with_caches(self.caches.clone());
        if let Some(drift) = &self.drift {
            applier = applier.with_metrics(drift.clone());
        }
        let writer = Self::writer(&client, &obj);
        let record = Self::record_of(&obj);
        if obj.meta().deletion_timestamp.is_some() {
            let Some(finalizer) = R::FINALIZER else {
                // Children carry a controller ownerReference: the garbage collector deletes them.
                return Ok(Action::await_change());
            };
            if !obj.finalizers().iter().any(|f| f == finalizer) {
                return Ok(Action::await_change());
            }
            let mut pass = Pass::new(
                Arc::clone(&obj),
                client,
                applier,
                recorder,
                reason,
                record,
                Arc::clone(&self.noticed),
            )
            .with_namespaces(self.namespaces.clone())
            .declaring(&self.kinds);
            // Boxed: a reconciler's future is large, and the driver's would hold it inline.
            let cleanup = until(deadline, Box::pin(self.reconciler.cleanup(&obj, &mut pass))).await;
            let cleanup = self
                .keep_record_on_error(&writer, &obj, &pass, cleanup)
                .await?;
            return match cleanup {
                Cleanup::Done => {
                    self.watch_blocking(&obj, &[], tenant);
                    let marked = self.mark_cleanup_done(&writer, &obj, finalizer).await?;
                    writer
                        .remove_finalizer(marked.as_ref().unwrap_or(&obj), finalizer)
                        .await?;
                    if let Some(uid) = &obj.meta().uid {
                        self.seen.forget(uid);
                    }
                    Ok(Action::await_change())
                }
                Cleanup::Pending(outcome) => {
                    let outcome = self.watch_blocking_of(&obj, &pass, tenant, outcome);
                    self.conclude(&writer, &pass, &obj, outcome).await
                }
            };
        }
        let obj = match R::FINALIZER {
            Some(finalizer) => match writer.add_finalizer(&obj, finalizer).await? {
                Some(updated) => {
                    self.seen.stored(&updated, Self::record_print(&updated));
                    Arc::new(updated)
                }
                None => obj,
            },
            None => obj,
        };
        let mut pass = Pass::new(
            Arc::clone(&obj),
            client,
            applier,
            recorder,
            reason,
            record,
            Arc::clone(&self.noticed),
        )
        .with_namespaces(self.namespaces.clone())
        .declaring(&self.kinds);
        // Boxed: a reconciler's future is large, and the driver's would hold it inline.
        let outcome = until(
            deadline,
            Box::pin(self.reconciler.reconcile(&obj, &mut pass)),
        )
        .await;
        let outcome = self
            .keep_record_on_error(&writer, &obj, &pass, outcome)
            .await?;
        let outcome = self.watch_blocking_of(&obj, &pass, tenant, outcome);
        self.conclude(&writer, &pass, &obj, outcome).await
    }

    /// Watches the objects `pass` found in a child's way (and ends the watches of those it no
    /// longer found), charged to the pass's tenant (else `queued_as`); polls the object every
    /// [`BLOCKED_POLL`] when one cannot be watched (over a limit), or when a child being
    /// deleted was left unrepaired ([`Pass::unrepaired`]).
    fn watch_blocking_of(
        &self,
        obj: &K<R>,
        pass: &Pass<K<R>>,
        queued_as: &str,
        mut outcome: Outcome<K<R>>,
    ) -> Outcome<K<R>> {
        let tenant = pass
            .tenant()
            .cloned()
            .unwrap_or_else(|| TenantKey::new(queued_as));
        // Polled too: a child being deleted whose repair the server refused (the refusal may
        // end with no event of any object watched).
        if !self.watch_blocking_as(obj, pass.blocking(), &tenant) || pass.unrepaired() {
            outcome.requeue = Some(
                outcome
                    .requeue
                    .map_or(BLOCKED_POLL, |r| r.min(BLOCKED_POLL)),
            );
        }
        outcome
    }

    /// Ends `obj`'s watches of blocking objects (it is gone, or blocked by none).
    fn watch_blocking(&self, obj: &K<R>, blocking: &[(ApiResource, ObjectKey)], tenant: &str) {
        self.watch_blocking_as(obj, blocking, &TenantKey::new(tenant));
    }

    /// [`BlockedWatches::set`] for `obj`; `true` without a controller (nothing to watch with,
    /// e.g. [`Driver::reconcile_once`]).
    fn watch_blocking_as(
        &self,
        obj: &K<R>,
        blocking: &[(ApiResource, ObjectKey)],
        tenant: &TenantKey,
    ) -> bool {
        match &self.blocked {
            Some(blocked) => blocked.set(&key_of(obj), tenant, blocking),
            None => true,
        }
    }

    /// The object's record of the children it created, when its kind keeps one
    /// ([`Reconciler::child_record`]); empty when its status has none yet.
    /// A fingerprint of `obj`'s record of created children, for [`super::seen`].
    fn record_print(obj: &K<R>) -> u64 {
        let record = Self::record_of(obj).unwrap_or_default();
        let value = serde_json::to_value(&record).unwrap_or_default();
        crate::compare::fingerprint(&value).0
    }

    fn record_of(obj: &K<R>) -> Option<Vec<crate::apply::CreatedChild>> {
        let mut status = obj.status().cloned().unwrap_or_default();
        R::child_record(&mut status).map(|r| r.clone())
    }

    /// On a failed pass, writes what it created into the record (only that field; a lost
    /// entry would make the child unprunable for good), then passes the result on.
    async fn keep_record_on_error<T>(
        &self,
        writer: &StatusWriter<K<R>>,
        obj: &K<R>,
        pass: &Pass<K<R>>,
        result: Result<T, ReconcileError>,
    ) -> Result<T, ReconcileError> {
        if result.is_ok() {
            return result;
        }
        // With what an apply cut off by the timeout had done.
        let delta = pass.unfinished_delta();
        if delta.is_empty() {
            return result;
        }
        self.write_record(writer, obj, &delta).await;
        result
    }

    /// Writes `delta` into the record as stored (only that field, `observedGeneration` left
    /// alone); a failure is logged.
    async fn write_record(
        &self,
        writer: &StatusWriter<K<R>>,
        obj: &K<R>,
        delta: &crate::apply::RecordDelta,
    ) {
        let written = writer
            .write_fields(obj, |_, draft| {
                if let Some(record) = R::child_record(draft.status_mut()) {
                    delta.apply_to(record);
                }
            })
            .await;
        match written {
            Ok(StatusOutcome::Written(stored)) => {
                self.seen
                    .stored(stored.as_ref(), Self::record_print(stored.as_ref()));
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not record the children this reconcile created or pruned");
            }
        }
    }

    /// Writes the mark [`cleanup_guard`](super::cleanup_guard) waits for before `finalizer`
    /// may go: `Reconciling` (and `Ready` `False`) with reason
    /// [`CLEANUP_DONE`](super::cleanup_guard::CLEANUP_DONE), leaving `observedGeneration` and
    /// the record alone. No Event: the object is about to go. Returns the object as stored
    /// after the write, `None` when the mark was already there.
    async fn mark_cleanup_done(
        &self,
        writer: &StatusWriter<K<R>>,
        obj: &K<R>,
        finalizer: &str,
    ) -> Result<Option<K<R>>, ReconcileError> {
        let done = Readiness::Reconciling {
            reason: super::cleanup_guard::CLEANUP_DONE.to_owned(),
            message: format!("the cleanup is done; the finalizer {finalizer} is removed next"),
        };
        Ok(
            match writer
                .write_fields(obj, |_, draft| {
                    draft.set_readiness(&done);
                })
                .await?
            {
                StatusOutcome::Written(stored) => {
                    self.seen
                        .stored(stored.as_ref(), Self::record_print(&stored));
                    Some(*stored)
                }
                StatusOutcome::Unchanged | StatusOutcome::Superseded => None,
            },
        )
    }

    async fn conclude(
        &self,
        writer: &StatusWriter<K<R>>,
        pass: &Pass<K<R>>,
        obj: &K<R>,
        outcome: Outcome<K<R>>,
    ) -> Result<Action, ReconcileError> {
        let fill = outcome.fill.unwrap_or_else(|| Box::new(|_| {}));
        let delta = pass.record_delta();
        let fill_and_record = |status: &mut <K<R> as IdempotentResource>::Status| {
            fill(status);
            if let Some(record) = R::child_record(status) {
                delta.apply_to(record);
            }
        };
        let written = self
            .write_status_with(
                writer,
                pass.recorder(),
                obj,
                &outcome.readiness,
                &fill_and_record,
            )
            .await?;
        if matches!(written, StatusOutcome::Superseded) && !delta.is_empty() {
            // A newer generation's status is stored (a pass of it ran meanwhile): this pass's
            // status is not written, but what it created and pruned must reach the record.
            self.write_record(writer, obj, delta).await;
        }
        Ok(match outcome.requeue {
            Some(after) => Action::requeue(after),
            None => Action::await_change(),
        })
    }

    /// Writes `readiness` (and `fill`'s fields) if the status changed; an Event when `Ready`
    /// changes.
    async fn write_status_with(
        &self,
        writer: &StatusWriter<K<R>>,
        recorder: Option<&Publisher>,
        obj: &K<R>,
        readiness: &Readiness,
        fill: &(dyn Fn(&mut <K<R> as IdempotentResource>::Status) + Send + Sync),
    ) -> Result<StatusOutcome<K<R>>, ReconcileError> {
        let previous = obj.status().and_then(|s| {
            K::<R>::conditions_of(s)
                .iter()
                .find(|c| c.type_ == "Ready")
                .cloned()
        });
        let written = writer
            .write(obj, |_, draft| {
                fill(draft.status_mut());
                draft.set_readiness(readiness);
            })
            .await?;
        if let StatusOutcome::Written(stored) = &written {
            self.seen
                .stored(stored.as_ref(), Self::record_print(stored.as_ref()));
        }
        if let Some(recorder) = recorder {
            super::events::readiness(recorder, &obj.object_ref(&()), previous.as_ref(), readiness)
                .await;
        }
        Ok(written)
    }
}

/// The count of failures in a row that a `ReconcileFailed` message gives: `stalled_after`
/// doubled as often as `failures` allows. It changes at 5, 10, 20, 40… failures, so a failing
/// object's status is written again only then (or when the error or the generation changes):
/// a handful of writes a day at the backoff cap, not one per retry.
fn failures_said(failures: u32, stalled_after: u32) -> u32 {
    let mut said = stalled_after.max(1);
    while let Some(next) = said.checked_mul(2)
        && next <= failures
    {
        said = next;
    }
    said
}

#[cfg(test)]
mod tests {
    use super::failures_said;

    #[test]
    fn the_failure_count_said_doubles() {
        let said: Vec<u32> = [5, 6, 9, 10, 19, 20, 40, 1_000]
            .map(|f| failures_said(f, 5))
            .into();
        assert_eq!(said, [5, 5, 5, 10, 10, 20, 40, 640]);
        assert_eq!(failures_said(u32::MAX, 5), 5 << 29);
    }
}
