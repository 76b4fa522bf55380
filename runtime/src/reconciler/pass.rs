//! One reconcile pass of one object: the client, the apply engine and the Event recorder it
//! uses, and the owner its children are applied under.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use kube::Client;
use kube::runtime::events::Event;

use super::events::Publisher;
use super::{ChildKinds, Children, KIND_NOT_DECLARED, Reason, ReconcileError};
use crate::apply::{
    Applier, ApplyReport, ChildCaches, CreatedChild, DesiredChildren, Owner, RecordDelta,
};
use crate::controller::KindSet;
use crate::controller::NamespaceTenants;
use crate::key::{ObjectKey, TenantKey};
use crate::resource::{IdempotentResource, TenantRef};
use kube::core::ApiResource;

/// The condition reason of a pass that desires a create-once child for a kind that keeps no
/// record of the children it created.
pub const CREATE_ONCE_WITHOUT_RECORD: &str = "CreateOnceWithoutRecord";

/// The key under which [`super::events::Noticed`] remembers the undeclared children told of
/// (not a kind name: no kind is called so).
const UNDECLARED_SET: &str = "(undeclared kinds)";

/// One reconcile pass, given to [`Reconciler::reconcile`](super::Reconciler::reconcile) and
/// [`Reconciler::cleanup`](super::Reconciler::cleanup).
pub struct Pass<K: IdempotentResource> {
    obj: Arc<K>,
    client: Client,
    applier: Applier,
    recorder: Option<Publisher>,
    reference: ObjectReference,
    tenant: Option<TenantKey>,
    reason: Reason,
    /// The object's record of the children it created (from its status), when its kind keeps
    /// one ([`Reconciler::child_record`](super::Reconciler::child_record)).
    record: Option<Vec<CreatedChild>>,
    /// What this pass's applies change in the record.
    delta: RecordDelta,
    /// The report of the apply under way: what it did so far is still there when the pass is
    /// cut off mid-apply ([`Pass::unfinished_delta`]).
    applying: ApplyReport,
    /// What was last reported as `NotPruned`, per owner (the driver's).
    noticed: Arc<super::events::Noticed>,
    /// Objects found in a desired child's way (`ChildNotOwned`), with their kinds' resources.
    blocking: Vec<(ApiResource, ObjectKey)>,
    /// A child being deleted whose repair the server refused (`Terminating` with
    /// `unrepaired`): a webhook's, a policy's or authorization's refusal may end with no
    /// event, so the driver looks at the owner again after a while.
    unrepaired: bool,
    /// The tenants of namespaces, for a `namespace_label` rule (the controller's).
    namespaces: Option<NamespaceTenants>,
    /// The child kinds the reconciler declares (`None`: any, for a pass the driver did not
    /// make from a reconciler's declaration).
    declared: Option<KindSet>,
    /// The declared kinds, each with whether it is namespaced: pruned by every apply, whether
    /// or not a child of the kind is desired.
    pruned: Vec<(ApiResource, bool)>,
    /// The child kinds whose status the reconciler reads.
    reads_status: KindSet,
}

impl<K: IdempotentResource> Pass<K> {
    pub(crate) fn new(
        obj: Arc<K>,
        client: Client,
        applier: Applier,
        recorder: Option<Publisher>,
        reason: Reason,
        record: Option<Vec<CreatedChild>>,
        noticed: Arc<super::events::Noticed>,
    ) -> Self {
        let tenant = match obj.tenant() {
            Ok(TenantRef::Known(key)) => Some(key),
            _ => None,
        };
        let reference = obj.object_ref(&());
        Self {
            obj,
            client,
            applier,
            recorder,
            reference,
            tenant,
            reason,
            record,
            delta: RecordDelta::default(),
            applying: ApplyReport::default(),
            noticed,
            blocking: Vec::new(),
            unrepaired: false,
            namespaces: None,
            declared: None,
            pruned: Vec::new(),
            reads_status: KindSet::default(),
        }
    }

    /// Reads a `namespace_label` rule's tenant from `namespaces` (the controller's).
    pub(crate) fn with_namespaces(mut self, namespaces: Option<NamespaceTenants>) -> Self {
        if self.tenant.is_none()
            && let (Ok(TenantRef::NamespaceLabel { namespace, .. }), Some(n)) =
                (self.obj.tenant(), &namespaces)
        {
            self.tenant = n.get(&namespace);
        }
        self.namespaces = namespaces;
        self
    }

