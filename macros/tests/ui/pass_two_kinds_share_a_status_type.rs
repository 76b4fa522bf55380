//! Two kinds may share one status type: nothing is implemented on the status type itself.
use idem_runtime::IdempotentResource;
use idem_runtime::resource::IdempotentResource as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct CommonStatus {
    pub observed_generation: Option<i64>,
    pub conditions: Vec<Condition>,
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
}

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "example.com", version = "v1", kind = "Alpha", namespaced, status = "CommonStatus")]
pub struct AlphaSpec {
    pub a: u8,
}

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "example.com", version = "v1", kind = "Beta", namespaced, status = "CommonStatus")]
pub struct BetaSpec {
    pub b: u8,
}

fn main() {
    let mut s = CommonStatus::default();
    Alpha::set_observed_generation_of(&mut s, 3);
    assert_eq!(Beta::observed_generation_of(&s), Some(3));
    assert!(Alpha::conditions_of(&s).is_empty());
}
