//! Against the real control plane (kube-controller-manager runs the StatefulSet controller and
//! kwok's fake nodes make the pods Ready): a readiness that reads a child's status.
//!
//! A `Database` owns a StatefulSet; its reconciler declares StatefulSet in
//! `Reconciler::children` with `owns_reading_status` and its `ready()` reads `status.readyReplicas` from the
//! `Children` it is given — no `reconcile()` override, no `OwnsOptions`. The first pass
//! creates the StatefulSet, whose pods no node takes until the test labels one (`Reconciling`);
//! with no resync and no requeue, only
//! the StatefulSet's status changes can reconcile the Database again, so reaching `Ready`
//! proves the child's watch keeps the status and its changes reconcile the owner. Reading a
//! kind whose status is not declared read is a terminal `StatusNotDeclared` error naming the
//! fix, and `Driver::run` refuses a declared kind the controller does not own.

mod common;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use idem_runtime::IdempotentResource;
use idem_runtime::apply::DesiredChildren;
use idem_runtime::controller::{Action, Controller, ControllerConfig, ControllerError};
use idem_runtime::reconciler::{
    ChildKinds, Children, Driver, KIND_NOT_DECLARED, Outcome, ReconcileError, Reconciler,
    STATUS_NOT_DECLARED,
};
use idem_runtime::status::Readiness;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(90);

/// The label a fake node needs for a Database's pods to be scheduled on it: its value is the
/// Database's namespace, so a test decides when its StatefulSet's pods can become ready.
const NODE_LABEL: &str = "test.idem.dev/databases-of";

/// A database: a StatefulSet of `replicas` pods.
#[derive(CustomResource, IdempotentResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "test.idem.dev",
    version = "v1",
    kind = "Database",
    namespaced,
    status = "DatabaseStatus"
)]
#[idempotent(tenant = namespace, prune = owner_references)]
pub struct DatabaseSpec {
    /// Pods wanted.
    pub replicas: i32,
}

/// Status of a [`Database`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseStatus {
    /// The generation the conditions describe.
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling, Stalled.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

fn statefulset(db: &Database) -> Result<DesiredChildren, ReconcileError> {
    let name = db.name_any();
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": db.namespace()},
        "spec": {
            "replicas": db.spec.replicas,
            "selector": {"matchLabels": {"db": name}},
            "template": {
                "metadata": {"labels": {"db": name}},
                // Scheduled only once the test labels a node for this namespace.
                "spec": {
                    "containers": [{"name": "db", "image": "example.invalid/db:1"}],
                    "nodeSelector": {NODE_LABEL: db.namespace()},
                },
            },
        },
    }))
    .map_err(|e| ReconcileError::terminal("InvalidSpec", e.to_string()))?;
    let mut children = DesiredChildren::new();
    children.add(&sts)?;
    Ok(children)
}

/// Ready once the StatefulSet has as many ready replicas as the Database wants.
fn readiness(db: &Database, children: &Children<'_>) -> Result<Readiness, ReconcileError> {
    let applied = children.report().readiness();
    if !matches!(applied, Readiness::Ready { .. }) {
        return Ok(applied);
    }
    let sts = children.get::<StatefulSet>(&db.name_any())?;
    let ready = sts
        .and_then(|s| s.status)
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let message = format!("{ready}/{} replicas ready", db.spec.replicas);
    Ok(if ready >= db.spec.replicas {
        Readiness::Ready {
            reason: "Available".into(),
            message,
        }
    } else {
        Readiness::Reconciling {
            reason: "Progressing".into(),
            message,
        }
    })
}

/// Reads the StatefulSet's status, as it says it does.
struct Databases;

impl Reconciler for Databases {
    type Resource = Database;
    fn desired(&self, db: &Database) -> Result<DesiredChildren, ReconcileError> {
        statefulset(db)
    }
    fn children() -> ChildKinds<Database> {
        ChildKinds::new().owns_reading_status::<StatefulSet>()
    }
    fn ready(
        &self,
        db: &Database,
        children: &Children<'_>,
    ) -> Result<Outcome<Database>, ReconcileError> {
        Ok(Outcome::new(readiness(db, children)?))
    }
}

/// Reads the StatefulSet's status without saying so.
struct Forgetful;

impl Reconciler for Forgetful {
    type Resource = Database;
    fn children() -> ChildKinds<Database> {
        ChildKinds::new().owns::<StatefulSet>()
    }
    fn desired(&self, db: &Database) -> Result<DesiredChildren, ReconcileError> {
        statefulset(db)
    }
    fn ready(
        &self,
        db: &Database,
        children: &Children<'_>,
    ) -> Result<Outcome<Database>, ReconcileError> {
        Ok(Outcome::new(readiness(db, children)?))
    }
}

/// The StatefulSet, without declaring its kind.
struct Undeclared;

impl Reconciler for Undeclared {
    type Resource = Database;
    fn desired(&self, db: &Database) -> Result<DesiredChildren, ReconcileError> {
        statefulset(db)
    }
}

fn condition<'a>(db: &'a Database, type_: &str) -> Option<&'a Condition> {
    db.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

