//! One reconcile of a TenantApp on idem-runtime's [`Reconciler`]: check it lives in a tenant
//! namespace, apply its ConfigMap, Deployment and Service, then mirror the Deployment's
//! availability into the status. The runtime's driver does the rest.

use std::sync::Arc;

use idem_runtime::prelude::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::ResourceExt;

use super::{desired, status};
use crate::context::Context;
use crate::error::Error;
use crate::resources::{FINALIZER, TenantApp, TenantAppStatus};

/// How often an app outside a tenant namespace is looked at again, besides when its
/// namespace's tenant changes (which wakes it at once).
pub const NOT_IN_TENANT_NAMESPACE_POLL: std::time::Duration = std::time::Duration::from_secs(30);

/// The TenantApp reconciler. Children carry a controller ownerReference, so the garbage
/// collector deletes them with the app; the finalizer only keeps them when the TenantApp CRD
/// itself is being deleted ([`super::finalize`]).
pub struct TenantApps {
    /// The operator's shared state (child caches, namespaces' tenants).
    pub ctx: Arc<Context>,
}

impl Reconciler for TenantApps {
    type Resource = TenantApp;
    const FINALIZER: Option<&'static str> = Some(FINALIZER);

    /// A ConfigMap, a Deployment (whose status makes the app's readiness) and a Service.
    fn children() -> ChildKinds<TenantApp> {
        ChildKinds::new()
            .owns::<ConfigMap>()
            .owns_reading_status::<Deployment>()
            .owns::<Service>()
    }

    fn child_record(status: &mut TenantAppStatus) -> Option<&mut Vec<CreatedChild>> {
        Some(&mut status.created_children)
    }

    async fn reconcile(
        &self,
        app: &TenantApp,
        pass: &mut Pass<TenantApp>,
    ) -> Result<Outcome<TenantApp>, Error> {
        let namespace = app.namespace().unwrap_or_default();
        // From the runtime's cache of namespace tenants, whose watch wakes the app when its
        // namespace gains, loses or changes its tenant; a namespace it does not name a tenant
        // for (not cached yet, just created) is read from the server before the app is judged
        // to be outside a tenant namespace. Looked at again now and then as well.
        let resolved = match pass.tenant().cloned() {
            Some(tenant) => Ok(tenant),
            None => {
                // Without the runtime's cache (a pass not run by a controller), the context's
                // namespace cache answers first; with it (the same cache the context reads in
                // the operator), a namespace it names no tenant for is read from the server.
                let cached = pass.namespace_tenants().is_none();
                self.ctx
                    .resolve_tenant_of_namespace(pass.client(), &namespace, cached)
                    .await?
            }
        };
        let tenant = match resolved {
            Ok(tenant) => tenant,
            Err(why) => {
                return Ok(
                    Outcome::new(status::not_in_tenant_namespace(&namespace, &why))
                        .requeue(NOT_IN_TENANT_NAMESPACE_POLL)
                        .status(|s: &mut TenantAppStatus| s.available_replicas = 0),
                );
            }
        };
        pass.set_tenant(tenant.clone());
        let desired = desired::children(app)?;
        let report = pass.apply(&desired).await?;
        // From the controller's cache of Deployments (with our own write of this reconcile);
        // a Deployment of the app's name that is not the app's is not among the children.
        let deployment = pass
            .children(&desired, &report)
            .await?
            .get::<Deployment>(&app.name_any())?;
        let available = status::available(deployment.as_ref());
        // The Deployment is watched: its status changes bring the app back; a foreign object in
        // a child's way is watched by the runtime until it is gone or replaced (polled only past
        // the watch limits, see `idem_runtime::controller::blocked`).
        Ok(Outcome::new(status::readiness(
            status::desired_replicas(app.spec.replicas, deployment.as_ref()),
            &report,
            deployment.as_ref(),
        ))
        .status(move |s: &mut TenantAppStatus| s.available_replicas = available))
    }

    async fn cleanup(
        &self,
        app: &TenantApp,
        pass: &mut Pass<TenantApp>,
    ) -> Result<Cleanup<TenantApp>, Error> {
        super::finalize::finalize(app, pass).await
    }
}
