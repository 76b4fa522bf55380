//! What the TenantApp controller watches: TenantApps, and their ConfigMaps, Deployments and
//! Services labelled `app.kubernetes.io/managed-by`. The tenant of an app is what its derive's
//! rule says (`tenant = namespace_label("tenancy.idem.dev/tenant")`), read from the operator's
//! namespace cache, and only from namespaces a Tenant controls (see [`crate::context::tenant_of`]).
//! Its weight in the fair queue is that Tenant's `spec.weight`, read from the Tenant
//! controller's cache at every dispatch, so a weight change applies at once.
//! Foreign objects that block a child's name are watched one by one by the runtime
//! (`idem_runtime::controller::blocked`).

use std::sync::Arc;

use idem_runtime::TenantKey;
use idem_runtime::controller::{Controller, ControllerConfig, OwnsOptions};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::context::Context;
use crate::resources::{Tenant, TenantApp};
use crate::tenant::source::children_config;

/// The TenantApp controller, not yet running; `tenants` is the Tenant controller's cache
/// (see [`Controller::store`]), where each app's weight is read.
pub fn controller(
    client: &Client,
    ctx: &Arc<Context>,
    config: ControllerConfig,
    tenants: Store<Tenant>,
) -> Controller<TenantApp> {
    let ctx = Arc::clone(ctx);
    Controller::for_derived(
        Api::<TenantApp>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<ConfigMap>::all(client.clone()), children_config())
    // The reconcile reads the Deployment's status for the app's readiness.
    .owns_with(
        Api::<Deployment>::all(client.clone()),
        children_config(),
        OwnsOptions::reading_status(),
    )
    .owns(Api::<Service>::all(client.clone()), children_config())
    .namespace_labels(move |ns| {
        let ns = ctx.namespaces.get(&ObjectRef::new(ns))?;
        crate::context::tenant_of(&ns)?;
        ns.metadata.labels.clone()
    })
    .tenant_weight(move |tenant: &TenantKey| {
        let t = tenants.get(&ObjectRef::new(tenant.as_str()))?;
        Some(crate::tenant::source::weight(&t))
    })
    .with_config(config)
}
