//! The custom resources idem-operator serves: `Tenant` (cluster-scoped), `TenantApp` and
//! `TenantPolicy` (namespaced, inside a tenant namespace), in API group `tenancy.idem.dev/v1alpha1`.

pub mod schema;
pub mod tenant;
pub mod tenant_app;
pub mod tenant_policy;

pub use tenant::{Tenant, TenantSpec, TenantStatus};
pub use tenant_app::{TenantApp, TenantAppSpec, TenantAppStatus};
pub use tenant_policy::{TenantPolicy, TenantPolicySpec};

/// The API group of every idem resource.
pub const GROUP: &str = "tenancy.idem.dev";
/// The field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "idem-operator";
/// The finalizer on a `Tenant` that makes deletion wait until its namespaces are gone.
pub const FINALIZER: &str = "tenancy.idem.dev/cleanup";
/// Label on everything the operator creates: who manages it (idem-runtime's).
pub use idem_runtime::apply::MANAGED_BY_LABEL;
/// Label on everything the operator creates: which tenant it belongs to (idem-runtime's).
pub use idem_runtime::apply::TENANT_LABEL;

/// The CustomResourceDefinitions of every idem resource, in a stable order.
///
/// # Panics
/// When a type has no structural schema (see [`try_crds`]; a test keeps it from happening).
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    try_crds().unwrap_or_else(|e| panic!("{e}"))
}

/// [`crds`], with an error naming the field and type when a spec or status has no structural
/// schema ([`idem_runtime::schema::crd`]), as `cargo xtask crds` reports it.
///
/// # Errors
/// [`idem_runtime::schema::SchemaError`].
pub fn try_crds() -> Result<
    Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
    idem_runtime::schema::SchemaError,
>{
    Ok(vec![
        idem_runtime::schema::crd::<Tenant>()?,
        idem_runtime::schema::crd::<TenantApp>()?,
        <TenantPolicy as kube::CustomResourceExt>::crd(),
    ])
}
