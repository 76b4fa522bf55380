//! Tenant taken from a nested spec field; optional strings are accepted.
use idem_runtime::IdempotentResource;
use idem_runtime::resource::{IdempotentResource as _, TenantRef, TenantRule};
use idem_runtime::TenantKey;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Owner {
    pub team: Option<String>,
}

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "Bucket", namespaced, status = "TenantStatus")]
#[idempotent(tenant = field(owner.team))]
pub struct BucketSpec {
    pub owner: Owner,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct TenantStatus {
    pub observed_generation: Option<i64>,
    pub conditions: Vec<Condition>,
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
}

fn main() {
    let b = Bucket::new("b", BucketSpec { owner: Owner { team: Some("acme".into()) } });
    assert_eq!(b.tenant().unwrap(), TenantRef::Known(TenantKey::new("acme")));
    assert_eq!(Bucket::TENANT_RULE, TenantRule::Field("owner.team"));
    let unset = Bucket::new("b", BucketSpec { owner: Owner { team: None } });
    assert!(unset.tenant().is_err());
}
