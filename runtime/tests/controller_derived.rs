//! Against the real control plane: the controller of a kind with
//! `#[derive(IdempotentResource)]` (`Controller::for_derived`) uses what the derive says — the
//! tenant from `#[idempotent(tenant = field(owner))]`, and no reconcile when only an
//! `#[idempotent(skip)]` field changed.
//!
//! "No reconcile" is checked with a barrier: with one worker and every object in one tenant,
//! keys are reconciled in the order their watch events arrive, so once a sentinel edited
//! *after* the skip-only edit has been reconciled, a reconcile caused by that edit would
//! already have run.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{namespace, wait_until};
use idem_runtime::IdempotentResource;
use idem_runtime::controller::{Action, Attempt, Controller, ControllerConfig};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(60);

/// A derived test kind whose tenant is a spec field and which has a skipped field.
#[derive(CustomResource, IdempotentResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "test.idem.dev",
    version = "v1",
    kind = "Gadget",
    namespaced,
    status = "GadgetStatus"
)]
#[idempotent(tenant = field(owner), prune = owner_references)]
pub struct GadgetSpec {
    /// Names the tenant.
    pub owner: String,
    /// Desired state.
    pub size: i64,
    /// Not desired state: editing it alone must not reconcile.
    #[idempotent(skip)]
    pub note: String,
}

/// Status of a [`Gadget`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GadgetStatus {
    /// Unused here.
    pub observed_generation: Option<i64>,
    /// Unused here.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// (name, tenant, size) per reconcile, in order.
type Log = Mutex<Vec<(String, String, i64)>>;

async fn record(obj: Arc<Gadget>, log: Arc<Log>, attempt: Attempt) -> Result<Action, kube::Error> {
    log.lock().unwrap().push((
        obj.name_any(),
        attempt.tenant.as_str().to_string(),
        obj.spec.size,
    ));
    Ok(Action::await_change())
}

fn count(log: &Log, name: &str) -> usize {
    log.lock().unwrap().iter().filter(|e| e.0 == name).count()
}

fn spec(size: i64, note: &str) -> GadgetSpec {
    GadgetSpec {
        owner: "team-blue".into(),
        size,
        note: note.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_derived_tenant_is_used_and_a_skip_field_edit_does_not_reconcile() {
    let client = idem_tests::shared().client();
    common::install_crd(&client, Gadget::crd()).await;
    let ns = namespace(&client, "ctl-derived").await;
    let gadgets: Api<Gadget> = Api::namespaced(client.clone(), &ns);
    let log: Arc<Log> = Arc::new(Mutex::new(Vec::new()));
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::for_derived(gadgets.clone(), watcher::Config::default())
            .with_config(ControllerConfig {
                workers: 1,
                per_tenant_cap: Some(1),
                resync_period: Duration::ZERO,
                ..ControllerConfig::default()
            })
            .run(record, Arc::clone(&log), async {
                let _ = stopped.await;
            }),
    );
    for name in ["g1", "zz-sentinel"] {
        gadgets
            .create(&PostParams::default(), &Gadget::new(name, spec(1, "a")))
            .await
            .unwrap();
    }
    wait_until("both first reconciles", WAIT, || {
        count(&log, "g1") == 1 && count(&log, "zz-sentinel") == 1
    })
    .await;
    // The tenant is the spec field, not the namespace (the default of `Controller::new`).
    assert!(
        log.lock().unwrap().iter().all(|e| e.1 == "team-blue"),
        "{:?}",
        log.lock().unwrap()
    );

    // Only the skipped field changes (metadata.generation is bumped all the same).
    let note = json!({"spec": {"note": "b"}});
    let edited = gadgets
        .patch("g1", &PatchParams::default(), &Patch::Merge(&note))
        .await
        .unwrap();
    assert_eq!(edited.metadata.generation, Some(2));
    // Barrier: a real change of the sentinel, after the skip-only edit.
    let size = json!({"spec": {"size": 2}});
    gadgets
        .patch("zz-sentinel", &PatchParams::default(), &Patch::Merge(&size))
        .await
        .unwrap();
    wait_until("the sentinel's reconcile", WAIT, || {
        count(&log, "zz-sentinel") == 2
    })
    .await;
    assert_eq!(
        count(&log, "g1"),
        1,
        "an edit of only a skip field reconciled: {:?}",
        log.lock().unwrap()
    );

    // A change of a compared field still reconciles.
    gadgets
        .patch("g1", &PatchParams::default(), &Patch::Merge(&size))
        .await
        .unwrap();
    wait_until("g1's reconcile of size 2", WAIT, || {
        log.lock().unwrap().iter().any(|e| e.0 == "g1" && e.2 == 2)
    })
    .await;
    stop.send(()).unwrap();
    controller.await.unwrap().unwrap();
}
