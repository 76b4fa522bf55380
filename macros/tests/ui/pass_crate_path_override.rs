//! `crate = "..."` for code that reaches idem-runtime under another name.
extern crate idem_runtime as idem;
use idem::IdempotentResource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "Thing", status = "ThingStatus")]
#[idempotent(crate = "idem", tenant = name)]
pub struct ThingSpec {
    pub x: u8,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ThingStatus {
    pub observed_generation: Option<i64>,
    pub conditions: Vec<Condition>,
    pub created_children: Vec<idem::apply::CreatedChild>,
}

fn main() {
    assert_eq!(<Thing as idem::resource::IdempotentResource>::FIELD_MANAGER, env!("CARGO_PKG_NAME"));
    // Reachable without importing the trait.
    assert_eq!(Thing::FIELD_MANAGER, env!("CARGO_PKG_NAME"));
}
