use idem_runtime::IdempotentResource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "App", namespaced, status = "AppStatus")]
#[idempotent(tenant = field(teamName))]
#[serde(rename_all = "camelCase")]
pub struct AppSpec {
    pub image: String,
    pub team_name: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct AppStatus {
    pub observed_generation: Option<i64>,
    pub conditions: Vec<Condition>,
}

fn main() {
    let _ = <App as idem_runtime::resource::IdempotentResource>::FIELD_MANAGER;
}
