//! Stale reads are safe: a controller whose watch events arrive 4 s late (as behind a lagging
//! API server) sees a spec go [x] → [x, y] → [x] at once; its pass of the stale [x, y] creates
//! `y`, and the pass of [x] that follows must still prune it (its cached primary predates the
//! status write that recorded `y`): no leaked child, the record holding exactly `x`, `Ready` at
//! the last generation.

use std::time::Duration;

use idem_runtime::IdempotentResource;
use idem_runtime::apply::{CreatedChild, DesiredChildren};
use idem_runtime::controller::{Controller, ControllerConfig};
use idem_runtime::reconciler::{ChildKinds, Driver, ReconcileError, Reconciler};
use idem_tests::faults::Faults;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

/// How late the controller's watch events arrive.
const DELAY: Duration = Duration::from_secs(4);
/// Generous: a loaded two-core machine.
const WAIT: Duration = Duration::from_secs(90);

/// A rack: one ConfigMap `<rack>-<item>` per item, with a record of the children it created.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "test.idem.dev",
    version = "v1",
    kind = "Rack",
    namespaced,
    status = "RackStatus"
)]
#[idempotent(tenant = namespace, field_manager = "idem-stale-test")]
pub struct RackSpec {
    pub items: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RackStatus {
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub created_children: Vec<CreatedChild>,
}

struct Racks;

impl Reconciler for Racks {
    type Resource = Rack;

    fn children() -> ChildKinds<Rack> {
        ChildKinds::new().owns::<ConfigMap>()
    }

    fn desired(&self, rack: &Rack) -> Result<DesiredChildren, ReconcileError> {
        let mut d = DesiredChildren::new();
        d.prune_kind::<ConfigMap>();
        for item in &rack.spec.items {
            d.add(&ConfigMap {
                metadata: ObjectMeta {
                    name: Some(format!("{}-{item}", rack.name_any())),
                    ..ObjectMeta::default()
                },
                data: Some([("item".to_owned(), item.clone())].into()),
                ..ConfigMap::default()
            })?;
        }
        Ok(d)
    }

    fn child_record(status: &mut RackStatus) -> Option<&mut Vec<CreatedChild>> {
        Some(&mut status.created_children)
    }
}

/// `(observedGeneration, Ready status)` of the rack, as the API server has it.
fn readiness(rack: &Rack) -> (Option<i64>, Option<String>) {
    let status = rack.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone());
    (status.observed_generation, ready)
}

async fn wait_ready_at(racks: &Api<Rack>, name: &str, generation: i64) -> Rack {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let rack = racks.get(name).await.expect("get the rack");
        if readiness(&rack) == (Some(generation), Some("True".into())) {
            return rack;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {WAIT:?} for Ready at generation {generation}; status {:?}",
            rack.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_flip_seen_late_leaks_no_child_and_keeps_the_record_whole() {
    let _reading = super::common::METRICS_LOCK.read().await;
    let admin = super::common::client();
    idem_tests::install_crd(&admin, &Rack::crd())
        .await
        .expect("install the Rack CRD");
    let ns = super::common::namespace(&admin, "stale").await;
    let racks: Api<Rack> = Api::namespaced(admin.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);

    // The controller's client: every watch event it receives is delayed (once converged).
    let faults = Faults::new();
    let client = faults
        .client(idem_tests::shared().config())
        .expect("a client");
    let controller = Controller::for_derived(
        Api::<Rack>::namespaced(client.clone(), &ns),
        watcher::Config::default(),
    )
    .owns(
        Api::<ConfigMap>::namespaced(client.clone(), &ns),
        Driver::<Racks>::children_config(),
    )
    .with_config(ControllerConfig {
        resync_period: Duration::ZERO,
        ..ControllerConfig::default()
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(Driver::new(client, Racks).run(controller, async {
        let _ = stopped.await;
    }));

    let name = "rack";
    let spec = |items: &[&str]| RackSpec {
        items: items.iter().map(|i| (*i).to_owned()).collect(),
    };
    racks
        .create(&PostParams::default(), &Rack::new(name, spec(&["x"])))
        .await
        .expect("create the rack");
    wait_ready_at(&racks, name, 1).await;

    faults.delay_watches(DELAY);
    let flip = |items: &[&str]| serde_json::json!({"spec": spec(items)});
    let pp = PatchParams::default();
    racks
        .patch(name, &pp, &Patch::Merge(&flip(&["x", "y"])))
        .await
        .expect("spec [x, y]");
    let last = racks
        .patch(name, &pp, &Patch::Merge(&flip(&["x"])))
        .await
        .expect("spec [x]");
    let generation = last.metadata.generation.expect("a generation");
    assert_eq!(generation, 3);

    // Ready at the last generation: by then the pass of [x] has pruned what a stale pass made.
    let rack = wait_ready_at(&racks, name, generation).await;
    let x = cms.get(&format!("{name}-x")).await.expect("child x");
    let y = cms
        .get_opt(&format!("{name}-y"))
        .await
        .expect("get child y");
    let status = rack.status.clone().unwrap_or_default();
    let recorded: Vec<(String, String)> = status
        .created_children
        .iter()
        .map(|c| (c.name.clone(), c.uid.clone()))
        .collect();
    eprintln!(
        "Ready at generation {generation}; child y: {:?}; record: {recorded:?}",
        y.as_ref().map(|y| y.metadata.uid.clone())
    );
    assert!(
        y.as_ref()
            .is_none_or(|y| y.metadata.deletion_timestamp.is_some()),
        "the child of the stale generation leaked: {name}-y is still there while the rack \
         is Ready at generation {generation} (record {recorded:?})"
    );
    assert_eq!(
        recorded,
        vec![(format!("{name}-x"), x.uid().unwrap_or_default())],
        "the record names exactly the children there are"
    );

    stop.send(()).expect("stop the controller");
    let report = run.await.expect("join").expect("run");
    assert!(report.drained(), "{report:?}");
}
