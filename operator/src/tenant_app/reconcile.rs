//! One reconcile of a TenantApp: check it lives in a tenant namespace, apply its ConfigMap,
//! Deployment and Service, then mirror the Deployment's availability into the status.

use std::sync::Arc;

use idem_runtime::ObjectKey;
use idem_runtime::apply::{ApplyReport, Owner};
use idem_runtime::controller::{Action, Attempt};
use idem_runtime::resource::IdempotentResource as _;
use idem_runtime::status::Readiness;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::Api;
use kube::core::ApiResource;
use kube::{Resource, ResourceExt};

use super::{desired, status};
use crate::context::{Context, STALLED_AFTER_FAILURES};
use crate::error::Error;
use crate::events;
use crate::resources::TenantApp;

/// How often an app outside a tenant namespace is looked at again (its namespace may become
/// a tenant's).
pub const NOT_IN_TENANT_NAMESPACE_POLL: std::time::Duration = std::time::Duration::from_secs(30);

/// How often an app blocked by a foreign object is looked at again when that object cannot be
/// watched (more than [`super::blocked::MAX_BLOCKED_WATCHES`] blocked at once).
pub const BLOCKED_POLL: std::time::Duration = std::time::Duration::from_secs(30);

/// Watches every foreign object the report found in a child's way; `false` when one could not
/// be watched.
fn watch_blocking(ctx: &Context, app: &TenantApp, report: &ApplyReport) -> bool {
    let owner = ObjectKey::namespaced(
        "TenantApp",
        &app.namespace().unwrap_or_default(),
        &app.name_any(),
    );
    let mut all = true;
    for (key, _) in report.not_owned() {
        let resource = match &*key.kind {
            "ConfigMap" => ApiResource::erase::<ConfigMap>(&()),
            "Deployment" => ApiResource::erase::<Deployment>(&()),
            "Service" => ApiResource::erase::<Service>(&()),
            _ => {
                all = false;
                continue;
            }
        };
        all &= ctx
            .blocked
            .watch(&ctx.client, resource, key.clone(), owner.clone());
    }
    all
}

/// Reconciles one TenantApp; after [`STALLED_AFTER_FAILURES`] failures in a row the status
/// says `Stalled` with reason `ReconcileFailed` while retries go on.
///
/// # Errors
/// [`Error`] from the API; the controller retries with per-key backoff.
pub async fn reconcile(
    app: Arc<TenantApp>,
    ctx: Arc<Context>,
    attempt: Attempt,
) -> Result<Action, Error> {
    let result = reconcile_inner(&app, &ctx).await;
    if let Err(e) = &result {
        let failures = attempt.failures + 1;
        if failures >= STALLED_AFTER_FAILURES {
            let readiness = crate::tenant::status::failed(failures, &e.to_string());
            let _ = write_status(&ctx, &app, None, &readiness).await;
        }
    }
    result
}

async fn reconcile_inner(app: &TenantApp, ctx: &Context) -> Result<Action, Error> {
    if app.meta().deletion_timestamp.is_some() {
        // Children carry a controller ownerReference: the garbage collector deletes them.
        return Ok(Action::await_change());
    }
    let namespace = app.namespace().unwrap_or_default();
    // From the cache; a namespace not cached yet (just created) is read from the server
    // before the app is judged to be outside a tenant namespace.
    let tenant = match ctx.resolve_tenant_of_namespace(&namespace).await? {
        Ok(tenant) => tenant,
        Err(why) => {
            let readiness = status::not_in_tenant_namespace(&namespace, &why);
            write_status(ctx, app, Some(0), &readiness).await?;
            // Namespace labels are not watched by this controller: look again now and then (a
            // status that does not change is not written again).
            return Ok(Action::requeue(NOT_IN_TENANT_NAMESPACE_POLL));
        }
    };
    let owner = Owner::new(app, TenantApp::FIELD_MANAGER, Some(tenant))?;
    let report = ctx
        .applier
        .reconcile(&owner, &desired::children(app)?)
        .await?;
    events::children(&ctx.recorder, &app.object_ref(&()), &report).await;
    // A Deployment of the app's name that is not the app's says nothing about the app.
    let deployment = if report.not_owned().any(|(k, _)| &*k.kind == "Deployment") {
        None
    } else if let Some(cached) = ctx
        .caches
        .lookup::<Deployment>(Some(&namespace), &app.name_any())
    {
        // From the controller's cache of Deployments (with our own write of this reconcile).
        cached
    } else {
        Api::<Deployment>::namespaced(ctx.client.clone(), &namespace)
            .get_opt(&app.name_any())
            .await?
    };
    let readiness = status::readiness(app.spec.replicas, &report, deployment.as_ref());
    write_status(
        ctx,
        app,
        Some(status::available(deployment.as_ref())),
        &readiness,
    )
    .await?;
    // The Deployment is watched: its status changes bring the app back; a foreign object in
    // a child's way is watched until it is gone (polled only past the watch limit).
    if watch_blocking(ctx, app, &report) {
        Ok(Action::await_change())
    } else {
        Ok(Action::requeue(BLOCKED_POLL))
    }
}

async fn write_status(
    ctx: &Context,
    app: &TenantApp,
    available: Option<i32>,
    readiness: &Readiness,
) -> Result<(), Error> {
    let api =
        Api::<TenantApp>::namespaced(ctx.client.clone(), &app.namespace().unwrap_or_default());
    crate::status::write(ctx, api, app, readiness, |status| {
        if let Some(available) = available {
            status.available_replicas = available;
        }
    })
    .await
}
