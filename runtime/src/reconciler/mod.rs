//! The reconciler trait: a kind says what it desires and what "ready" means; the runtime's
//! [`Driver`] does the rest of every reconcile.
//!
//! A user implements [`Reconciler`] — usually just [`Reconciler::desired`] (the children, as
//! [`DesiredChildren`]) and, if the children's presence is not enough, [`Reconciler::ready`].
//! The [`Driver`] then runs each reconcile as follows:
//!
//! 1. opens a tracing span `reconcile` with the object, its tenant and the [`Reason`] it runs
//!    for (object changed, child changed, requeue, resync, error), and reads the object again
//!    (one GET) when the version it was given is older than one the driver has written or read
//!    (a watch cache behind: see [`seen`](self) below);
//! 2. with [`Reconciler::FINALIZER`] set: adds the finalizer, and once the object is being
//!    deleted runs [`Reconciler::cleanup`] until it says [`Cleanup::Done`], then marks the
//!    cleanup done in the status and removes it ([`cleanup_guard`] keeps it until then);
//! 3. builds the [`Owner`](crate::apply::Owner) from the derive (`FIELD_MANAGER` and the
//!    tenant rule) and applies the desired children with the apply engine (convergence check
//!    on the server's record, prune, no write when converged), publishing an Event per child
//!    created, recreated, repaired or deleted;
//! 4. writes the status when it changed: `observedGeneration` and the kstatus conditions
//!    (`Ready`/`Reconciling`/`Stalled`) from the [`Outcome`], plus the kind's own fields,
//!    with an Event when `Ready` changes;
//! 5. bounds the whole pass by [`DriverConfig::timeout`];
//! 6. after [`DriverConfig::stalled_after`] failures in a row writes `Stalled` with reason
//!    `ReconcileFailed` and the error (retries go on with backoff; the count it gives doubles,
//!    so a failing object's status is not written at every retry); a
//!    [terminal](ReconcileError::is_terminal) error writes `Stalled` with its own reason at
//!    once and is not retried until the object changes (no retry storm).
//!
//! Stale caches: a pass acts only on the newest version of the object the driver knows of
//! (`seen`: a higher generation is newer; at the same generation only the version the driver
//! last wrote or read is, until its cache shows it), and what a pass created reaches the
//! record in the object's status whatever happens to its status write: a conflict re-reads
//! and applies the pass's creates and prunes to the stored record, a write that finds a newer
//! generation already observed still writes them (`observedGeneration` left alone), and the
//! record never loses an entry but by a prune ([`crate::apply::record`]).
//!
//! ```no_run
//! # use idem_runtime::apply::DesiredChildren;
//! # use idem_runtime::reconciler::{ReconcileError, Reconciler};
//! # use k8s_openapi::api::core::v1::ConfigMap;
//! # type Widget = ConfigMap;
//! # fn desired(_: &Widget) -> Result<DesiredChildren, ReconcileError> { todo!() }
//! // With a derived `Widget` (`#[derive(CustomResource, IdempotentResource)]`):
//! struct Widgets;
//! # /*
//! impl Reconciler for Widgets {
//!     type Resource = Widget;
//!     fn desired(&self, w: &Widget) -> Result<DesiredChildren, ReconcileError> {
//!         desired(w) // the children: namespaces, quotas, role bindings, …
//!     }
//! }
//! # */
//! // Then: Driver::new(client, Widgets).run(controller, shutdown).await
//! ```

mod budget;
mod children;
pub mod cleanup_guard;
mod driver;
pub(crate) mod events;
pub(crate) mod kinds;
mod pass;
mod recorder;
pub mod retention;
mod seen;

use std::future::Future;
use std::time::Duration;

pub use self::children::{Children, STATUS_NOT_DECLARED};
pub use self::driver::{Driver, DriverConfig, RECORD_GRACE};
pub use self::kinds::{
    ChildKinds, ChildWatches, KIND_NOT_DECLARED, WatchChildrenError, children_config,
    primary_config,
};
pub use self::pass::{CREATE_ONCE_WITHOUT_RECORD, Pass};
pub use crate::controller::Reason;

use crate::apply::{ApplyError, CreatedChild, DesiredChildren};
use crate::resource::{IdempotentResource, TenantError};
use crate::status::{Readiness, StatusError};

