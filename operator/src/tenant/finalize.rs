//! Cleanup when a Tenant is deleted: its `deletionPolicy` decides whether its namespaces are
//! deleted or retained, but nothing is ever deleted while the Tenant CRD itself is being
//! deleted, when the deletion asked to orphan or when the Tenant is paused; the finalizer
//! always completes.
//!
//! Only objects that refer to the Tenant (its ownerReference, matched by uid, as the garbage
//! collector reads them) count, whatever their labels say: a namespace that merely carries the
//! Tenant's labels is neither deleted nor waited for, one whose `owner-uid` label was removed
//! is still found, and one whose ownerReference was removed (by hand, or by the garbage
//! collector for `--cascade=orphan`) is kept, with what the Tenant made in it.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::core::ApiResource;

use idem_runtime::apply::{self, CreatedChild, DesiredChildren, Owner, refers_to};
use idem_runtime::reconciler::retention::{
    CrdRetention, crd_retention, release_referring, retained,
};
use idem_runtime::reconciler::{Cleanup as Done, Outcome, Pass};
use idem_runtime::status::Readiness;
use kube::Client;

use crate::error::Error;
use crate::resources::tenant::DeletionPolicy;
use crate::resources::{Tenant, TenantPolicy};

/// How often a tenant whose namespaces (or objects) are still being deleted is looked at again
/// at first ([`waiting_poll`]).
pub const TERMINATING_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// The longest wait between two looks at a Tenant waiting for a deletion ([`waiting_poll`]).
pub const DELETION_POLL_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// When a Tenant that has waited for a deletion since `since` is looked at again, at `now`:
/// [`TERMINATING_POLL`] at first, then a quarter of the time it has waited, up to
/// [`DELETION_POLL_MAX`]. A finalizer anyone may put on an object can hold a deletion for
/// good; the deleted objects' own events wake the Tenant meanwhile, so the poll is only the
/// safety net.
pub fn waiting_poll(since: Option<&Time>, now: Time) -> std::time::Duration {
    let waited = since
        .and_then(|t| std::time::Duration::try_from(now.0.duration_since(t.0)).ok())
        .unwrap_or_default();
    (waited / 4).clamp(TERMINATING_POLL, DELETION_POLL_MAX)
}

/// When a deleted Tenant whose namespaces are still being deleted is looked at again, at `now`
/// ([`waiting_poll`] since its deletion).
pub fn deletion_poll(tenant: &Tenant, now: Time) -> std::time::Duration {
    waiting_poll(tenant.metadata.deletion_timestamp.as_ref(), now)
}

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

/// Decides the cleanup: the CRD being deleted, an orphaning deletion and a paused Tenant win
/// over `spec.deletionPolicy`.
///
/// `crd` is [`crd_retention`]'s answer: `None` when the Tenant CRD is in place, else why
/// nothing may be deleted (it is being deleted or gone). A CRD that could not be read gives no
/// answer: the finalizer stays and tries again.
pub fn decide(tenant: &Tenant, crd: Option<&CrdRetention>) -> Cleanup {
    match crd {
        Some(why @ CrdRetention::Deleting { .. }) => {
            return Cleanup::Retain {
                why: format!(
                    "{why}, so whatever the deletionPolicy says nothing of the tenant is deleted"
                ),
            };
        }
        None => {}
    }
    if tenant.finalizers().iter().any(|f| f == ORPHAN_FINALIZER) {
        return Cleanup::Retain {
            why: "the Tenant was deleted with propagationPolicy Orphan".into(),
        };
    }
    match tenant.spec.deletion_policy {
        DeletionPolicy::Delete if tenant.spec.paused => Cleanup::Retain {
            why: "it was paused (its children are left alone), so although its deletionPolicy \
                  is Delete nothing of the tenant is deleted"
                .into(),
        },
        DeletionPolicy::Delete => Cleanup::Delete,
        DeletionPolicy::Retain => Cleanup::Retain {
            why: "its deletionPolicy is Retain".into(),
        },
    }
}

