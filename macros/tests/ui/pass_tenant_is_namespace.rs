//! Tenant = the object's namespace name.
use idem_runtime::IdempotentResource;
use idem_runtime::resource::{IdempotentResource as _, TenantRef};
use idem_runtime::TenantKey;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "Queue", namespaced, status = "TenantStatus")]
#[idempotent(tenant = namespace)]
pub struct QueueSpec {
    pub size: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct TenantStatus {
    pub observed_generation: Option<i64>,
    pub conditions: Vec<Condition>,
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
}

fn main() {
    let mut q = Queue::new("q", QueueSpec { size: 1 });
    assert!(q.tenant().is_err(), "no namespace yet");
    q.metadata.namespace = Some("acme".into());
    assert_eq!(q.tenant().unwrap(), TenantRef::Known(TenantKey::new("acme")));
}
