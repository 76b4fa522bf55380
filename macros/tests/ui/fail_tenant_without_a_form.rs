//! `tenant` takes a form after `=`; said with the forms it takes.
use idem_runtime::IdempotentResource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "example.com", version = "v1", kind = "App", status = "AppStatus")]
#[idempotent(tenant)]
pub struct AppSpec {
    pub image: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct AppStatus {
    pub observed_generation: Option<i64>,
    pub conditions: Vec<Condition>,
}

fn main() {}
