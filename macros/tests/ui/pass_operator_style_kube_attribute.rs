//! The operator's own `#[kube(...)]` shape: printcolumns, shortname, a CEL validation rule and
//! kube's `KubeSchema` derive; idem reads only kind, scope and status and ignores the rest.
use idem_runtime::IdempotentResource;
use idem_runtime::resource::IdempotentResource as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::core::Rule;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

#[derive(CustomResource, KubeSchema, IdempotentResource, Clone, Debug, Default, Serialize, Deserialize)]
#[kube(
    group = "tenancy.idem.dev",
    version = "v1alpha1",
    kind = "Tenant",
    shortname = "tnt",
    status = "TenantStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    validation = Rule::new("size(self.metadata.name) <= 30").message("at most 30 characters"),
)]
#[idempotent(tenant = name)]
#[serde(rename_all = "camelCase")]
pub struct TenantSpec {
    #[serde(default)]
    pub namespaces: Vec<String>,
}

#[derive(KubeSchema, Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantStatus {
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
}

fn main() {
    assert!(!Tenant::NAMESPACED);
    let _ = Rule::new("true");
}
