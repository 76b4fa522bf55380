//! Custom condition types (identifier and prefixed string), a plain i64 observedGeneration,
//! serde renames honoured in diff paths, and kube's `root` rename.
use idem_runtime::IdempotentResource;
use idem_runtime::resource::{IdempotentResource as _, SpecDiff};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "Quota", root = "QuotaResource",
       namespaced, status = "QuotaStatus")]
#[idempotent(tenant = namespace_label("example.com/team"), field_manager = "quota-controller",
             conditions(Ready, "tenancy.idem.dev/QuotaApplied"))]
pub struct QuotaSpec {
    #[serde(rename = "hardLimits")]
    pub hard: std::collections::BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct QuotaStatus {
    pub observed_generation: i64,
    pub conditions: Vec<Condition>,
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
}

fn main() {
    assert_eq!(QuotaResource::FIELD_MANAGER, "quota-controller");
    assert_eq!(QuotaResource::CONDITION_TYPES, &["Ready", "tenancy.idem.dev/QuotaApplied"]);
    let a = QuotaSpec { hard: [("cpu".to_string(), "1".to_string())].into() };
    let b = QuotaSpec { hard: [("cpu".to_string(), "2".to_string())].into() };
    assert_eq!(a.diff(&b), vec!["hardLimits.cpu"]);
    assert!(a.diff(&a.clone()).is_empty());
}
