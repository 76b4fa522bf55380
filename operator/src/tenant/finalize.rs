//! Cleanup when a Tenant is deleted: its `deletionPolicy` decides whether its namespaces are
//! deleted or retained, but nothing is ever deleted while the Tenant CRD itself is being
//! deleted or when the deletion asked to orphan; the finalizer always completes.
//!
//! Only objects the Tenant controls (its controller ownerReference, matched by uid) count: a
//! namespace that merely carries the Tenant's labels is neither deleted nor waited for, and one
//! whose ownerReference was removed (by hand, or by the garbage collector for
//! `--cascade=orphan`) is kept.

use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::ApiResource;
use kube::runtime::events::{Event, EventType};
use kube::{CustomResourceExt, Resource, ResourceExt};
use serde_json::json;

use idem_runtime::apply::{DesiredChildren, OWNER_UID_LABEL, Owner};
use idem_runtime::reconciler::{Cleanup as Done, Outcome, Pass};
use idem_runtime::status::Readiness;
use kube::Client;

use super::reconcile::TERMINATING_POLL;
use crate::error::Error;
use crate::resources::Tenant;
use crate::resources::tenant::DeletionPolicy;

/// The finalizer the API server adds for `propagationPolicy: Orphan` (`kubectl delete
/// --cascade=orphan`); the garbage collector removes the dependents' ownerReferences.
pub const ORPHAN_FINALIZER: &str = "orphan";

/// What the deletion of one Tenant does to its namespaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// Delete the namespaces it controls, then release the Tenant.
    Delete,
    /// Keep everything; remove the ownerReferences to the Tenant; `why` in words.
    Retain {
        /// Why nothing is deleted, for the Event.
        why: String,
    },
}

/// Decides the cleanup: the CRD being deleted (or unreadable) and an orphaning deletion win
/// over `spec.deletionPolicy`.
///
/// `crd_terminating` is `Some(true)` when the Tenant CRD is being deleted or gone, `None` when
/// that could not be found out (then nothing is deleted: the safe side).
pub fn decide(tenant: &Tenant, crd_terminating: Option<bool>) -> Cleanup {
    let crd = Tenant::crd_name();
    match crd_terminating {
        Some(true) => {
            return Cleanup::Retain {
                why: format!(
                    "the CustomResourceDefinition {crd} is being deleted, so whatever the deletionPolicy says nothing of the tenant is deleted"
                ),
            };
        }
        None => {
            return Cleanup::Retain {
                why: format!(
                    "could not read the CustomResourceDefinition {crd} to rule out its deletion, so nothing of the tenant is deleted"
                ),
            };
        }
        Some(false) => {}
    }
    if tenant.finalizers().iter().any(|f| f == ORPHAN_FINALIZER) {
        return Cleanup::Retain {
            why: "the Tenant was deleted with propagationPolicy Orphan".into(),
        };
    }
    match tenant.spec.deletion_policy {
        DeletionPolicy::Delete => Cleanup::Delete,
        DeletionPolicy::Retain => Cleanup::Retain {
            why: "its deletionPolicy is Retain".into(),
        },
    }
}

/// The `Normal` Event `Retained` (action `Finalize`) that says what a deletion kept: the
/// same for a Tenant and a TenantApp.
pub(crate) fn retained(note: String) -> Event {
    Event {
        type_: EventType::Normal,
        reason: "Retained".into(),
        note: Some(note),
        action: "Finalize".into(),
        secondary: None,
    }
}

/// Whether the Tenant CRD is being deleted (or already gone); `None` when it cannot be read.
async fn crd_terminating(client: &Client) -> Option<bool> {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    match crds.get_opt(Tenant::crd_name()).await {
        Ok(Some(crd)) => Some(crd.metadata.deletion_timestamp.is_some()),
        Ok(None) => Some(true),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the Tenant CRD; retaining the tenant's namespaces");
            None
        }
    }
}

