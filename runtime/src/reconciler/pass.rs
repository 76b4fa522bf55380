//! One reconcile pass of one object: the client, the apply engine and the Event recorder it
//! uses, and the owner its children are applied under.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use kube::Client;
use kube::runtime::events::{Event, Recorder};

use super::{Reason, ReconcileError};
use crate::apply::{
    Applier, ApplyReport, ChildCaches, CreatedChild, DesiredChildren, Owner, RecordDelta,
};
use crate::key::{ObjectKey, TenantKey};
use crate::resource::{IdempotentResource, TenantRef};
use kube::core::ApiResource;

/// One reconcile pass, given to [`Reconciler::reconcile`](super::Reconciler::reconcile) and
/// [`Reconciler::cleanup`](super::Reconciler::cleanup).
pub struct Pass<K: IdempotentResource> {
    obj: Arc<K>,
    client: Client,
    applier: Applier,
    recorder: Option<Recorder>,
    reference: ObjectReference,
    tenant: Option<TenantKey>,
    reason: Reason,
    /// The object's record of the children it created (from its status), when its kind keeps
    /// one ([`Reconciler::child_record`](super::Reconciler::child_record)).
    record: Option<Vec<CreatedChild>>,
    /// What this pass's applies change in the record.
    delta: RecordDelta,
    /// What was last reported as `NotPruned`, per owner (the driver's).
    noticed: Arc<super::events::Noticed>,
    /// Objects found in a desired child's way (`ChildNotOwned`), with their kinds' resources.
    blocking: Vec<(ApiResource, ObjectKey)>,
}

impl<K: IdempotentResource> Pass<K> {
    pub(crate) fn new(
        obj: Arc<K>,
        client: Client,
        applier: Applier,
        recorder: Option<Recorder>,
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
            noticed,
            blocking: Vec::new(),
        }
    }

    /// The objects this pass's applies found in a desired child's way (the children
    /// [`NotOwned`](crate::apply::ChildOutcome::NotOwned)), each with its kind's resource: the
    /// driver watches them and reconciles the object again once one is gone
    /// ([`crate::controller::blocked`]).
    pub fn blocking(&self) -> &[(ApiResource, ObjectKey)] {
        &self.blocking
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
    /// [`Pass::set_tenant`]).
    pub fn tenant(&self) -> Option<&TenantKey> {
        self.tenant.as_ref()
    }

    /// Label children with `tenant` instead of what the derive's rule finds (e.g. a tenant
    /// the kind checks more strictly than a label).
    pub fn set_tenant(&mut self, tenant: TenantKey) {
        self.tenant = Some(tenant);
    }

    /// The owner children are applied under: the object, the derive's `FIELD_MANAGER`, its
    /// tenant and, when the kind keeps one, its record of the children it created (the prune
    /// deletes nothing else, see [`crate::apply::record`]). A tenant named by a namespace label is read from the child caches when they
    /// hold Namespaces, else with one GET.
    ///
    /// # Errors
    /// [`ReconcileError::Tenant`] when the tenant cannot be found,
    /// [`ReconcileError::Apply`] when the object was not read from the API server.
    pub async fn owner(&mut self) -> Result<Owner, ReconcileError> {
        if self.tenant.is_none() {
            let tenant = match self.obj.tenant()? {
                TenantRef::Known(key) => key,
                TenantRef::NamespaceLabel { namespace, label } => {
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

    /// Applies `desired` under [`Pass::owner`] (only what drifted; prunes children of the
    /// desired kinds no longer desired and recorded as created by the object) and publishes an
    /// Event per child created, recreated, repaired or deleted, and one `NotPruned` Warning for
    /// the objects that claim the owner without being recorded, however many (published again
    /// only when that set changes; see [`super::events::not_pruned`]). Children created are
    /// added to the pass's [`RecordDelta`] even when the apply fails; the driver writes it.
    ///
    /// # Errors
    /// As [`Applier::reconcile`] and [`Pass::owner`].
    pub async fn apply(
        &mut self,
        desired: &DesiredChildren,
    ) -> Result<ApplyReport, ReconcileError> {
        let owner = self.owner().await?;
        let mut report = ApplyReport::default();
        let result = self
            .applier
            .reconcile_into(&owner, desired, &mut report)
            .await;
        if self.record.is_some() {
            self.delta.add(&report, result.is_ok());
        }
        result?;
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
            super::events::children(recorder, &self.reference, &told).await;
        }
        Ok(report)
    }

    /// Publishes `event` about the object (best effort; nothing without a recorder).
    pub async fn publish(&self, event: Event) {
        if let Some(recorder) = &self.recorder {
            super::events::publish(recorder, &self.reference, event).await;
        }
    }

    /// The recorder of this pass, if the driver has one.
    pub(crate) fn recorder(&self) -> Option<&Recorder> {
        self.recorder.as_ref()
    }
}
