//! The explicit opt-out: no record of created children, the prune trusts ownerReferences.
use idem_runtime::IdempotentResource;
use idem_runtime::resource::IdempotentResource as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "AppStatus")]
#[idempotent(tenant = namespace, prune = owner_references)]
pub struct AppSpec {
    pub image: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct AppStatus {
    pub observed_generation: Option<i64>,
    pub conditions: Vec<Condition>,
}

fn main() {
    assert!(!App::PRUNE_BY_RECORD);
    assert!(App::child_record_of(&mut AppStatus::default()).is_none());
}
