//! The live children a readiness reads: the apply report, and the desired children (with
//! their `status`) of the kinds a reconciler declares reading in [`Reconciler::children`].
//!
//! [`Reconciler::children`]: super::Reconciler::children

use kube::Resource;
use kube::api::{Api, DynamicObject};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::ReconcileError;
use crate::apply::{ApplyReport, ChildCaches, ChildOutcome, DesiredChildren};
use crate::controller::KindSet;
use crate::key::ObjectKey;

/// The condition reason of a readiness that reads the status of a kind it did not declare.
pub const STATUS_NOT_DECLARED: &str = "StatusNotDeclared";

/// What [`Reconciler::ready`](super::Reconciler::ready) judges from: the apply report of the
/// pass, and the live objects — `status` included — of the desired children whose kinds the
/// reconciler declares with [`ChildKinds::owns_reading_status`](super::ChildKinds::owns_reading_status) (read
/// from the controller's caches, so a converged pass makes no request for them).
///
/// A child whose name another object holds ([`ChildOutcome::NotOwned`]) is not the owner's and
/// not among them.
#[derive(Debug)]
pub struct Children<'a> {
    report: &'a ApplyReport,
    kinds: KindSet,
    namespace: Option<String>,
    live: Vec<(ObjectKey, Value)>,
}

impl<'a> Children<'a> {
    /// Reads the live children of `kinds` among those `report` names, from `caches` (when
    /// they serve the kind), else with one GET each through `client`.
    pub(crate) async fn read(
        report: &'a ApplyReport,
        desired: &DesiredChildren,
        kinds: KindSet,
        owner_namespace: Option<&str>,
        caches: Option<&ChildCaches>,
        client: &kube::Client,
    ) -> Result<Self, ReconcileError> {
        let mut live = Vec::new();
        for (key, outcome) in &report.children {
            if matches!(outcome, ChildOutcome::NotOwned { .. }) {
                continue;
            }
            let Some(resource) = desired
                .children()
                .iter()
                .map(|c| &c.resource)
                .find(|r| *r.kind == *key.kind && kinds.has(r))
            else {
                continue;
            };
            let cached = match caches.and_then(|c| c.keeps_status(resource)) {
                Some(false) => {
                    return Err(ReconcileError::terminal(
                        STATUS_NOT_DECLARED,
                        format!(
                            "the controller's cache of {} keeps no status: run the controller \
                             with Driver::run (which keeps the status of the kinds \
                             Reconciler::children declares with owns_reading_status)",
                            resource.kind
                        ),
                    ));
                }
                Some(true) => caches.and_then(|c| c.get(resource, key)),
                None => None,
            };
            let found = match cached {
                Some(found) => found,
                None => {
                    let api: Api<DynamicObject> = match &key.namespace {
                        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
                        None => Api::all_with(client.clone(), resource),
                    };
                    api.get_opt(&key.name)
                        .await?
                        .and_then(|o| serde_json::to_value(o).ok())
                }
            };
            if let Some(obj) = found {
                live.push((key.clone(), obj));
            }
        }
        Ok(Self {
            report,
            kinds,
            namespace: owner_namespace.map(str::to_owned),
            live,
        })
    }

    /// The apply report of the pass.
    pub fn report(&self) -> &ApplyReport {
        self.report
    }

    /// The live child of kind `C` named `name`, in the owner's namespace (for a namespaced
    /// owner and kind); `None` when no such child exists, is desired, or is the owner's.
    ///
    /// # Errors
    /// A terminal [`ReconcileError`] (reason [`STATUS_NOT_DECLARED`]) when `C` is not a kind
    /// [`Reconciler::children`](super::Reconciler::children) declares with
    /// [`ChildKinds::owns_reading_status`](super::ChildKinds::owns_reading_status): its children are
    /// not read (their watch keeps no status, and a change of it would not reconcile the
    /// owner); one when the object does not deserialise as a `C`.
    pub fn get<C>(&self, name: &str) -> Result<Option<C>, ReconcileError>
    where
        C: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let namespace = self.namespace.as_deref();
        self.find::<C>(|k| {
            &*k.name == name && (k.namespace.is_none() || k.namespace.as_deref() == namespace)
        })
        .map(|mut all| all.pop())
    }

    /// The live child of kind `C` named `name` in `namespace` (`None` for a cluster-scoped
    /// kind); as [`Children::get`].
    ///
    /// # Errors
    /// As [`Children::get`].
    pub fn get_in<C>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<C>, ReconcileError>
    where
        C: Resource<DynamicType = ()> + DeserializeOwned,
    {
        self.find::<C>(|k| &*k.name == name && k.namespace.as_deref() == namespace)
            .map(|mut all| all.pop())
    }

    /// Every live child of kind `C`, in the order they were desired.
    ///
    /// # Errors
    /// As [`Children::get`].
    pub fn all<C>(&self) -> Result<Vec<C>, ReconcileError>
    where
        C: Resource<DynamicType = ()> + DeserializeOwned,
    {
        self.find::<C>(|_| true)
    }

    fn find<C>(&self, pick: impl Fn(&ObjectKey) -> bool) -> Result<Vec<C>, ReconcileError>
    where
        C: Resource<DynamicType = ()> + DeserializeOwned,
    {
        if !self.kinds.contains::<C>() {
            let kind = C::kind(&());
            return Err(ReconcileError::terminal(
                STATUS_NOT_DECLARED,
                format!(
                    "the readiness reads {kind} children, whose status Reconciler::children \
                     does not declare read: declare the kind with \
                     .owns_reading_status::<{kind}>() (in fn children() -> ChildKinds<Self::Resource>) \
                     so that their watch keeps their status and a change of it reconciles the owner"
                ),
            ));
        }
        let kind = C::kind(&());
        self.live
            .iter()
            .filter(|(k, _)| *k.kind == *kind && pick(k))
            .map(|(k, v)| {
                serde_json::from_value(v.clone()).map_err(|e| {
                    ReconcileError::terminal(
                        "ChildUnreadable",
                        format!("{k} does not read as a {kind}: {e}"),
                    )
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
    use serde_json::json;

    use super::*;

    fn children(report: &ApplyReport, kinds: KindSet) -> Children<'_> {
        let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "ns"}, "status": {"replicas": 3, "readyReplicas": 2}});
        Children {
            report,
            kinds,
            namespace: Some("ns".into()),
            live: vec![(ObjectKey::namespaced("StatefulSet", "ns", "db"), sts)],
        }
    }

    #[test]
    fn a_declared_kind_reads_with_its_status() {
        let report = ApplyReport::default();
        let c = children(&report, KindSet::of::<StatefulSet>());
        let sts = c.get::<StatefulSet>("db").unwrap().expect("the child");
        assert_eq!(sts.status.and_then(|s| s.ready_replicas), Some(2));
        assert!(c.get::<StatefulSet>("other").unwrap().is_none());
        assert!(
            c.get_in::<StatefulSet>(Some("elsewhere"), "db")
                .unwrap()
                .is_none()
        );
        assert_eq!(c.all::<StatefulSet>().unwrap().len(), 1);
    }

    #[test]
    fn an_undeclared_kind_is_a_terminal_error_naming_the_fix() {
        let report = ApplyReport::default();
        let c = children(&report, KindSet::of::<Deployment>());
        let e = c.get::<StatefulSet>("db").unwrap_err();
        assert!(e.is_terminal());
        assert_eq!(e.terminal_reason(), STATUS_NOT_DECLARED);
        assert!(
            e.to_string()
                .contains(".owns_reading_status::<StatefulSet>()"),
            "{e}"
        );
    }
}
