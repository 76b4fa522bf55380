//! The custom resources idem-operator serves: `Tenant` (cluster-scoped) and `TenantApp`
//! (namespaced, inside a tenant namespace), in API group `tenancy.idem.dev/v1alpha1`.

pub mod schema;
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
    ])
}

/// Logs an error naming each of the operator's CRDs that is not installed, with the command
/// that installs them: without it the watches only log the API server's
/// `404 page not found` (retried with backoff; they work once the CRDs are applied).
pub(crate) async fn report_missing_crds(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api = kube::Api::<CustomResourceDefinition>::all(client.clone());
    for name in [
        <Tenant as kube::CustomResourceExt>::crd_name(),
        <TenantApp as kube::CustomResourceExt>::crd_name(),
    ] {
        match api.get_opt(name).await {
            Ok(Some(_)) => {}
            Ok(None) => tracing::error!(
                crd = name,
                "the CustomResourceDefinition {name} is not installed; install the CRDs with `kubectl apply -f deploy/crds/` (the watches retry until it exists)"
            ),
            Err(e) => {
                tracing::debug!(crd = name, error = %e, "cannot check the CustomResourceDefinition")
            }
        }
    }
}
