//! Cleanup when a TenantApp is deleted: an ordinary deletion leaves its ConfigMap, Deployment
//! and Service to the garbage collector (they carry its controller ownerReference), but while
//! the TenantApp CRD is being deleted (an uninstall, a botched upgrade) — or when that cannot
//! be ruled out — the app's ownerReference and `owner-uid` label are removed from every
//! ConfigMap, Deployment and Service of its namespace that refers to it (an owner's own object
//! of those kinds too) so that nothing of the app is deleted, and an Event `Retained` says so.
//! An object of another kind to which an owner gave an ownerReference to the app is the
//! garbage collector's: it goes with the app, as with a Tenant. Releasing it would need the
//! right to list and patch every kind in tenant namespaces, which the operator does not have
//! (its ClusterRole names only the kinds it makes).
//!
//! Why: after `kubectl delete crd tenantapps.tenancy.idem.dev` the children would survive with
//! ownerReferences to a uid that no longer exists; once the CRD is installed again the garbage
//! collector finds those owners absent and deletes every app's children.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::ResourceExt;
use kube::core::ApiResource;

use idem_runtime::reconciler::retention::{crd_retention, release_referring, retained};
use idem_runtime::reconciler::{Cleanup as Done, Pass};

use crate::error::Error;
use crate::resources::TenantApp;

/// Runs the cleanup of a deleted TenantApp; always [`Done::Done`] (the driver then removes the
/// finalizer).
///
/// # Errors
/// [`Error`] from the API while releasing the children; the driver retries with backoff.
pub async fn finalize(
    app: &TenantApp,
    pass: &mut Pass<TenantApp>,
) -> Result<Done<TenantApp>, Error> {
    let Some(why) = crd_retention::<TenantApp>(pass.client()).await? else {
        return Ok(Done::Done);
    };
    let kept = release(pass, app).await?;
    let note = if kept.is_empty() {
        format!(
            "TenantApp deleted; {why}, so nothing of the app is deleted; it controlled no object"
        )
    } else {
        format!(
            "TenantApp deleted; {why}, so nothing of the app is deleted: kept {}, ownerReferences to the app removed",
            kept.join(", ")
        )
    };
    pass.publish_always(retained(note)).await;
    Ok(Done::Done)
}

/// Releases ([`release_referring`]) every ConfigMap, Deployment and Service of the app's
/// namespace that refers to it — a user's object the app owns is kept too. Returns them as
/// `Kind/name`, sorted.
async fn release(pass: &Pass<TenantApp>, app: &TenantApp) -> Result<Vec<String>, Error> {
    let uid = app.uid().unwrap_or_default();
    let namespace = app.namespace();
    let mut kept = Vec::new();
    for resource in [
        ApiResource::erase::<ConfigMap>(&()),
        ApiResource::erase::<Deployment>(&()),
        ApiResource::erase::<Service>(&()),
    ] {
        let released =
            release_referring::<TenantApp>(pass.client(), &resource, namespace.as_deref(), &uid)
                .await?;
        kept.extend(released.iter().map(|k| format!("{}/{}", k.kind, k.name)));
    }
    kept.sort();
    Ok(kept)
}
