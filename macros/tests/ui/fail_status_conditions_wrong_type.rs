use idem_runtime::IdempotentResource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "App", namespaced, status = "AppStatus")]
pub struct AppSpec {
    pub image: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct AppStatus {
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
    pub observed_generation: Option<i64>,
    pub conditions: Vec<String>,
}

fn main() {
    let _: Option<Condition> = None;
}
