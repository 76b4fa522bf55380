use idem_runtime::IdempotentResource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "App", namespaced)]
pub struct AppSpec {
    pub image: String,
}

fn main() {
    let _ = <App as idem_runtime::resource::IdempotentResource>::FIELD_MANAGER;
    let _: Option<Condition> = None;
}
