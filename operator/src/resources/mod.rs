//! The custom resources idem-operator serves: `Tenant` (cluster-scoped) and `TenantApp`
//! (namespaced, inside a tenant namespace), in API group `tenancy.idem.dev/v1alpha1`.

pub mod tenant;
pub mod tenant_app;

pub use tenant::{Tenant, TenantSpec, TenantStatus};
pub use tenant_app::{TenantApp, TenantAppSpec, TenantAppStatus};

/// The API group of every idem resource.
pub const GROUP: &str = "tenancy.idem.dev";
/// The field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "idem-operator";
/// The finalizer on a `Tenant` that makes deletion wait until its namespaces are gone.
pub const FINALIZER: &str = "tenancy.idem.dev/cleanup";
/// Label on everything the operator creates: who manages it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Label on everything the operator creates: which tenant it belongs to.
pub const TENANT_LABEL: &str = "tenancy.idem.dev/tenant";

/// The CustomResourceDefinitions of every idem resource, in a stable order.
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![Tenant::crd(), TenantApp::crd()]
}