/// Runs the cleanup of a deleted Tenant; [`Done::Done`] lets the driver remove the
/// finalizer, [`Done::Pending`] (namespaces still being deleted) says `Reconciling` with reason
/// `Deleting` and polls.
///
/// What is the Tenant's is found as the garbage collector finds what to delete: by
/// ownerReference (and the record in its status), never by a label anyone may remove.
///
/// # Errors
/// [`Error`] from the API; the driver retries with backoff.
pub async fn finalize(tenant: &Tenant, pass: &mut Pass<Tenant>) -> Result<Done<Tenant>, Error> {
    let client = pass.client().clone();
    let owner = pass.owner().await?;
    let record = pass.record().unwrap_or_default().to_vec();
    // A CRD that cannot be read only matters when the Tenant would be deleted: one that is
    // kept anyway (Retain, orphaning, paused) is released without it.
    let crd = match crd_retention::<Tenant>(&client).await {
        Ok(crd) => crd,
        Err(e) if decide(tenant, None) != Cleanup::Delete => {
            tracing::warn!(error = %e, "cannot read the Tenant CRD; the Tenant is kept anyway");
            None
        }
        Err(e) => return Err(e.into()),
    };
    match decide(tenant, crd.as_ref()) {
        Cleanup::Delete => {
            let mut all = DesiredChildren::new();
            // A recorded namespace an administrator released is kept, not deleted.
            all.prune_kind::<Namespace>().release_orphans::<Namespace>();
            let report = pass.apply_part(&all).await?;
            // What the prune deleted is waited for until it is gone: the recorded namespaces
            // still there being deleted (held by their contents or finalizers), which the
            // prune keeps in the record, read as the prune read them (from the namespace
            // cache). A namespace that claims the Tenant but is not in its record of created
            // children is never deleted by us, nor waited for.
            let left: Vec<String> = (report.pruning.iter())
                .map(|(key, _)| key.name.to_string())
                .collect();
            if !left.is_empty() {
                let readiness = Readiness::Reconciling {
                    reason: "Deleting".into(),
                    message: format!("waiting for namespaces to be deleted: {}", left.join(", ")),
                };
                return Ok(Done::Pending(
                    Outcome::new(readiness).requeue(deletion_poll(tenant, Time(Timestamp::now()))),
                ));
            }
            // What is still the Tenant's outside the namespaces deleted (in a namespace an
            // administrator released) is kept, not left to the garbage collector.
            let kept = release(&client, &owner, &record).await?;
            if !kept.is_empty() {
                let note = format!(
                    "Tenant deleted; its deletionPolicy is Delete: its namespaces were deleted; {}",
                    kept.describe()
                );
                pass.publish_always(retained(note)).await;
            }
        }
        Cleanup::Retain { why } => {
            let kept = release(&client, &owner, &record).await?;
            let note = if kept.is_empty() {
                format!("Tenant deleted; {why}; it controlled no namespace")
            } else {
                format!("Tenant deleted; {why}: {}", kept.describe())
            };
            pass.publish_always(retained(note)).await;
        }
    }
    Ok(Done::Done)
}

/// The metadata of every namespace with an ownerReference to the owner (any, as the garbage
/// collector reads them).
async fn namespaces_referring(client: &Client, owner: &Owner) -> Result<Vec<ObjectMeta>, Error> {
    let all = Api::<Namespace>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await?;
    Ok(all
        .items
        .into_iter()
        .map(|n| n.metadata)
        .filter(|m| refers_to(m, owner.uid()))
        .collect())
}

/// What [`release`] kept.
#[derive(Debug, Default)]
struct Kept {
    /// Namespaces released, sorted.
    namespaces: Vec<String>,
    /// Namespaces released while already being deleted (held by their contents or
    /// finalizers): they go once the hold does, whatever the policy; sorted.
    deleting: Vec<String>,
    /// Objects released in other namespaces (that no longer refer to the Tenant), as
    /// `Kind namespace/name`, sorted.
    objects: Vec<String>,
}

impl Kept {
    fn is_empty(&self) -> bool {
        self.namespaces.is_empty() && self.deleting.is_empty() && self.objects.is_empty()
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.namespaces.is_empty() {
            parts.push(format!(
                "kept namespaces {} and everything in them",
                self.namespaces.join(", ")
            ));
        }
        if !self.deleting.is_empty() {
            parts.push(format!(
                "namespaces {} were already being deleted and go once what holds them does",
                self.deleting.join(", ")
            ));
        }
        if !self.objects.is_empty() {
            parts.push(format!("kept {}", self.objects.join(", ")));
        }
        format!(
            "{}, ownerReferences to the Tenant removed",
            parts.join("; ")
        )
    }
}

