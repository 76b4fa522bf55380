//! No #[idempotent] at all: namespaced roots default to the tenancy.idem.dev/tenant label.
use idem_runtime::IdempotentResource;
use idem_runtime::resource::{IdempotentResource as _, TenantRef};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "Cache", namespaced, status = "TenantStatus")]
pub struct CacheSpec {
    pub size: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct TenantStatus {
    pub observed_generation: Option<i64>,
    pub conditions: Vec<Condition>,
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
}

fn main() {
    let mut c = Cache::new("c", CacheSpec { size: 1 });
    c.metadata.namespace = Some("acme-dev".into());
    assert_eq!(
        c.tenant().unwrap(),
        TenantRef::NamespaceLabel { namespace: "acme-dev".into(), label: "tenancy.idem.dev/tenant" }
    );
}