/// Runs the cleanup of a deleted Tenant; [`Done::Done`] lets the driver remove the
/// finalizer, [`Done::Pending`] (namespaces still being deleted) says `Reconciling` with reason
/// `Deleting` and polls.
///
/// # Errors
/// [`Error`] from the API; the driver retries with backoff.
pub async fn finalize(tenant: &Tenant, pass: &mut Pass<Tenant>) -> Result<Done<Tenant>, Error> {
    let client = pass.client().clone();
    let owner = pass.owner().await?;
    match decide(tenant, crd_terminating(&client).await) {
        Cleanup::Delete => {
            let mut all = DesiredChildren::new();
            all.prune_kind::<Namespace>();
            pass.apply(&all).await?;
            // Only what the prune deletes is waited for: a namespace that claims the Tenant
            // but is not in its record of created children is never deleted by us.
            let left: Vec<String> = controlled::<Namespace>(&client, &owner)
                .await?
                .iter()
                .filter(|n| owner.may_prune(n.uid().as_deref().unwrap_or_default()))
                .map(|n| n.name_any())
                .collect();
            if !left.is_empty() {
                let readiness = Readiness::Reconciling {
                    reason: "Deleting".into(),
                    message: format!("waiting for namespaces to be deleted: {}", left.join(", ")),
                };
                return Ok(Done::Pending(
                    Outcome::new(readiness).requeue(TERMINATING_POLL),
                ));
            }
        }
        Cleanup::Retain { why } => {
            let kept = release(&client, &owner).await?;
            let note = if kept.is_empty() {
                format!("Tenant deleted; {why}; it controlled no namespace")
            } else {
                format!(
                    "Tenant deleted; {why}: kept namespaces {} and everything in them, ownerReferences to the Tenant removed",
                    kept.join(", ")
                )
            };
            pass.publish(retained(note)).await;
        }
    }
    Ok(Done::Done)
}

/// The objects of kind `K` labelled with the owner's uid that it really controls.
async fn controlled<K>(client: &Client, owner: &Owner) -> Result<Vec<DynamicObject>, Error>
where
    K: Resource<DynamicType = ()>,
{
    let api = Api::<DynamicObject>::all_with(client.clone(), &ApiResource::erase::<K>(&()));
    let lp = ListParams::default().labels(&format!("{OWNER_UID_LABEL}={}", owner.uid()));
    let list = api.list(&lp).await?;
    Ok(list
        .items
        .into_iter()
        .filter(|o| owner.owns(&o.metadata))
        .collect())
}

/// Removes the Tenant's ownerReference and its `owner-uid` label from every object it
/// controls (namespaces and what it made in them, the namespaces last), so the garbage
/// collector keeps them when the Tenant is gone. Returns the retained namespaces, sorted.
///
/// The `app.kubernetes.io/managed-by` label stays: the shipped admission policy lets the
/// operator write only into namespaces that carry it and never remove it from a namespace.
async fn release(client: &Client, owner: &Owner) -> Result<Vec<String>, Error> {
    // Strategic merge patch: ownerReferences merge by uid, so only our reference goes.
    let patch = json!({"metadata": {
        "ownerReferences": [{"$patch": "delete", "uid": owner.uid()}],
        "labels": {OWNER_UID_LABEL: null},
    }});
    let pp = PatchParams::default();
    let mut kept = Vec::new();
    for resource in [
        ApiResource::erase::<ResourceQuota>(&()),
        ApiResource::erase::<LimitRange>(&()),
        ApiResource::erase::<RoleBinding>(&()),
        ApiResource::erase::<NetworkPolicy>(&()),
        ApiResource::erase::<Namespace>(&()),
    ] {
        let all = Api::<DynamicObject>::all_with(client.clone(), &resource);
        let lp = ListParams::default().labels(&format!("{OWNER_UID_LABEL}={}", owner.uid()));
        for obj in all.list(&lp).await?.items {
            if !owner.owns(&obj.metadata) {
                continue;
            }
            let name = obj.name_any();
            let api = match obj.namespace() {
                Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &resource),
                None => all.clone(),
            };
            match api.patch(&name, &pp, &Patch::Strategic(&patch)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(e) => return Err(e.into()),
            }
            if resource.kind == "Namespace" {
                kept.push(name);
            }
        }
    }
    kept.sort();
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{FINALIZER, TenantSpec};

    fn tenant(policy: DeletionPolicy, finalizers: &[&str]) -> Tenant {
        let mut t = Tenant::new(
            "acme",
            TenantSpec {
                deletion_policy: policy,
                ..TenantSpec::default()
            },
        );
        t.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        t
    }

    #[test]
    fn only_an_explicit_delete_policy_on_a_live_crd_without_orphaning_deletes() {
        let delete = tenant(DeletionPolicy::Delete, &[FINALIZER]);
        assert_eq!(decide(&delete, Some(false)), Cleanup::Delete);
        assert!(
            matches!(decide(&delete, Some(true)), Cleanup::Retain { why } if why.contains("being deleted"))
        );
        assert!(matches!(decide(&delete, None), Cleanup::Retain { .. }));
        let orphan = tenant(DeletionPolicy::Delete, &[ORPHAN_FINALIZER, FINALIZER]);
        assert!(
            matches!(decide(&orphan, Some(false)), Cleanup::Retain { why } if why.contains("Orphan"))
        );
        let retain = tenant(DeletionPolicy::Retain, &[FINALIZER]);
        assert!(
            matches!(decide(&retain, Some(false)), Cleanup::Retain { why } if why.contains("Retain"))
        );
        assert_eq!(
            TenantSpec::default().deletion_policy,
            DeletionPolicy::Retain
        );
    }
}