    /// Applies only children of the kinds `kinds` declares, prunes undesired children of every
    /// one of them, and reads the status of those declared so ([`Pass::children`]).
    pub(crate) fn declaring(mut self, kinds: &ChildKinds<K>) -> Self {
        self.declared = Some(kinds.set());
        self.pruned = kinds.scoped().map(|(r, n)| (r.clone(), n)).collect();
        self.reads_status = kinds.status_set();
        self
    }

    /// A terminal [`KIND_NOT_DECLARED`] error for the first child of `desired` whose kind the
    /// reconciler does not declare.
    fn check_declared(&self, desired: &DesiredChildren) -> Result<(), ReconcileError> {
        if self.record.is_none()
            && let Some(once) = desired.children.iter().find(|c| c.once.is_some())
        {
            return Err(ReconcileError::terminal(
                CREATE_ONCE_WITHOUT_RECORD,
                format!(
                    "{} {} is create-once, but {} keeps no record of the children it created \
                     (#[idempotent(prune = owner_references)]): a deleted create-once child \
                     could not be told from one never created, and would silently get a new \
                     value. Give the status `created_children: Vec<CreatedChild>` and drop \
                     the opt-out",
                    once.resource.kind,
                    once.key(),
                    K::kind(&()),
                ),
            ));
        }
        let Some(declared) = &self.declared else {
            return Ok(());
        };
        // Across every part of the pass, not only this apply's kinds.
        crate::apply::distinct_kind_names(declared.0.iter())?;
        let kinds = (desired.children.iter().map(|c| &c.resource))
            .chain(desired.kinds.iter().map(|(r, _)| r));
        match kinds.into_iter().find(|r| !declared.has(r)) {
            None => Ok(()),
            Some(r) => Err(ReconcileError::terminal(
                KIND_NOT_DECLARED,
                format!(
                    "the desired state holds {kind} ({api_version}) children, a kind \
                     Reconciler::children does not declare: add .owns::<{kind}>() to it (fn \
                     children() -> ChildKinds<Self::Resource>) so that the controller watches \
                     and caches them",
                    kind = r.kind,
                    api_version = r.api_version
                ),
            )),
        }
    }

    /// The objects this pass's applies found in a desired child's way (the children
    /// [`NotOwned`](crate::apply::ChildOutcome::NotOwned)), each with its kind's resource: the
    /// driver watches them and reconciles the object again once one is gone
    /// ([`crate::controller::blocked`]).
    pub fn blocking(&self) -> &[(ApiResource, ObjectKey)] {
        &self.blocking
    }

    /// Whether an apply of this pass left a child being deleted unrepaired, the server
    /// refusing the repair (`ChildOutcome::Terminating` with `unrepaired`): the driver polls.
    pub fn unrepaired(&self) -> bool {
        self.unrepaired
    }

    /// The object's record of the children it created, as read at the start of the pass
    /// (`None` when its kind keeps none).
    pub fn record(&self) -> Option<&[CreatedChild]> {
        self.record.as_deref()
    }

    /// What this pass's applies change in the record so far (also after a failed apply).
    pub fn record_delta(&self) -> &RecordDelta {
        &self.delta
    }

    /// [`Pass::record_delta`] with what an apply cut off mid-way (the pass's timeout) had done
    /// before it was cut: the children it had created, those it had pruned.
    pub(crate) fn unfinished_delta(&self) -> RecordDelta {
        let mut delta = self.delta.clone();
        delta.add(&self.applying, false);
        delta
    }

    /// The client of this pass: every request of the pass goes through it.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The apply engine of this pass (reading children from the controller's caches).
    pub fn applier(&self) -> &Applier {
        &self.applier
    }

    /// The controller's child caches, when the driver has them: read children there instead
    /// of asking the API server.
    pub fn caches(&self) -> Option<&ChildCaches> {
        self.applier.caches()
    }

    /// Why this reconcile runs.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// A reference to the object, for Events.
    pub fn reference(&self) -> &ObjectReference {
        &self.reference
    }

    /// The tenant children are labelled with, once known (from the derive's rule, or
    /// [`Pass::set_tenant`]; for a `namespace_label` rule run by a controller, the label's
    /// value on the object's namespace from the start of the pass, see
    /// [`Controller::for_derived`](crate::controller::Controller::for_derived)).
    pub fn tenant(&self) -> Option<&TenantKey> {
        self.tenant.as_ref()
    }