async fn setup(prefix: &str) -> (kube::Client, String) {
    let client = idem_tests::shared().client();
    common::install_crd(&client, Database::crd()).await;
    let ns = common::namespace(&client, prefix).await;
    (client, ns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_the_child_status_without_a_reconcile_override() {
    let (client, ns) = setup("db-ready").await;
    let dbs: Api<Database> = Api::namespaced(client.clone(), &ns);
    let controller = Controller::for_derived(dbs.clone(), watcher::Config::default())
        .owns(
            Api::<StatefulSet>::namespaced(client.clone(), &ns),
            Driver::<Databases>::children_config(),
        )
        .with_config(ControllerConfig {
            // Only events reconcile: no resync.
            resync_period: Duration::ZERO,
            ..ControllerConfig::default()
        });
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(
        Driver::new(client.clone(), Databases).run(controller, async {
            let _ = stopped.await;
        }),
    );
    // Every status the Database goes through, from a watch established before it exists.
    let (listed, is_listed) = oneshot::channel::<()>();
    let seen = tokio::spawn({
        let dbs = dbs.clone();
        async move {
            let events = watcher(dbs, watcher::Config::default().fields("metadata.name=db"));
            futures::pin_mut!(events);
            let mut listed = Some(listed);
            let mut seen = Vec::new();
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = listed.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(watcher::Event::Apply(db) | watcher::Event::InitApply(db)) => {
                        let ready = condition(&db, "Ready").is_some_and(|c| c.status == "True");
                        seen.push(db);
                        if ready {
                            return seen;
                        }
                    }
                    _ => {}
                }
            }
            seen
        }
    });
    is_listed.await.expect("the Database watch listed");
    dbs.create(
        &PostParams::default(),
        &Database::new("db", DatabaseSpec { replicas: 2 }),
    )
    .await
    .unwrap();
    // No node takes its pods yet: the first pass finds no ready replica.
    idem_tests::eventually("the Database Reconciling", || async {
        let db = dbs.get("db").await.map_err(|e| e.to_string())?;
        let reconciling = condition(&db, "Reconciling").is_some_and(|c| c.status == "True");
        reconciling.then_some(()).ok_or(format!("{:?}", db.status))
    })
    .await;
    // Now a fake node takes them; only the StatefulSet's status changes can tell the Database.
    let nodes: Api<Node> = Api::all(client.clone());
    let fake = (nodes
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter())
    .find(|n| {
        n.annotations()
            .contains_key(idem_tests::KWOK_NODE_ANNOTATION)
    })
    .expect("a fake node");
    let label = json!({"metadata": {"labels": {NODE_LABEL: ns}}});
    nodes
        .patch(
            &fake.name_any(),
            &PatchParams::default(),
            &Patch::Merge(label),
        )
        .await
        .unwrap();
    let before = tokio::time::timeout(WAIT, seen)
        .await
        .unwrap_or_else(|_| panic!("the Database did not become Ready within {WAIT:?}"))
        .unwrap();
    let progressing: Vec<String> = before
        .iter()
        .filter_map(|d| condition(d, "Reconciling"))
        .filter(|c| c.status == "True")
        .map(|c| c.message.clone())
        .collect();
    assert!(
        !progressing.is_empty(),
        "Reconciling before Ready (the first pass saw no status): {before:?}"
    );
    let ready = dbs.get("db").await.unwrap();
    let c = condition(&ready, "Ready").expect("Ready");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("True", "Available", "2/2 replicas ready"),
        "after {progressing:?}"
    );
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
}

#[tokio::test]
async fn reading_an_undeclared_kind_stalls_with_the_fix() {
    let (client, ns) = setup("db-forgot").await;
    let dbs: Api<Database> = Api::namespaced(client.clone(), &ns);
    let db = dbs
        .create(
            &PostParams::default(),
            &Database::new("db", DatabaseSpec { replicas: 1 }),
        )
        .await
        .unwrap();
    let action = Driver::new(client.clone(), Forgetful)
        .reconcile_once(client.clone(), Arc::new(db))
        .await
        .expect("a terminal error is handled");
    assert_eq!(action, Action::terminal());
    let stored = dbs.get("db").await.unwrap();
    let c = condition(&stored, "Stalled").expect("Stalled");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", STATUS_NOT_DECLARED)
    );
    assert!(
        c.message.contains(".owns_reading_status::<StatefulSet>()"),
        "{}",
        c.message
    );
}

#[tokio::test]
async fn the_driver_refuses_a_status_kind_the_controller_does_not_own() {
    let client = idem_tests::shared().client();
    // A namespace no test makes: were the check to let the controller run, it would find none
    // of the other tests' Databases to reconcile (and the timeout would end the test).
    let controller = Controller::for_derived(
        Api::<Database>::namespaced(client.clone(), &idem_tests::unique_name("db-refused")),
        watcher::Config::default(),
    );
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        Driver::new(client, Databases).run(controller, futures::future::pending()),
    )
    .await
    .expect("refused before it runs");
    match result {
        Err(e @ ControllerError::KindNotOwned { .. }) => {
            assert!(e.to_string().contains("StatefulSet"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

/// A desired child of a kind `Reconciler::children` does not declare (no watch would serve it:
/// a GET per pass, its changes unnoticed) stalls its owner at once, naming the fix, before any
/// child is written.
#[tokio::test]
async fn a_child_of_an_undeclared_kind_stalls_naming_the_fix() {
    let (client, ns) = setup("db-undeclared").await;
    let dbs: Api<Database> = Api::namespaced(client.clone(), &ns);
    let db = dbs
        .create(
            &PostParams::default(),
            &Database::new("db", DatabaseSpec { replicas: 1 }),
        )
        .await
        .unwrap();
    let action = Driver::new(client.clone(), Undeclared)
        .reconcile_once(client.clone(), Arc::new(db))
        .await
        .expect("a terminal error is handled");
    assert_eq!(action, Action::terminal());
    let stored = dbs.get("db").await.unwrap();
    let c = condition(&stored, "Stalled").expect("Stalled");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", KIND_NOT_DECLARED)
    );
    assert!(
        c.message.contains(".owns::<StatefulSet>()"),
        "{}",
        c.message
    );
    let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns);
    assert!(
        sts.get_opt("db").await.unwrap().is_none(),
        "no child was written"
    );
}
