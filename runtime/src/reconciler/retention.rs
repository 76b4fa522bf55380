//! The retention protocol of a deleted owner while its kind's CustomResourceDefinition is being
//! deleted: nothing of the owner is deleted, its children are released, and an Event
//! `Retained` says what was kept.
//!
//! Why: deleting a CRD (an uninstall, a botched upgrade) deletes every object of the kind, and
//! the children would survive with ownerReferences to uids that no longer exist; once the CRD
//! is installed again the garbage collector finds those owners absent and deletes the
//! children — user data among them. So a finalizer first asks [`crd_retention`]; when it
//! answers, the finalizer releases ([`release_referring`]: removes the ownerReferences to the
//! owner and its `owner-uid` label from) every object that refers to the owner, found by
//! ownerReference as the garbage collector finds what to delete, never by a label, and
//! publishes [`retained`]. A CRD that cannot be read is an error: the finalizer stays and the
//! next pass asks again (retaining then would make a transient error, or an administrator's
//! slip in RBAC, into a deletion that kept everything, and the access it grants, for good).
//!
//! ```no_run
//! # use idem_runtime::reconciler::{Cleanup, Pass, ReconcileError};
//! # use idem_runtime::reconciler::retention::{crd_retention, release_referring, retained};
//! # use k8s_openapi::api::core::v1::ConfigMap;
//! # use kube::ResourceExt;
//! # use kube::core::ApiResource;
//! # async fn cleanup<K: idem_runtime::resource::IdempotentResource>(
//! #     owner: &K, pass: &mut Pass<K>,
//! # ) -> Result<Cleanup<K>, ReconcileError> {
//! let Some(why) = crd_retention::<K>(pass.client()).await? else {
//!     return Ok(Cleanup::Done); // an ordinary deletion: the garbage collector's
//! };
//! let (uid, namespace) = (owner.uid().unwrap_or_default(), owner.namespace());
//! let config_map = ApiResource::erase::<ConfigMap>(&());
//! let kept = release_referring::<K>(pass.client(), &config_map, namespace.as_deref(), &uid).await?;
//! pass.publish(retained(format!("deleted; {why}; kept {} objects", kept.len()))).await;
//! Ok(Cleanup::Done)
//! # }
//! ```

use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::ApiResource;
use kube::runtime::events::{Event, EventType};
use kube::{Client, Resource};

use crate::apply::{Labels, refers_to, release};
use crate::key::ObjectKey;
use crate::reconciler::{Cleanup, Pass, ReconcileError, Reconciler};
use crate::resource::IdempotentResource;

/// Why nothing of a deleted owner may be deleted, whatever its spec says: its kind's
/// CustomResourceDefinition is being deleted (or gone).
/// Displayed as the reason in words, e.g. "the CustomResourceDefinition
/// `tenants.tenancy.idem.dev` is being deleted" (without the backquotes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrdRetention {
    /// The CRD has a `deletionTimestamp`, or is gone.
    Deleting {
        /// The CRD's name, `<plural>.<group>`.
        crd: String,
    },
}

impl fmt::Display for CrdRetention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Deleting { crd } => {
                write!(f, "the CustomResourceDefinition {crd} is being deleted")
            }
        }
    }
}

/// The name of kind `K`'s CustomResourceDefinition: `<plural>.<group>`.
pub fn crd_name<K: Resource<DynamicType = ()>>() -> String {
    format!("{}.{}", K::plural(&()), K::group(&()))
}

/// Reads kind `K`'s CustomResourceDefinition (one GET): `None` when it is in place and not
/// being deleted (an ordinary deletion), else why the owner's children must be kept.
///
/// # Errors
/// The read's error (never taken for either answer: the caller's finalizer tries again).
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn crd_retention<K: Resource<DynamicType = ()>>(
    client: &Client,
) -> Result<Option<CrdRetention>, kube::Error> {
    let crd = crd_name::<K>();
    match Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(&crd)
        .await
    {
        Ok(Some(c)) if c.metadata.deletion_timestamp.is_none() => Ok(None),
        Ok(_) => Ok(Some(CrdRetention::Deleting { crd })),
        Err(e) => Err(e),
    }
}

