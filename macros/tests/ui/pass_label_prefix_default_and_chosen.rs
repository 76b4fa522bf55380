//! The labels idem stamps on children live under the CRD group by default, or under
//! `label_prefix = "..."`; a namespaced kind's default namespace label is `<prefix>/tenant`.
use idem_runtime::IdempotentResource;
use idem_runtime::apply::Labels;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "example.idem.dev", version = "v1", kind = "Grouped", status = "AppStatus")]
pub struct GroupedSpec {
    pub image: String,
}

#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "example.idem.dev", version = "v1", kind = "Chosen", namespaced, status = "AppStatus")]
#[idempotent(label_prefix = "teams.example.com")]
pub struct ChosenSpec {
    pub image: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct AppStatus {
    pub observed_generation: Option<i64>,
    pub conditions: Vec<Condition>,
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
}

fn main() {
    use idem_runtime::resource::{IdempotentResource as _, TenantRule};
    assert_eq!(Grouped::LABEL_PREFIX, "example.idem.dev");
    assert_eq!(Chosen::LABEL_PREFIX, "teams.example.com");
    assert_eq!(Labels::of::<Chosen>().owner_uid(), "teams.example.com/owner-uid");
    assert_eq!(Labels::of::<Grouped>().fingerprint(), "example.idem.dev/applied-fingerprint");
    // A namespaced kind's default tenant label (on its namespace) is its own, as on its children.
    assert_eq!(Chosen::TENANT_RULE, TenantRule::NamespaceLabel("teams.example.com/tenant"));
}