/// Why a reconcile failed: the one error type of a [`Reconciler`], with conversions from the
/// apply engine's, the status engine's and kube's errors.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Applying or pruning children failed.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// Writing status or finalizers failed.
    #[error(transparent)]
    Status(#[from] StatusError),
    /// The object's tenant could not be found.
    #[error(transparent)]
    Tenant(#[from] TenantError),
    /// Another API call failed.
    #[error("API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// The reconcile did not finish within [`DriverConfig::timeout`].
    #[error("reconcile did not finish within {0:?}")]
    Timeout(Duration),
    /// A failure that retrying cannot fix (e.g. an invalid spec): the object is set `Stalled`
    /// with `reason` and `message` at once and not retried until it changes.
    #[error("{reason}: {message}")]
    Terminal {
        /// CamelCase condition reason, e.g. `InvalidSpec`.
        reason: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// Any other failure of the user's code; retried with backoff.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl ReconcileError {
    /// A [`ReconcileError::Terminal`] error: retrying will not help, the object needs a change.
    pub fn terminal(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Terminal {
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// Whether retrying cannot fix it: [`ReconcileError::Terminal`]; apply errors the
    /// desired state itself causes before any request (a child listed twice, without a name,
    /// not serialisable, or in a scope the owner cannot own: API conventions on ownership); a
    /// deleted create-once child ([`ApplyError::ChildDeleted`]: it needs a restore or an
    /// explicit opt-in to a new value);
    /// a child the API server's validation refuses as 422 Invalid
    /// ([`ApplyError::is_invalid_child`]): the same spec makes the same body, refused again on
    /// every retry; and a status refused alike ([`StatusError::is_invalid_status`]: a condition
    /// these checks refuse, or 422 Invalid on the status write), the object then set `Stalled`
    /// on its stored status. Other errors the API server returns retry with backoff and stall after N
    /// failures — among them denials by admission webhooks and policies, which an admin may
    /// lift, and the 422 the engine meets when a child was replaced since its read.
    pub fn is_terminal(&self) -> bool {
        match self {
            Self::Terminal { .. }
            | Self::Apply(
                ApplyError::Duplicate(_)
                | ApplyError::SameKindName { .. }
                | ApplyError::MissingName { .. }
                | ApplyError::Serialize { .. }
                | ApplyError::InvalidScope { .. }
                | ApplyError::ChildDeleted { .. },
            ) => true,
            Self::Apply(e) => e.is_invalid_child(),
            Self::Status(e) => e.is_invalid_status(),
            _ => false,
        }
    }

    /// The condition reason of a terminal error: its own for [`ReconcileError::Terminal`],
    /// `ChildInvalid` for a child the API server refused as invalid, `ChildDeleted` for a
    /// deleted create-once child, `StatusInvalid` for a refused status, `InvalidDesiredState` for
    /// the other apply errors [`ReconcileError::is_terminal`] names.
    pub fn terminal_reason(&self) -> &str {
        match self {
            Self::Terminal { reason, .. } => reason,
            Self::Apply(e) if e.is_invalid_child() => "ChildInvalid",
            Self::Apply(ApplyError::ChildDeleted { .. }) => "ChildDeleted",
            Self::Status(e) if e.is_invalid_status() => "StatusInvalid",
            _ => "InvalidDesiredState",
        }
    }
}

/// What a reconcile concluded: the readiness for the kstatus conditions, an optional requeue,
/// and the kind's own status fields.
pub struct Outcome<K: IdempotentResource> {
    readiness: Readiness,
    requeue: Option<Duration>,
    fill: Option<StatusFill<K>>,
}

/// Sets a kind's own status fields.
pub(crate) type StatusFill<K> = Box<dyn Fn(&mut <K as IdempotentResource>::Status) + Send + Sync>;

impl<K: IdempotentResource> Outcome<K> {
    /// Conclude with `readiness`; no requeue, no status fields of the kind's own.
    pub fn new(readiness: Readiness) -> Self {
        Self {
            readiness,
            requeue: None,
            fill: None,
        }
    }

    /// Reconcile again after `after` (a poll for what no watch reports); `None` keeps
    /// waiting for a change.
    #[must_use]
    pub fn requeue(mut self, after: impl Into<Option<Duration>>) -> Self {
        self.requeue = after.into();
        self
    }

    /// Also set the kind's own status fields with `fill` (run on the stored status before the
    /// write; again on a conflict's re-read).
    #[must_use]
    pub fn status(mut self, fill: impl Fn(&mut K::Status) + Send + Sync + 'static) -> Self {
        self.fill = Some(Box::new(fill));
        self
    }

    /// The readiness.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }
}

impl<K: IdempotentResource> From<Readiness> for Outcome<K> {
    fn from(readiness: Readiness) -> Self {
        Self::new(readiness)
    }
}

impl<K: IdempotentResource> std::fmt::Debug for Outcome<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcome")
            .field("readiness", &self.readiness)
            .field("requeue", &self.requeue)
            .field("status", &self.fill.is_some())
            .finish()
    }
}

/// What a [`Reconciler::cleanup`] pass concluded.
#[derive(Debug)]
pub enum Cleanup<K: IdempotentResource> {
    /// Finished: the driver removes the finalizer.
    Done,
    /// Not yet (e.g. children still being deleted): write this outcome (its requeue polls).
    Pending(Outcome<K>),
}

/// A kind's reconcile logic; the [`Driver`] runs it (see the [module docs](self)).
///
/// Implement [`Reconciler::desired`] (and [`Reconciler::ready`] when needed); override
/// [`Reconciler::reconcile`] only when the children come in stages (e.g. namespaces first,
/// then what goes in them) or the outcome needs more than the apply report.
pub trait Reconciler: Send + Sync + 'static {
    /// The derived resource kind.
    type Resource: IdempotentResource;

    /// The finalizer the driver adds to every object and removes once [`Reconciler::cleanup`]
    /// is done; `None` (the default): no finalizer, children go with the owner by garbage
    /// collection (their controller ownerReference).
    const FINALIZER: Option<&'static str> = None;

    /// The children `obj` desires (their kinds are pruned of children no longer desired).
    ///
    /// # Errors
    /// A [`ReconcileError`]; [`ReconcileError::terminal`] for a spec that cannot work.
    /// The default says neither this nor [`Reconciler::reconcile`] was implemented.
    fn desired(&self, obj: &Self::Resource) -> Result<DesiredChildren, ReconcileError> {
        let _ = obj;
        Err(ReconcileError::terminal(
            "NotImplemented",
            "the reconciler implements neither desired() nor reconcile()",
        ))
    }

    /// The child kinds, each declared once, e.g.
    /// `ChildKinds::new().owns::<Namespace>().owns_reading_status::<StatefulSet>()`.
    /// Everything about the children follows from it:
    /// [`Controller::for_reconciler`](crate::controller::Controller::for_reconciler) watches
    /// these kinds (by the managed-by label, [`children_config`]) into the driver's child
    /// caches; [`Driver::run`] refuses a controller that does not own one of them; the
    /// kinds declared [`ChildKinds::owns_reading_status`] keep their status in the caches, a
    /// change of it reconciles the owner and [`Children::get`] reads it (reading another
    /// kind's is a terminal error naming this fix); and a pass that desires a child of a kind
    /// not declared here fails at once with a terminal [`KIND_NOT_DECLARED`] error (a child
    /// no watch serves would cost a GET on every pass, and its changes would go unnoticed).
    /// Default: none (a reconciler without children).
    fn children() -> ChildKinds<Self::Resource> {
        ChildKinds::new()
    }

    /// What "ready" means, given the pass's [`Children`]: its apply report and the live
    /// children (status included) of the kinds [`Reconciler::children`] declares reading.
    /// Default: the report's own readiness (`Ready` once every child is applied, `Stalled`
    /// when a child's name is taken, `Reconciling` while a child is being deleted). With the
    /// default [`Reconciler::reconcile`], a `Ready` from here gives way to the report's
    /// readiness when that is not `Ready`, so checking it first (below) is only needed to
    /// skip the reads.
    ///
    /// ```
    /// # use idem_runtime::reconciler::{Children, Outcome, ReconcileError};
    /// # use idem_runtime::status::Readiness;
    /// # use k8s_openapi::api::apps::v1::StatefulSet;
    /// # fn ready(children: &Children<'_>, replicas: i32) -> Result<Readiness, ReconcileError> {
    /// // In `impl Reconciler`, with `ChildKinds::new().owns_reading_status::<StatefulSet>()`:
    /// let applied = children.report().readiness();
    /// if !matches!(applied, Readiness::Ready { .. }) {
    ///     return Ok(applied);
    /// }
    /// let sts = children.get::<StatefulSet>("db")?;
    /// let ready = sts.and_then(|s| s.status).and_then(|s| s.ready_replicas).unwrap_or(0);
    /// let message = format!("{ready}/{replicas} replicas ready");
    /// Ok(if ready >= replicas {
    ///     Readiness::Ready { reason: "Available".into(), message }
    /// } else {
    ///     Readiness::Reconciling { reason: "Progressing".into(), message }
    /// })
    /// # }
    /// ```
    ///
    /// # Errors
    /// A [`ReconcileError`], e.g. from [`Children::get`].
    fn ready(
        &self,
        obj: &Self::Resource,
        children: &Children<'_>,
    ) -> Result<Outcome<Self::Resource>, ReconcileError> {
        let _ = obj;
        Ok(Outcome::new(children.report().readiness()))
    }

    /// One pass: by default apply [`Reconciler::desired`], read the children of the kinds
    /// [`Reconciler::children`] declares reading ([`Pass::children`]) and conclude with
    /// [`Reconciler::ready`].
    ///
    /// # Errors
    /// A [`ReconcileError`]: retried with backoff unless terminal.
    fn reconcile(
        &self,
        obj: &Self::Resource,
        pass: &mut Pass<Self::Resource>,
    ) -> impl Future<Output = Result<Outcome<Self::Resource>, ReconcileError>> + Send {
        async move {
            let desired = self.desired(obj)?;
            let report = pass.apply(&desired).await?;
            let children = pass.children(&desired, &report).await?;
            let mut outcome = self.ready(obj, &children)?;
            // A `ready()` that says Ready while the children are not (a child's name taken by
            // an object that is not ours, one being deleted) does not hide it: the children's
            // own readiness wins.
            let applied = report.readiness();
            if matches!(outcome.readiness, Readiness::Ready { .. })
                && !matches!(applied, Readiness::Ready { .. })
            {
                outcome.readiness = applied;
            }
            Ok(outcome)
        }
    }

    /// The cleanup of an object being deleted, run while it carries
    /// [`Reconciler::FINALIZER`]; the default is done at once.
    ///
    /// # Errors
    /// A [`ReconcileError`]; the finalizer stays and the cleanup is retried.
    fn cleanup(
        &self,
        obj: &Self::Resource,
        pass: &mut Pass<Self::Resource>,
    ) -> impl Future<Output = Result<Cleanup<Self::Resource>, ReconcileError>> + Send {
        let _ = (obj, pass);
        async { Ok(Cleanup::Done) }
    }

    /// The status field that records the children this object's reconciles created (uids from
    /// the creates' answers; see [`crate::apply::record`]): by default the derive's
    /// ([`IdempotentResource::child_record_of`]: `status.created_children`, or `None` for a
    /// kind with `#[idempotent(prune = owner_references)]`). With a record the prune deletes
    /// only recorded children, and the driver keeps the field up to date: it adds what each
    /// pass created (also when the pass fails, with a status write that leaves
    /// `observedGeneration` and conditions alone) and drops what was pruned or is gone.
    /// Without one the prune trusts the controller ownerReference, which anyone who may
    /// create a child kind where the children live can forge, and create-once children are
    /// refused (a deleted one could not be told from one never created). Status is a
    /// subresource, so users who can edit the object cannot edit the record.
    fn child_record(
        status: &mut <Self::Resource as IdempotentResource>::Status,
    ) -> Option<&mut Vec<CreatedChild>> {
        <Self::Resource as IdempotentResource>::child_record_of(status)
    }

    /// The kind's own status fields to write along with `Stalled` when the reconcile failed
    /// (e.g. counts that must not read 0 while children exist); default: none.
    fn failed_status(
        &self,
        obj: &Self::Resource,
        status: &mut <Self::Resource as IdempotentResource>::Status,
    ) {
        let _ = (obj, status);
    }
}
