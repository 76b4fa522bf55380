//! The shape: namespaced root, tenant from a namespace label, kstatus conditions.
use idem_runtime::IdempotentResource;
use idem_runtime::resource::{IdempotentResource as _, SpecDiff, TenantRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "TenantApp",
       namespaced, status = "TenantAppStatus")]
#[idempotent(tenant = namespace_label("tenancy.idem.dev/tenant"),
             field_manager = "idem-operator", conditions(Ready, Reconciling, Stalled))]
#[serde(rename_all = "camelCase")]
pub struct TenantAppSpec {
    pub image: String,
    pub replicas: i32,
    pub max_surge: Option<i32>,
    #[idempotent(skip)]
    pub note: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantAppStatus {
    pub observed_generation: Option<i64>,
    pub conditions: Vec<Condition>,
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
}

fn main() {
    let a = TenantAppSpec { image: "a".into(), replicas: 1, max_surge: None, note: None };
    let b = TenantAppSpec { image: "b".into(), replicas: 1, max_surge: Some(1), note: Some("x".into()) };
    assert_eq!(a.diff(&b), vec!["image", "maxSurge"]);
    assert_eq!(TenantApp::TENANT_RULE, TenantRule::NamespaceLabel("tenancy.idem.dev/tenant"));
    assert_eq!(TenantApp::CONDITION_TYPES, &["Ready", "Reconciling", "Stalled"]);
    assert!(TenantApp::NAMESPACED);
    assert!(TenantApp::PRUNE_BY_RECORD, "the prune goes by the record by default");
}
