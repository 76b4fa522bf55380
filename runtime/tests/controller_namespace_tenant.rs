//! Against the real control plane: a kind whose derive says
//! `tenant = namespace_label("...")`, run with `Controller::for_derived` and `Driver::run` and no
//! namespace wiring at all, is queued under the tenant its namespace's label names (never the
//! namespace's name nor the object's own label), its children are labelled with that tenant,
//! and once converged a pass makes no request: none is dispatched for the controller's user,
//! counted by the API server under a FlowSchema of that user's own, while whole passes run.
//! Its watch of namespaces starts with a streaming list (no LIST).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::user::CountedUser;
use idem_runtime::IdempotentResource;
use idem_runtime::apply::{DesiredChildren, Labels};
use idem_runtime::controller::{Controller, ControllerConfig};
use idem_runtime::metrics::Metrics;
use idem_runtime::reconciler::{ChildKinds, Driver, ReconcileError, Reconciler};
use idem_tests::metrics::requests;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::watcher;
use kube::{Api, CustomResource, CustomResourceExt, ResourceExt};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(60);
/// The label on a namespace naming its tenant.
const LABEL: &str = "test.idem.dev/team";

/// A namespaced kind whose tenant is its namespace's `test.idem.dev/team` label.
#[derive(CustomResource, IdempotentResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "test.idem.dev",
    version = "v1",
    kind = "Notebook",
    namespaced,
    status = "NotebookStatus"
)]
#[idempotent(tenant = namespace_label("test.idem.dev/team"), prune = owner_references)]
pub struct NotebookSpec {
    /// Written into the child ConfigMap.
    pub text: String,
}

/// Status of a [`Notebook`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotebookStatus {
    /// The generation the conditions describe.
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling, Stalled.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// One ConfigMap per notebook.
struct Notebooks;

impl Reconciler for Notebooks {
    type Resource = Notebook;
    fn children() -> ChildKinds<Notebook> {
        ChildKinds::new().owns::<ConfigMap>()
    }
    fn desired(&self, nb: &Notebook) -> Result<DesiredChildren, ReconcileError> {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": nb.name_any(), "namespace": nb.namespace()},
            "data": {"text": nb.spec.text},
        }))
        .map_err(|e| ReconcileError::terminal("InvalidSpec", e.to_string()))?;
        let mut children = DesiredChildren::new();
        children.add(&cm)?;
        Ok(children)
    }
}

/// The Notebook controller of namespace `ns` (no namespace wiring: only the primary kind and
/// its child kind), with its metrics in `registry`.
fn notebooks_controller(
    client: &kube::Client,
    ns: &str,
    registry: &mut Registry,
    config: ControllerConfig,
) -> Controller<Notebook> {
    Controller::for_derived(
        Api::<Notebook>::namespaced(client.clone(), ns),
        watcher::Config::default(),
    )
    .owns(
        Api::<ConfigMap>::namespaced(client.clone(), ns),
        Driver::<Notebooks>::children_config(),
    )
    .with_metrics(Metrics::new(registry))
    .with_config(config)
}

fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text
}

/// The value of the sample `series` (name and labels, exactly); 0 when absent.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
                .map(|v| v.parse().unwrap())
        })
        .unwrap_or(0.0)
}