/// Releases ([`release`]) every object of kind `resource` in `namespace` (`None`: a
/// cluster-scoped kind, or every namespace) that refers to the owner with `owner_uid`, of kind
/// `K` (whose owner-uid label, [`Labels::of`], the release removes too) — any
/// ownerReference with that uid, controller or not, as the garbage collector reads them;
/// never by a label, which anyone who may edit the object can remove. One LIST of the kind's
/// metadata, then one merge patch per object released. Returns the keys of the objects
/// released, in the order listed.
///
/// # Errors
/// The API's error, of the list or of a release.
///
/// # Cancel safety
/// Not cancel safe as a whole: cancelled midway, some objects are released and others not;
/// running it again releases the rest.
pub async fn release_referring<K: IdempotentResource>(
    client: &Client,
    resource: &ApiResource,
    namespace: Option<&str>,
    owner_uid: &str,
) -> Result<Vec<ObjectKey>, kube::Error> {
    let api = match namespace {
        Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, resource),
        None => Api::<DynamicObject>::all_with(client.clone(), resource),
    };
    let mut kept = Vec::new();
    for obj in api.list_metadata(&ListParams::default()).await?.items {
        if !refers_to(&obj.metadata, owner_uid) {
            continue;
        }
        if release(
            client,
            resource,
            &obj.metadata,
            Labels::of::<K>(),
            owner_uid,
        )
        .await?
        {
            let name = obj.metadata.name.unwrap_or_default();
            kept.push(match obj.metadata.namespace.as_deref() {
                Some(ns) => ObjectKey::namespaced(&resource.kind, ns, &name),
                None => ObjectKey::cluster(&resource.kind, &name),
            });
        }
    }
    Ok(kept)
}

/// The whole protocol for a reconciler's declared children, as the body of its `cleanup()`:
/// while `R`'s kind's CRD is being deleted, every object of each kind
/// [`Reconciler::children`] declares that refers to `owner` — in the owner's namespace for a
/// namespaced owner, anywhere for a cluster-scoped one — is released
/// ([`release_referring`]) and [`retained`] names them; an ordinary deletion leaves the
/// children to the garbage collector. With a [`Reconciler::FINALIZER`], this keeps user data
/// through an uninstall.
///
/// # Errors
/// [`ReconcileError::Kube`] of the CRD's read, a list or a release: the finalizer stays and
/// the next pass tries again.
///
/// # Cancel safety
/// As [`release_referring`].
pub async fn retain_children<R: Reconciler>(
    owner: &R::Resource,
    pass: &mut Pass<R::Resource>,
) -> Result<Cleanup<R::Resource>, ReconcileError> {
    let Some(why) = crd_retention::<R::Resource>(pass.client()).await? else {
        return Ok(Cleanup::Done);
    };
    let uid = owner.meta().uid.clone().unwrap_or_default();
    let namespace = owner.meta().namespace.clone();
    let mut kept = Vec::new();
    for (resource, namespaced) in R::children().scoped() {
        let scope = if namespaced {
            namespace.as_deref()
        } else {
            None
        };
        kept.extend(release_referring::<R::Resource>(pass.client(), resource, scope, &uid).await?);
    }
    let names: Vec<String> = kept.iter().map(ToString::to_string).collect();
    pass.publish(retained(format!(
        "deleted; {why}: kept {}",
        names.join(", ")
    )))
    .await;
    Ok(Cleanup::Done)
}

/// The `Normal` Event `Retained` (action `Finalize`) that says what a deletion kept.
pub fn retained(note: impl Into<String>) -> Event {
    Event {
        type_: EventType::Normal,
        reason: "Retained".into(),
        note: Some(note.into()),
        action: "Finalize".into(),
        secondary: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_reads_as_the_finalizers_said_it() {
        let crd = "tenants.tenancy.idem.dev".to_owned();
        assert_eq!(
            CrdRetention::Deleting { crd }.to_string(),
            "the CustomResourceDefinition tenants.tenancy.idem.dev is being deleted"
        );
        assert_eq!(
            crd_name::<k8s_openapi::api::apps::v1::Deployment>(),
            "deployments.apps"
        );
    }
}
