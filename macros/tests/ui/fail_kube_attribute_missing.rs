use idem_runtime::IdempotentResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[idempotent(tenant = name)]
pub struct AppSpec {
    pub image: String,
}

fn main() {}