fn is_ready(nb: Option<&Notebook>) -> bool {
    nb.and_then(|n| n.status.as_ref()).is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespace_label_names_the_tenant_and_a_converged_pass_makes_no_request() {
    let admin = idem_tests::shared().client();
    common::install_crd(&admin, Notebook::crd()).await;
    // The tenant is the label's value, distinct from the namespace's name.
    let ns = idem_tests::unique_name("nb-team");
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.clone()),
            labels: Some(BTreeMap::from([(LABEL.into(), "team-red".into())])),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let notebooks: Api<Notebook> = Api::namespaced(admin.clone(), &ns);
    let mut nb = Notebook::new(
        "nb",
        NotebookSpec {
            text: "hello".into(),
        },
    );
    // The object's own tenant label says nothing about its tenant.
    let tenant_label = Labels::of::<Notebook>().tenant();
    nb.metadata.labels = Some(BTreeMap::from([(tenant_label.into(), "team-blue".into())]));
    notebooks.create(&PostParams::default(), &nb).await.unwrap();

    // The controller runs as a user of its own, whose requests the API server counts apart.
    let user = CountedUser::create(&admin, "nb-ctl").await;
    let client = user.client();
    let mut registry = Registry::default();
    let controller = notebooks_controller(
        &client,
        &ns,
        &mut registry,
        ControllerConfig {
            workers: 1,
            // Resyncs: a pass of the converged object every ~200 ms.
            resync_period: Duration::from_millis(200),
            ..ControllerConfig::default()
        },
    );
    let lists_before = idem_tests::shared().metrics().await.expect("metrics");
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(
        Driver::new(client.clone(), Notebooks).run(controller, async {
            let _ = stopped.await;
        }),
    );

    let ready = await_condition(notebooks.clone(), "nb", is_ready);
    tokio::time::timeout(WAIT, ready)
        .await
        .expect("Ready in time")
        .unwrap();
    // The namespace watch starts with a streaming list, as the controller's other watches.
    let lists_after = idem_tests::shared().metrics().await.expect("metrics");
    let listed = |m: &str| requests(m, "LIST", "", "namespaces");
    assert_eq!(
        listed(&lists_after) - listed(&lists_before),
        0,
        "the namespace watch sent a LIST"
    );
    let cm = Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .get("nb")
        .await
        .unwrap();
    assert_eq!(
        cm.labels().get(tenant_label).map(String::as_str),
        Some("team-red"),
        "the child is labelled with the namespace label's tenant"
    );
    let dispatched = |tenant: &str| {
        value(
            &scrape(&registry),
            &format!(r#"idem_tenant_dispatches_total{{name="notebook",tenant="{tenant}"}}"#),
        )
    };
    assert!(
        dispatched("team-red") >= 1.0,
        "queued under the namespace label's tenant: {}",
        scrape(&registry)
    );
    assert_eq!(dispatched(&ns), 0.0, "never under the namespace's name");
    assert_eq!(
        dispatched("team-blue"),
        0.0,
        "never under the object's own label"
    );

    // Converged passes: every request the controller's user makes counts, from before a whole
    // pass started until after it ended (the passes of one key run one after the other). The
    // pass that wrote Ready may still be running (it publishes the Ready Event after the status
    // write): wait for one more pass to end first, so its requests are not counted.
    let passes = r#"controller_runtime_reconcile_total{controller="notebook",result="success"}"#;
    let ended = value(&scrape(&registry), passes);
    common::wait_until("the pass that wrote Ready to end", WAIT, || {
        value(&scrape(&registry), passes) >= ended + 1.0
    })
    .await;
    let before = user.requests().await;
    let done = value(&scrape(&registry), passes);
    common::wait_until("two more converged passes", WAIT, || {
        value(&scrape(&registry), passes) >= done + 2.0
    })
    .await;
    let after = user.requests().await;
    assert_eq!(
        after - before,
        0,
        "converged passes made requests (e.g. a GET of the namespace to find the tenant)"
    );

    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
}

/// The tenant label of the child ConfigMap `name` in `ns`, if it exists.
async fn child_tenant(admin: &kube::Client, ns: &str, name: &str) -> Option<String> {
    let cm = Api::<ConfigMap>::namespaced(admin.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()?;
    cm.labels().get(Labels::of::<Notebook>().tenant()).cloned()
}

/// Sets (or, with `None`, removes) the tenant label of namespace `ns`.
async fn label_namespace(admin: &kube::Client, ns: &str, tenant: Option<&str>) {
    Api::<Namespace>::all(admin.clone())
        .patch(
            ns,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {LABEL: tenant}}})),
        )
        .await
        .unwrap();
}

/// One worker, with resyncs and retries an hour apart: a pass that runs within a test's time
/// was queued by a watch event (or is the first).
fn an_hour_apart() -> ControllerConfig {
    let hour = Duration::from_secs(3600);
    ControllerConfig {
        workers: 1,
        resync_period: hour,
        backoff: idem_runtime::backoff::BackoffConfig {
            base: hour,
            cap: hour,
            ..idem_runtime::backoff::BackoffConfig::default()
        },
        ..ControllerConfig::default()
    }
}

/// An object in a namespace that names no tenant fails its passes (its children cannot be
/// labelled with a tenant); once the namespace gains the label, it is reconciled at once,
/// not after its backoff or resync (both an hour here), and when the label names another
/// tenant, its children follow. The namespace watch queues the objects of a namespace whose
/// tenant changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_that_gains_or_changes_its_tenant_wakes_its_objects() {
    let admin = idem_tests::shared().client();
    common::install_crd(&admin, Notebook::crd()).await;
    let ns = idem_tests::unique_name("nb-late");
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let notebooks: Api<Notebook> = Api::namespaced(admin.clone(), &ns);
    let nb = Notebook::new(
        "nb",
        NotebookSpec {
            text: "hello".into(),
        },
    );
    notebooks.create(&PostParams::default(), &nb).await.unwrap();

    let mut registry = Registry::default();
    let controller = notebooks_controller(&admin, &ns, &mut registry, an_hour_apart());
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(
        Driver::new(admin.clone(), Notebooks).run(controller, async {
            let _ = stopped.await;
        }),
    );

    // The first pass fails: the namespace names no tenant. Its retry is an hour away.
    let failed = r#"controller_runtime_reconcile_total{controller="notebook",result="error"}"#;
    common::wait_until("a failed pass (no tenant)", WAIT, || {
        value(&scrape(&registry), failed) >= 1.0
    })
    .await;
    assert_eq!(child_tenant(&admin, &ns, "nb").await, None, "no child yet");

    label_namespace(&admin, &ns, Some("team-red")).await;
    let ready = await_condition(notebooks.clone(), "nb", is_ready);
    tokio::time::timeout(WAIT, ready)
        .await
        .expect("Ready once the namespace names a tenant, before the hour's retry")
        .unwrap();
    assert_eq!(
        child_tenant(&admin, &ns, "nb").await.as_deref(),
        Some("team-red")
    );

    // Another tenant: the children are labelled with it, with no change to the object.
    label_namespace(&admin, &ns, Some("team-blue")).await;
    let tenant = Labels::of::<Notebook>().tenant();
    let moved = await_condition(
        Api::<ConfigMap>::namespaced(admin.clone(), &ns),
        "nb",
        move |cm: Option<&ConfigMap>| {
            cm.and_then(|cm| cm.labels().get(tenant))
                .is_some_and(|t| t == "team-blue")
        },
    );
    tokio::time::timeout(WAIT, moved)
        .await
        .expect("the child labelled with the namespace's new tenant")
        .unwrap();

    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
}

