//! What the TenantApp controller watches: TenantApps, and their ConfigMaps, Deployments and
//! Services labelled `app.kubernetes.io/managed-by`. The tenant of an app is the tenant label
//! of its namespace (from the operator's namespace cache).

use std::sync::Arc;

use idem_runtime::TenantKey;
use idem_runtime::controller::{Controller, ControllerConfig};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use crate::context::Context;
use crate::resources::TenantApp;
use crate::tenant::source::children_config;

/// The TenantApp controller, not yet running.
pub fn controller(
    client: &Client,
    ctx: &Arc<Context>,
    config: ControllerConfig,
) -> Controller<TenantApp> {
    let ctx = Arc::clone(ctx);
    Controller::new(
        Api::<TenantApp>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<ConfigMap>::all(client.clone()), children_config())
    .owns(Api::<Deployment>::all(client.clone()), children_config())
    .owns(Api::<Service>::all(client.clone()), children_config())
    .tenant_of(move |app: &TenantApp| {
        let ns = app.namespace().unwrap_or_default();
        ctx.tenant_of_namespace(&ns)
            .unwrap_or_else(|| TenantKey::new(ns))
    })
    .with_config(config)
}