    /// The controller's cache of namespace tenants, for a `namespace_label` rule run by a
    /// controller (`None` otherwise, e.g. [`Driver::reconcile_once`](super::Driver::reconcile_once)):
    /// with it, a [`Pass::tenant`] of `None` means the watch that wakes the object when its
    /// namespace's tenant changes names no tenant for that namespace (yet).
    pub fn namespace_tenants(&self) -> Option<&NamespaceTenants> {
        self.namespaces.as_ref()
    }

    /// Label children with `tenant` instead of what the derive's rule finds (e.g. a tenant
    /// the kind checks more strictly than a label).
    pub fn set_tenant(&mut self, tenant: TenantKey) {
        self.tenant = Some(tenant);
    }

    /// The owner children are applied under: the object, the derive's `FIELD_MANAGER`, its
    /// tenant and, when the kind keeps one, its record of the children it created (the prune
    /// deletes nothing else, see [`crate::apply::record`]). A tenant named by a namespace
    /// label is read from the controller's namespace cache ([`NamespaceTenants`]), else (no
    /// controller, e.g. [`Driver::reconcile_once`](super::Driver::reconcile_once)) from the
    /// child caches when they hold Namespaces; a namespace neither knows is read with one GET.
    ///
    /// # Errors
    /// [`ReconcileError::Tenant`] when the tenant cannot be found,
    /// [`ReconcileError::Apply`] when the object was not read from the API server.
    pub async fn owner(&mut self) -> Result<Owner, ReconcileError> {
        if self.tenant.is_none() {
            let tenant = match (self.obj.tenant()?, &self.namespaces) {
                (TenantRef::Known(key), _) => key,
                (TenantRef::NamespaceLabel { namespace, .. }, Some(namespaces)) => {
                    namespaces.resolve(&self.client, &namespace).await?
                }
                (TenantRef::NamespaceLabel { namespace, label }, None) => {
                    let cached = self
                        .caches()
                        .and_then(|c| c.lookup::<Namespace>(None, &namespace))
                        .flatten();
                    let reference = TenantRef::NamespaceLabel { namespace, label };
                    match cached {
                        Some(ns) => reference
                            .resolve_with_labels(&ns.metadata.labels.unwrap_or_default())?,
                        None => reference.resolve(&self.client).await?,
                    }
                }
            };
            self.tenant = Some(tenant);
        }
        let owner = Owner::new(self.obj.as_ref(), K::FIELD_MANAGER, self.tenant.clone())?;
        Ok(match &self.record {
            Some(record) => owner.with_record(record),
            None => owner,
        })
    }

    /// Applies `desired`, the object's whole desired state, under [`Pass::owner`] (only what
    /// drifted; prunes the children of every kind
    /// [`Reconciler::children`](super::Reconciler::children) declares, and of the kinds
    /// `desired` names, that are no longer desired and recorded as created by the object: a
    /// kind whose last child the desired state drops loses that child too) and publishes an
    /// Event per child created, recreated, repaired or deleted, and one `NotPruned` Warning for
    /// the objects that claim the owner without being recorded, however many (published again
    /// only when that set changes; see `events::not_pruned`). Children created are
    /// added to the pass's [`RecordDelta`] even when the apply fails; the driver writes it.
    /// A reconcile that applies its children in parts (namespaces first, then what lives in
    /// them) applies each with [`Pass::apply_part`].
    ///
    /// # Errors
    /// As [`Applier::reconcile`] and [`Pass::owner`]; a terminal [`KIND_NOT_DECLARED`] error,
    /// before any request, when `desired` holds a child of a kind
    /// [`Reconciler::children`](super::Reconciler::children) does not declare.
    pub async fn apply(
        &mut self,
        desired: &DesiredChildren,
    ) -> Result<ApplyReport, ReconcileError> {
        self.check_declared(desired)?;
        let whole = desired.pruning(&self.pruned);
        self.apply_checked(whole.as_ref().unwrap_or(desired)).await
    }

    /// As [`Pass::apply`] for a part of the object's desired state: prunes only the kinds
    /// `desired` holds children of or names
    /// ([`DesiredChildren::prune_kind`]), so the children of the other parts stay.
    ///
    /// # Errors
    /// As [`Pass::apply`].
    pub async fn apply_part(
        &mut self,
        desired: &DesiredChildren,
    ) -> Result<ApplyReport, ReconcileError> {
        self.check_declared(desired)?;
        self.apply_checked(desired).await
    }