/// Releases ([`release_referring`]: removes the Tenant's ownerReferences and its `owner-uid`
/// label from) everything that refers to the Tenant — the namespaces and what is in
/// them, the namespaces last — so the garbage collector keeps it when the Tenant is gone.
///
/// Found as the garbage collector finds what to delete, by ownerReference: the namespaces
/// that refer to the Tenant, then, in those and in every namespace of the Tenant's record
/// (one an administrator released still holds objects of the Tenant), each kind the Tenant
/// makes, listed whole and kept if it refers to the Tenant.
///
/// The `app.kubernetes.io/managed-by` label stays: the shipped admission policy lets the
/// operator write only into namespaces that carry it and never remove it from a namespace.
async fn release(client: &Client, owner: &Owner, record: &[CreatedChild]) -> Result<Kept, Error> {
    let uid = owner.uid();
    let namespaces = namespaces_referring(client, owner).await?;
    let mut scopes: BTreeSet<String> = namespaces.iter().filter_map(|n| n.name.clone()).collect();
    for entry in record {
        match (&entry.namespace, entry.kind.as_str()) {
            (Some(ns), _) => scopes.insert(ns.clone()),
            (None, "Namespace") => scopes.insert(entry.name.clone()),
            _ => false,
        };
    }
    let mut kept = Kept::default();
    for resource in [
        ApiResource::erase::<ResourceQuota>(&()),
        ApiResource::erase::<LimitRange>(&()),
        ApiResource::erase::<RoleBinding>(&()),
        ApiResource::erase::<NetworkPolicy>(&()),
        ApiResource::erase::<TenantPolicy>(&()),
    ] {
        for ns in &scopes {
            let referred = namespaces.iter().any(|n| n.name.as_deref() == Some(ns));
            // A kind whose CRD is gone (an uninstall deleting the TenantPolicy CRD too) has
            // nothing to release.
            let released = match release_referring::<Tenant>(client, &resource, Some(ns), uid).await
            {
                Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
                other => other?,
            };
            for key in released {
                if !referred {
                    kept.objects
                        .push(format!("{} {ns}/{}", resource.kind, key.name));
                }
            }
        }
    }
    let resource = ApiResource::erase::<Namespace>(&());
    for ns in &namespaces {
        if apply::release(client, &resource, ns, owner.label_names(), uid).await? {
            match ns.deletion_timestamp {
                Some(_) => kept.deleting.extend(ns.name.clone()),
                None => kept.namespaces.extend(ns.name.clone()),
            }
        }
    }
    kept.namespaces.sort();
    kept.deleting.sort();
    kept.objects.sort();
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{FINALIZER, TenantSpec};
    use k8s_openapi::jiff::SignedDuration;
    use kube::CustomResourceExt;

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
    fn a_namespace_already_being_deleted_is_not_said_to_be_kept() {
        let kept = Kept {
            namespaces: vec!["t-a".into()],
            deleting: vec!["t-b".into()],
            objects: vec![],
        };
        assert_eq!(
            kept.describe(),
            "kept namespaces t-a and everything in them; namespaces t-b were already being \
             deleted and go once what holds them does, ownerReferences to the Tenant removed"
        );
    }

    #[test]
    fn a_held_deletion_is_looked_at_less_and_less_often() {
        let mut t = tenant(DeletionPolicy::Delete, &[FINALIZER]);
        let deleted = Timestamp::now();
        t.metadata.deletion_timestamp = Some(Time(deleted));
        let after = |secs| Time(deleted + SignedDuration::from_secs(secs));
        assert_eq!(deletion_poll(&t, after(0)), TERMINATING_POLL);
        assert_eq!(
            deletion_poll(&t, after(40)),
            std::time::Duration::from_secs(10)
        );
        assert_eq!(deletion_poll(&t, after(3_600)), DELETION_POLL_MAX);
    }

    #[test]
    fn only_an_explicit_delete_policy_on_a_live_crd_without_orphaning_or_pause_deletes() {
        let delete = tenant(DeletionPolicy::Delete, &[FINALIZER]);
        let crd = Tenant::crd_name().to_owned();
        let deleting = CrdRetention::Deleting { crd };
        assert_eq!(decide(&delete, None), Cleanup::Delete);
        assert!(
            matches!(decide(&delete, Some(&deleting)), Cleanup::Retain { why } if why.contains("being deleted"))
        );
        let orphan = tenant(DeletionPolicy::Delete, &[ORPHAN_FINALIZER, FINALIZER]);
        assert!(matches!(decide(&orphan, None), Cleanup::Retain { why } if why.contains("Orphan")));
        let mut paused = tenant(DeletionPolicy::Delete, &[FINALIZER]);
        paused.spec.paused = true;
        assert!(matches!(decide(&paused, None), Cleanup::Retain { why } if why.contains("paused")));
        let retain = tenant(DeletionPolicy::Retain, &[FINALIZER]);
        assert!(matches!(decide(&retain, None), Cleanup::Retain { why } if why.contains("Retain")));
        assert_eq!(
            TenantSpec::default().deletion_policy,
            DeletionPolicy::Retain
        );
    }
}
