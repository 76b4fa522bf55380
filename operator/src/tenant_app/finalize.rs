//! Cleanup when a TenantApp is deleted: an ordinary deletion leaves its ConfigMap, Deployment
//! and Service to the garbage collector (they carry its controller ownerReference), but while
//! the TenantApp CRD is being deleted (an uninstall, a botched upgrade) — or when that cannot
//! be ruled out — the app's ownerReference and `owner-uid` label are removed from them (and
//! from anything else of its namespace that refers to it) so that nothing of the app is
//! deleted, and an Event `Retained` says so.
//!
//! Why: after `kubectl delete crd tenantapps.tenancy.idem.dev` the children would survive with
//! ownerReferences to a uid that no longer exists; once the CRD is installed again the garbage
//! collector finds those owners absent and deletes every app's children.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::ApiResource;
use kube::{Client, CustomResourceExt, ResourceExt};

use idem_runtime::apply::{self, refers_to};
use idem_runtime::reconciler::{Cleanup as Done, Pass};

use crate::error::Error;
use crate::resources::TenantApp;

/// Why the app's children must be kept, or `None` when the CRD is in place (an ordinary
/// deletion: the garbage collector deletes them with the app).
async fn retain_reason(client: &Client) -> Option<String> {
    let crd = TenantApp::crd_name();
    match Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(crd)
        .await
    {
        Ok(Some(c)) if c.metadata.deletion_timestamp.is_none() => None,
        Ok(_) => Some(format!(
            "the CustomResourceDefinition {crd} is being deleted, so nothing of the app is deleted"
        )),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the TenantApp CRD; retaining the app's children");
            Some(format!(
                "could not read the CustomResourceDefinition {crd} to rule out its deletion, so nothing of the app is deleted"
            ))
        }
    }
}

/// Runs the cleanup of a deleted TenantApp; always [`Done::Done`] (the driver then removes the
/// finalizer).
///
/// # Errors
/// [`Error`] from the API while releasing the children; the driver retries with backoff.
pub async fn finalize(
    app: &TenantApp,
    pass: &mut Pass<TenantApp>,
) -> Result<Done<TenantApp>, Error> {
    let client = pass.client().clone();
    let Some(why) = retain_reason(&client).await else {
        return Ok(Done::Done);
    };
    let kept = release(&client, app).await?;
    let note = if kept.is_empty() {
        format!("TenantApp deleted; {why}; it controlled no object")
    } else {
        format!(
            "TenantApp deleted; {why}: kept {}, ownerReferences to the app removed",
            kept.join(", ")
        )
    };
    pass.publish(crate::tenant::finalize::retained(note)).await;
    Ok(Done::Done)
}

/// Releases ([`idem_runtime::apply::release`]: removes the app's ownerReferences and its
/// `owner-uid` label) every ConfigMap, Deployment and Service of its namespace that refers to
/// it: found as the garbage collector finds what to delete, by ownerReference (controller or
/// not, matched by uid), never by a label anyone may remove — a user's object the app owns is
/// kept too. Returns them as `Kind/name`, sorted.
async fn release(client: &Client, app: &TenantApp) -> Result<Vec<String>, Error> {
    let uid = app.uid().unwrap_or_default();
    let namespace = app.namespace().unwrap_or_default();
    let mut kept = Vec::new();
    for resource in [
        ApiResource::erase::<ConfigMap>(&()),
        ApiResource::erase::<Deployment>(&()),
        ApiResource::erase::<Service>(&()),
    ] {
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &resource);
        for obj in api.list_metadata(&ListParams::default()).await?.items {
            if !refers_to(&obj.metadata, &uid) {
                continue;
            }
            if apply::release(client, &resource, &obj.metadata, &uid).await? {
                let name = obj.metadata.name.unwrap_or_default();
                kept.push(format!("{}/{name}", resource.kind));
            }
        }
    }
    kept.sort();
    Ok(kept)
}