    async fn apply_checked(
        &mut self,
        desired: &DesiredChildren,
    ) -> Result<ApplyReport, ReconcileError> {
        let owner = self.owner().await?;
        self.applying = ApplyReport::default();
        let result = self
            .applier
            .reconcile_into(&owner, desired, &mut self.applying)
            .await;
        let report = std::mem::take(&mut self.applying);
        if self.record.is_some() {
            self.delta.add(&report, result.is_ok());
        }
        if let Some(recorder) = &self.recorder {
            super::events::regenerated(recorder, &self.reference, &report.regenerated).await;
        }
        if let Err(e) = result {
            // What was done before the error (children created, pruned, recreated, repaired)
            // is told as a complete apply's is; the objects not in the record are named by a
            // complete apply only (this one may not have looked at them all).
            if let Some(recorder) = &self.recorder {
                let mut told = report.clone();
                told.unrecorded.clear();
                let deleted = self.obj.meta().deletion_timestamp.is_some();
                super::events::children(recorder, &self.reference, &told, deleted).await;
            }
            return Err(e.into());
        }
        self.unrepaired |= report.children.iter().any(|(_, o)| {
            matches!(
                o,
                crate::apply::ChildOutcome::Terminating {
                    unrepaired: Some(_),
                    ..
                }
            )
        });
        for (key, _) in report.not_owned() {
            let resource = desired
                .children
                .iter()
                .find(|c| *c.resource.kind == *key.kind)
                .map(|c| c.resource.clone());
            if let Some(resource) = resource
                && !self.blocking.iter().any(|(_, k)| k == key)
            {
                self.blocking.push((resource, key.clone()));
            }
        }
        if let Some(recorder) = &self.recorder {
            let mut told = report.clone();
            let kinds: Vec<&str> = desired.kinds.iter().map(|(r, _)| r.kind.as_str()).collect();
            if !self
                .noticed
                .changed(owner.uid(), &kinds, &report.unrecorded)
            {
                told.unrecorded.clear();
            }
            let deleted = self.obj.meta().deletion_timestamp.is_some();
            super::events::children(recorder, &self.reference, &told, deleted).await;
            self.tell_undeclared(recorder, owner.uid()).await;
        }
        Ok(report)
    }

    /// Publishes once per set the children of the record whose kinds the reconciler does not
    /// declare ([`super::events::undeclared`]): a kind dropped from `children()` leaves them
    /// unwatched and unpruned, which only the record shows.
    async fn tell_undeclared(&self, recorder: &Publisher, owner_uid: &str) {
        let (Some(record), Some(declared)) = (&self.record, &self.declared) else {
            return;
        };
        let kinds: Vec<&str> = declared.iter().map(|r| r.kind.as_str()).collect();
        let undeclared: Vec<ObjectKey> = record
            .iter()
            .filter(|c| !kinds.contains(&c.kind.as_str()))
            .map(CreatedChild::key)
            .collect();
        // Its own set of "kinds" in the memory of what was told, apart from NotPruned's.
        if self
            .noticed
            .changed(owner_uid, &[UNDECLARED_SET], &undeclared)
            && let Some(event) = super::events::undeclared(&undeclared)
        {
            super::events::publish(recorder, &self.reference, event).await;
        }
    }

