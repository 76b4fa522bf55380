//! What the Tenant controller watches: Tenants, and its children (Namespaces, ResourceQuotas,
//! LimitRanges, RoleBindings, NetworkPolicies) labelled `app.kubernetes.io/managed-by`.

use idem_runtime::apply::MANAGED_BY_LABEL;
use idem_runtime::controller::{Controller, ControllerConfig};
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::resources::{FIELD_MANAGER, Tenant};

/// The watch config of every child kind: only what the operator manages.
pub fn children_config() -> watcher::Config {
    watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}"))
}

/// A Tenant's weight in the operator's fair queues: `spec.weight`, clamped to 1–100 (the
/// range the CRD admits).
pub fn weight(tenant: &Tenant) -> u32 {
    tenant.spec.weight.clamp(1, 100).unsigned_abs()
}

/// The Tenant controller, not yet running: each Tenant is its own tenant in the fair queue (its
/// derive's `tenant = name`), with `spec.weight` as its weight.
pub fn controller(client: &Client, config: ControllerConfig) -> Controller<Tenant> {
    Controller::for_derived(
        Api::<Tenant>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<Namespace>::all(client.clone()), children_config())
    .owns(Api::<ResourceQuota>::all(client.clone()), children_config())
    .owns(Api::<LimitRange>::all(client.clone()), children_config())
    .owns(Api::<RoleBinding>::all(client.clone()), children_config())
    .owns(Api::<NetworkPolicy>::all(client.clone()), children_config())
    .weight_of(weight)
    .with_config(config)
}
