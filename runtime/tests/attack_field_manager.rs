//! A field manager the derive accepts (1-128 printable characters without spaces) is also the
//! value of the `app.kubernetes.io/managed-by` label on every child and of the child watches'
//! label selector: a `Squad` with `field_manager = "attack.example.com/squads"` must still get
//! its child watches and its children, against the real control plane.

use std::sync::Arc;

use idem_runtime::IdempotentResource;
use idem_runtime::apply::{CreatedChild, DesiredChildren};
use idem_runtime::reconciler::{ChildKinds, Driver, ReconcileError, Reconciler};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::PostParams;
use kube::{Api, CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A squad: one ConfigMap.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "squad.attack.test.idem.dev",
    version = "v1",
    kind = "Squad",
    namespaced,
    status = "SquadStatus"
)]
#[idempotent(tenant = namespace, field_manager = "attack.example.com/squads")]
pub struct SquadSpec {
    /// The ConfigMap's one value.
    pub note: String,
}

/// The Squad's status.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SquadStatus {
    /// The generation the conditions describe.
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling, Stalled.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The children created.
    #[serde(default)]
    pub created_children: Vec<CreatedChild>,
}

struct Squads;
impl Reconciler for Squads {
    type Resource = Squad;
    fn children() -> ChildKinds<Squad> {
        ChildKinds::new().owns::<ConfigMap>()
    }
    fn desired(&self, s: &Squad) -> Result<DesiredChildren, ReconcileError> {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "squad"}, "data": {"note": s.spec.note},
        }))
        .map_err(|e| ReconcileError::terminal("InvalidSpec", e.to_string()))?;
        let mut children = DesiredChildren::new();
        children.add(&cm)?;
        Ok(children)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_field_manager_the_derive_accepts_gets_its_child_watches_and_children() {
    let client = idem_tests::shared().client();
    idem_tests::install_crd(&client, &Squad::crd())
        .await
        .expect("install the Squad CRD");
    let ns = idem_tests::create_namespace(&client, "squad")
        .await
        .expect("namespace");
    let squads: Api<Squad> = Api::namespaced(client.clone(), &ns);
    let spec = SquadSpec { note: "hi".into() };
    squads
        .create(&PostParams::default(), &Squad::new("s", spec))
        .await
        .expect("create the Squad");
    let driver = Driver::new(client.clone(), Squads);
    let watches = tokio::time::timeout(std::time::Duration::from_secs(30), driver.watch_children())
        .await
        .map_err(|_| "no child watch listed in 30 s".to_owned())
        .and_then(|w| w.map_err(|e| format!("{e}")));
    let outcome = driver
        .reconcile_once(
            client.clone(),
            Arc::new(squads.get("s").await.expect("get")),
        )
        .await;
    let squad = squads.get("s").await.expect("get");
    let conditions: Vec<String> = (squad.status.iter())
        .flat_map(|s| s.conditions.iter())
        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect();
    assert!(
        watches.is_ok()
            && outcome.is_ok()
            && conditions.iter().any(|c| c.starts_with("Ready=True")),
        "field_manager \"{}\": watches {:?}, pass {outcome:?}, conditions {conditions:#?}",
        Squad::FIELD_MANAGER,
        watches.as_ref().err()
    );
}