    /// Ensures now the create-once child of kind `C` named `name` that `desired` declares
    /// ([`DesiredChildren::create_once`]) and returns it as it is live — the one object every
    /// concurrent reconcile agrees on — so that other children can be made from its value
    /// (say, a connection string holding a generated password). Once it exists it comes from
    /// the controller's child cache, without a request. Add the other children to `desired`
    /// and [`Pass::apply`] it as usual: the child is judged again there (from the cache), so
    /// it is kept and pruned with its kind. `None` when its name is taken by an object the
    /// owner does not own, or it is being deleted: `apply` then reports that
    /// (`ChildNotOwned`, `ChildTerminating`). A child it creates is recorded and announced
    /// (`Created`) as `apply` does.
    ///
    /// ```no_run
    /// # use idem_runtime::apply::DesiredChildren;
    /// # use idem_runtime::reconciler::{Pass, ReconcileError};
    /// # use idem_runtime::resource::IdempotentResource;
    /// # use k8s_openapi::api::core::v1::Secret;
    /// # async fn demo<K: IdempotentResource>(pass: &mut Pass<K>) -> Result<(), ReconcileError> {
    /// # let generated = || Secret::default();
    /// let mut children = DesiredChildren::new();
    /// children.create_once::<Secret, _>("db-password", generated);
    /// if let Some(secret) = pass.ensure_once::<Secret>(&children, "db-password").await? {
    ///     // children.add(&config_with(&secret))?;
    /// #   let _ = secret;
    /// }
    /// let report = pass.apply(&children).await?;
    /// # let _ = report; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ApplyError::ChildDeleted`](crate::apply::ApplyError::ChildDeleted) (terminal: the
    /// owner goes `Stalled` with reason `ChildDeleted`) when the owner's record holds it and
    /// it is gone, unless its kind regenerates deleted children; a terminal error when
    /// `desired` declares no such child; otherwise as [`Pass::apply`].
    ///
    /// # Cancel safety
    /// As [`Pass::apply`]: its one create is idempotent (a later pass takes what it made).
    pub async fn ensure_once<C>(
        &mut self,
        desired: &DesiredChildren,
        name: &str,
    ) -> Result<Option<C>, ReconcileError>
    where
        C: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
    {
        let kind = C::kind(&());
        let Some(child) = desired.once_child(&kind, name) else {
            return Err(ReconcileError::terminal(
                "CreateOnceNotDeclared",
                format!(
                    "no create-once {kind} named {name} is desired (DesiredChildren::create_once)"
                ),
            ));
        };
        self.check_declared(desired)?;
        let owner = self.owner().await?;
        let ensured = self.applier.ensure_once(&owner, child).await?;
        let key = child.placed(&owner)?;
        let mut report = ApplyReport::default();
        if let Some(uid) = &ensured.created {
            report.created.push(CreatedChild::new(&key, uid));
        }
        if ensured.regenerated {
            report.regenerated.push(key.clone());
        }
        if let Some((drift, resource_version)) = ensured.repaired {
            self.applier.count_repaired(&key.kind);
            report.repaired.push(crate::apply::Repair {
                child: key.clone(),
                drift,
                resource_version,
            });
        }
        report.children.push((key, ensured.outcome.clone()));
        if self.record.is_some() {
            self.delta.created.extend(report.created.iter().cloned());
        }
        if let Some(recorder) = &self.recorder {
            super::events::regenerated(recorder, &self.reference, &report.regenerated).await;
            let deleted = self.obj.meta().deletion_timestamp.is_some();
            super::events::children(recorder, &self.reference, &report, deleted).await;
        }
        let Some(live) = ensured.live else {
            return Ok(None);
        };
        serde_json::from_value(live)
            .map(Some)
            .map_err(|e| ReconcileError::Other(Box::new(e)))
    }

    /// The live children of `report` (the apply of `desired`) whose kinds
    /// [`Reconciler::children`](super::Reconciler::children) declares reading, status included,
    /// for a readiness to judge: from the controller's caches (no request), else (no cache of
    /// the kind, e.g. a reconcile without a controller) with one GET per child.
    ///
    /// # Errors
    /// [`ReconcileError::Kube`] when a GET fails; a terminal error when the cache of such a
    /// kind keeps no status (the controller was not run by [`Driver::run`](super::Driver::run)).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn children<'r>(
        &self,
        desired: &DesiredChildren,
        report: &'r ApplyReport,
    ) -> Result<Children<'r>, ReconcileError> {
        Children::read(
            report,
            desired,
            self.reads_status.clone(),
            self.obj.meta().namespace.as_deref(),
            self.caches(),
            &self.client,
        )
        .await
    }

    /// Publishes `event` about the object (best effort; nothing without a recorder), within
    /// the object's Event budget
    /// ([`DriverConfig::events_burst`](super::DriverConfig::events_burst)).
    pub async fn publish(&self, event: Event) {
        if let Some(recorder) = &self.recorder {
            super::events::publish(recorder, &self.reference, event).await;
        }
    }

    /// As [`Pass::publish`], whatever the object's budget: only for an Event an
    /// administrator's action causes, once (what deleting or releasing the object kept),
    /// never for one its owner's writes can repeat.
    pub async fn publish_always(&self, event: Event) {
        if let Some(recorder) = &self.recorder {
            super::events::publish_always(recorder, &self.reference, event).await;
        }
    }

    /// The recorder of this pass, if the driver has one.
    pub(crate) fn recorder(&self) -> Option<&Publisher> {
        self.recorder.as_ref()
    }
}
