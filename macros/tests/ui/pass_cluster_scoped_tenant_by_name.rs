//! A cluster-scoped root whose tenant is its own name; defaults for everything else.
use idem_runtime::IdempotentResource;
use idem_runtime::resource::{IdempotentResource as _, SpecDiff, TenantRef, TenantRule};
use idem_runtime::TenantKey;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "Tenant", shortname = "tnt", status = "TenantStatus")]
#[idempotent(tenant = name)]
pub struct TenantSpec {
    pub namespaces: Vec<String>,
    pub weight: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct TenantStatus {
    pub observed_generation: Option<i64>,
    pub conditions: Vec<Condition>,
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
}

fn main() {
    let t = Tenant::new("acme", TenantSpec { namespaces: vec!["dev".into()], weight: 1 });
    assert_eq!(t.tenant().unwrap(), TenantRef::Known(TenantKey::new("acme")));
    assert_eq!(Tenant::FIELD_MANAGER, env!("CARGO_PKG_NAME"));
    assert_ne!(Tenant::FIELD_MANAGER, "idem-operator");
    assert_eq!(Tenant::CONDITION_TYPES, &["Ready", "Reconciling", "Stalled"]);
    assert_eq!(Tenant::TENANT_RULE, TenantRule::Name);
    assert!(!Tenant::NAMESPACED);
    let mut other = t.spec.clone();
    assert_eq!(t.spec.fingerprint(), other.fingerprint());
    other.weight = 2;
    assert_ne!(t.spec.fingerprint(), other.fingerprint());
    assert_eq!(t.spec.diff(&other), vec!["weight"]);
}
