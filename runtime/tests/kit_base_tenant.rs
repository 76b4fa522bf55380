//! The example `BaseTenant` passes idem-tests' idempotence kit on the real control plane, and
//! so does a kind whose tenant is its namespace, with every instance the kit makes in one
//! namespace (each instance's children are its own, not its neighbours').
#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;
use base_tenant::{BaseTenant, BaseTenants};
use idem_runtime::IdempotentResource;
use idem_runtime::apply::{CreatedChild, DesiredChildren};
use idem_runtime::reconciler::{ChildKinds, ReconcileError, Reconciler};
use idem_tests::kit::{DriverSubject, Kit};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

struct Example;
impl DriverSubject for Example {
    type Reconciler = BaseTenants;
    fn reconciler(&self, _: &kube::Client) -> BaseTenants {
        BaseTenants
    }
    fn primary(&self, name: &str) -> BaseTenant {
        let spec = serde_json::json!({"owners": ["alice", "bob"], "cpu": "2", "memory": "4Gi"});
        BaseTenant::new(name, serde_json::from_value(spec).unwrap())
    }
    fn flipped(&self, t: &BaseTenant) -> Option<BaseTenant> {
        let mut t = t.clone(); // one owner more: the RoleBinding's subjects change
        t.spec.owners.push("carol".into());
        Some(t)
    }
}

#[tokio::test]
async fn the_example_resource_passes_the_idempotence_kit() {
    let cp = idem_tests::shared();
    base_tenant::install_crd(&cp.client()).await.unwrap();
    let report = Kit::driven(cp, Example).run_all().await.unwrap();
    report.assert_idempotent();
}

/// A crew, whose tenant is its namespace: one ConfigMap `<name>-<item>` per item.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kit.test.idem.dev",
    version = "v1",
    kind = "Crew",
    namespaced,
    status = "CrewStatus"
)]
#[idempotent(tenant = namespace, label_prefix = "crews.example.com")]
pub struct CrewSpec {
    /// One ConfigMap each.
    pub items: Vec<String>,
}

/// The Crew's status.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CrewStatus {
    /// The generation the conditions describe.
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling, Stalled.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The children created.
    #[serde(default)]
    pub created_children: Vec<CreatedChild>,
}

struct Crews;

impl Reconciler for Crews {
    type Resource = Crew;

    fn children() -> ChildKinds<Crew> {
        ChildKinds::new().owns::<ConfigMap>()
    }

    fn desired(&self, c: &Crew) -> Result<DesiredChildren, ReconcileError> {
        let mut children = DesiredChildren::new();
        for item in &c.spec.items {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("{}-{item}", c.name_any())},
                "data": {"item": item},
            }))
            .map_err(|e| ReconcileError::terminal("InvalidSpec", e.to_string()))?;
            children.add(&cm)?;
        }
        Ok(children)
    }
}

/// Every Crew the kit makes lives in namespace `namespace`: the kit's reference instance
/// and each check's instances are neighbours sharing one tenant (and its tenant label).
struct Neighbours {
    namespace: String,
}

impl DriverSubject for Neighbours {
    type Reconciler = Crews;
    fn reconciler(&self, _: &kube::Client) -> Crews {
        Crews
    }
    fn primary(&self, name: &str) -> Crew {
        let mut c = Crew::new(
            name,
            CrewSpec {
                items: vec!["a".into()],
            },
        );
        c.metadata.namespace = Some(self.namespace.clone());
        c
    }
    fn flipped(&self, c: &Crew) -> Option<Crew> {
        let mut c = c.clone(); // one ConfigMap more
        c.spec.items.push("b".into());
        Some(c)
    }
}

#[tokio::test]
async fn a_namespace_tenanted_kind_passes_the_kit_with_all_its_instances_in_one_namespace() {
    let cp = idem_tests::shared();
    let client = cp.client();
    idem_tests::install_crd(&client, &Crew::crd())
        .await
        .unwrap();
    let namespace = idem_tests::create_namespace(&client, "kit-crews")
        .await
        .unwrap();
    let report = Kit::driven(cp, Neighbours { namespace })
        .run_all()
        .await
        .unwrap();
    report.assert_idempotent();
}