/// Creates namespace `ns` labelled as tenant `team-red`'s, controlled (by ownerReference) by
/// an object of a kind the garbage collector cannot resolve (so it keeps the namespace), with
/// uid `uid`.
async fn claimed_namespace(admin: &kube::Client, ns: &str, uid: &str) {
    let body = json!({"metadata": {
        "name": ns,
        "labels": {LABEL: "team-red"},
        "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "Widget",
            "name": "red", "uid": uid, "controller": true}],
    }});
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
}

/// With an owner check, a labelled namespace names its tenant only while the check accepts
/// the uid its controller ownerReference carries, judged at each read (here a uid the test
/// says is the tenant object's); with a gate on the workers, no pass runs before the gate
/// opens, though the caches are synced, and the first pass after it finds the tenant. (With
/// the gate taken out, the test still passes when the first pass happens to start after the
/// check accepts the namespace, microseconds after the caches synced: what is certain is
/// only that with the gate no pass can run before it opens.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_check_judges_each_read_and_the_workers_wait_for_their_gate() {
    let admin = idem_tests::shared().client();
    common::install_crd(&admin, Notebook::crd()).await;
    let (ok, forged) = (
        idem_tests::unique_name("nb-owned"),
        idem_tests::unique_name("nb-forged"),
    );
    let red_uid = "6f1c1f0e-0000-4000-8000-00000000a11c";
    claimed_namespace(&admin, &ok, red_uid).await;
    claimed_namespace(&admin, &forged, "6f1c1f0e-0000-4000-8000-0000000bad00").await;
    let notebooks: Api<Notebook> = Api::namespaced(admin.clone(), &ok);
    let nb = Notebook::new("nb", NotebookSpec { text: "hi".into() });
    notebooks.create(&PostParams::default(), &nb).await.unwrap();

    // The uid the test says is team-red's object: none yet.
    let known = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (gate, gated) = tokio::sync::watch::channel(false);
    let (synced_tx, mut synced) = tokio::sync::watch::channel(false);
    let mut registry = Registry::default();
    let check = known.clone();
    let controller = notebooks_controller(&admin, &ok, &mut registry, an_hour_apart())
        .namespace_tenant_owner(move |tenant, uid| {
            tenant.as_str() == "team-red" && *check.lock().unwrap() == uid
        })
        .workers_after(gated)
        .with_synced_signal(synced_tx);
    let tenants = controller
        .namespace_tenants()
        .expect("a namespace_label kind");
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(
        Driver::new(admin.clone(), Notebooks).run(controller, async {
            let _ = stopped.await;
        }),
    );

    synced.wait_for(|s| *s).await.unwrap();
    let passes = |result: &str| {
        value(
            &scrape(&registry),
            &format!(
                r#"controller_runtime_reconcile_total{{controller="notebook",result="{result}"}}"#
            ),
        )
    };
    assert_eq!(
        passes("success") + passes("error"),
        0.0,
        "a pass ran before the gate opened"
    );
    // Labelled, but the check accepts no uid yet: nobody's.
    assert_eq!(tenants.get(&ok), None);
    assert_eq!(tenants.get(&forged), None);
    // Now the tenant object's uid is known: judged again at the next read.
    *known.lock().unwrap() = red_uid.to_owned();
    let red = idem_runtime::TenantKey::new("team-red");
    assert_eq!(tenants.get(&ok), Some(red.clone()));
    assert_eq!(tenants.get(&forged), None, "another uid names no tenant");
    let all = tenants.all();
    assert!(all.contains(&(ok.clone(), red)), "{all:?}");
    assert!(!all.iter().any(|(ns, _)| *ns == forged), "{all:?}");

    gate.send(true).unwrap();
    let ready = await_condition(notebooks.clone(), "nb", is_ready);
    tokio::time::timeout(WAIT, ready)
        .await
        .expect("Ready at the first pass after the gate opened")
        .unwrap();
    assert_eq!(
        passes("error"),
        0.0,
        "a pass ran before the namespace was judged its tenant's"
    );
    assert_eq!(
        child_tenant(&admin, &ok, "nb").await.as_deref(),
        Some("team-red")
    );

    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    let namespaces = Api::<Namespace>::all(admin.clone());
    for ns in [&ok, &forged] {
        let _ = namespaces
            .delete(ns, &kube::api::DeleteParams::default())
            .await;
    }
}
