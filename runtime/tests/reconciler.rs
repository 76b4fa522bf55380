//! Against the real control plane: the example `BaseTenant` (runtime/examples/base_tenant.rs)
//! on the [`Reconciler`] driver — one reconcile converges (4 children, Ready, observedGeneration,
//! the crate's field manager); a second writes nothing; a terminal error stalls at once and
//! creates nothing; repeated failures stall with `ReconcileFailed`; the controller-driven
//! driver repairs a deleted child; a finalizer's cleanup hook runs before the object goes.

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use base_tenant::{BaseTenant, BaseTenantSpec, BaseTenants};
use idem_runtime::apply::MANAGED_BY_LABEL;
use idem_runtime::controller::{Action, Attempt, Controller, Reason};
use idem_runtime::queue::Priority;
use idem_runtime::reconciler::{
    ChildKinds, Cleanup, Driver, DriverConfig, Pass, ReconcileError, Reconciler, children_config,
};
use idem_runtime::{ObjectKey, TenantKey};
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::Mutex;

const WAIT: Duration = Duration::from_secs(60);

/// Tests share one CRD install.
static SETUP: Mutex<bool> = Mutex::const_new(false);

async fn client() -> Client {
    let client = idem_tests::shared().client();
    let mut done = SETUP.lock().await;
    if !*done {
        base_tenant::install_crd(&client)
            .await
            .expect("install the CRD");
        *done = true;
    }
    client
}

fn spec(owners: &[&str]) -> BaseTenantSpec {
    BaseTenantSpec {
        owners: owners.iter().map(|s| s.to_string()).collect(),
        cpu: "2".into(),
        memory: "4Gi".into(),
    }
}

async fn create(client: &Client, prefix: &str, spec: BaseTenantSpec) -> Arc<BaseTenant> {
    create_for(client, prefix, None, spec).await
}

/// Creates a BaseTenant named from `prefix`, labelled for the controller of `group` if given.
async fn create_for(
    client: &Client,
    prefix: &str,
    group: Option<&str>,
    spec: BaseTenantSpec,
) -> Arc<BaseTenant> {
    let mut tenant = BaseTenant::new(&idem_tests::unique_name(prefix), spec);
    if let Some(group) = group {
        tenant
            .labels_mut()
            .insert(GROUP_LABEL.to_owned(), group.to_owned());
    }
    let api: Api<BaseTenant> = Api::all(client.clone());
    Arc::new(
        api.create(&PostParams::default(), &tenant)
            .await
            .expect("create"),
    )
}

/// Labels the BaseTenants of one test's controller.
const GROUP_LABEL: &str = "test.idem.dev/controller";

/// A controller of the BaseTenants labelled for `group` only: the other tests here drive their
/// BaseTenants by hand and assert what their own passes wrote, which a controller of every
/// BaseTenant would race.
fn controller_of(client: &Client, group: &str) -> Controller<BaseTenant> {
    Controller::for_reconciler_with::<BaseTenants>(
        client,
        watcher::Config::default().labels(&format!("{GROUP_LABEL}={group}")),
        children_config::<BaseTenant>(),
    )
}

async fn get(client: &Client, name: &str) -> BaseTenant {
    Api::<BaseTenant>::all(client.clone())
        .get(name)
        .await
        .expect("get")
}

fn condition(t: &BaseTenant, type_: &str) -> (String, String, String) {
    let c = t
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("no {type_} condition: {t:?}"));
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// Whether `t`'s status has a condition of type `type_` (a status may hold only the record).
fn has_condition(t: &BaseTenant, type_: &str) -> bool {
    (t.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == type_))
}

/// resourceVersions of the four children of tenant `name`.
async fn children(client: &Client, name: &str) -> Vec<String> {
    let ns = Api::<Namespace>::all(client.clone())
        .get(name)
        .await
        .expect("namespace");
    assert_eq!(
        ns.labels().get(MANAGED_BY_LABEL).map(String::as_str),
        Some("idem-runtime"),
        "the crate's name is the field manager, not idem-operator"
    );
    let quota = Api::<ResourceQuota>::namespaced(client.clone(), name)
        .get("quota")
        .await;
    let limits = Api::<LimitRange>::namespaced(client.clone(), name)
        .get("limits")
        .await;
    let owners = Api::<RoleBinding>::namespaced(client.clone(), name)
        .get("owners")
        .await;
    vec![
        ns.resource_version().unwrap(),
        quota.expect("quota").resource_version().unwrap(),
        limits.expect("limits").resource_version().unwrap(),
        owners.expect("owners").resource_version().unwrap(),
    ]
}

#[tokio::test]
async fn one_reconcile_converges_and_a_second_writes_nothing() {
    let client = client().await;
    let tenant = create(&client, "bt-conv", spec(&["alice"])).await;
    let driver = Driver::new(client.clone(), BaseTenants);
    let action = driver
        .reconcile_once(client.clone(), Arc::clone(&tenant))
        .await
        .expect("reconcile");
    assert_eq!(action, Action::await_change());
    let name = tenant.name_any();
    let stored = get(&client, &name).await;
    assert_eq!(condition(&stored, "Ready").0, "True");
    let (reconciling, reason, _) = condition(&stored, "Reconciling");
    assert_eq!(reconciling, "False");
    assert_ne!(reason, condition(&stored, "Ready").1, "distinct reasons");
    assert_eq!(stored.status.as_ref().unwrap().observed_generation, Some(1));
    let before = children(&client, &name).await;

    driver
        .reconcile_once(client.clone(), Arc::new(stored.clone()))
        .await
        .expect("second reconcile");
    assert_eq!(children(&client, &name).await, before, "no child written");
    let again = get(&client, &name).await;
    assert_eq!(
        again.resource_version(),
        stored.resource_version(),
        "no status write"
    );
}

/// The log lines (WARN and above) written on this thread while `f` runs.
async fn warnings_of<T>(f: impl Future<Output = T>) -> (T, String) {
    let (subscriber, lines) = idem_tests::logs::subscriber(tracing::Level::WARN);
    // The test's runtime is current-thread: the whole future runs on this thread.
    let _guard = tracing::subscriber::set_default(subscriber);
    let out = f.await;
    (out, lines.text())
}

#[tokio::test]
async fn a_terminal_error_stalls_at_once_and_creates_nothing() {
    let client = client().await;
    let tenant = create(&client, "bt-term", spec(&[])).await;
    let driver = Driver::new(client.clone(), BaseTenants);
    let (action, warned) =
        warnings_of(driver.reconcile_once(client.clone(), Arc::clone(&tenant))).await;
    let action = action.expect("a terminal error is handled: Stalled, no retry");
    assert!(
        warned.contains("terminal reconcile error"),
        "said when it becomes the status: {warned:?}"
    );
    assert_eq!(
        action,
        Action::terminal(),
        "a handled terminal error: no requeue, no retry, waits for a change"
    );
    let stored = get(&client, &tenant.name_any()).await;
    let (status, reason, message) = condition(&stored, "Stalled");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "NoOwners"));
    assert_eq!(
        message, "spec.owners is empty: name at least one user",
        "the reason is the condition's, not repeated"
    );
    let ns = Api::<Namespace>::all(client.clone())
        .get_opt(&tenant.name_any())
        .await;
    assert!(ns.unwrap().is_none(), "nothing created");
    // A resync meets the same error on the unchanged object: handled the same, not said again.
    let (again, warned) =
        warnings_of(driver.reconcile_once(client.clone(), Arc::new(stored))).await;
    assert_eq!(again.expect("handled"), Action::terminal());
    assert!(
        !warned.contains("terminal reconcile error"),
        "said again on a resync: {warned:?}"
    );
}

/// The attempt of `tenant` after `failures` failed reconciles in a row.
fn retry(tenant: &BaseTenant, failures: u32) -> Attempt {
    Attempt {
        key: ObjectKey::cluster("BaseTenant", &tenant.name_any()),
        tenant: TenantKey::new(tenant.name_any()),
        failures,
        priority: Priority::Event,
        reason: Reason::Error,
    }
}

/// The attempt of a first reconcile of BaseTenant `name` after it changed.
fn changed(name: &str) -> Attempt {
    Attempt {
        key: ObjectKey::cluster("BaseTenant", name),
        tenant: TenantKey::new(name),
        failures: 0,
        priority: Priority::Event,
        reason: Reason::ObjectChanged,
    }
}

/// Asserts `stored` is `Stalled` by `failures` or more failed reconciles in a row.
fn assert_stalled_by(stored: &BaseTenant, failures: u32) {
    let (status, reason, message) = condition(stored, "Stalled");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ReconcileFailed")
    );
    let said = format!("{failures} or more reconciles failed in a row");
    assert!(message.starts_with(&said), "{message}");
}

/// `DriverConfig::stalled_after` sets the number of failures in a row that stall the object.
#[tokio::test]
async fn stalled_after_sets_how_many_failures_in_a_row_stall() {
    let client = client().await;
    let tenant = create(&client, "bt-fail2", spec(&["bob"])).await;
    let driver = Arc::new(
        Driver::new(client.clone(), BaseTenants).with_config(DriverConfig {
            timeout: Some(Duration::ZERO),
            stalled_after: 2,
            ..DriverConfig::default()
        }),
    );
    let attempt = |failures| retry(&tenant, failures);
    let first = Driver::reconcile(Arc::clone(&tenant), Arc::clone(&driver), attempt(0)).await;
    assert!(first.is_err(), "{first:?}");
    assert!(
        get(&client, &tenant.name_any()).await.status.is_none(),
        "not stalled after 1"
    );
    let second = Driver::reconcile(Arc::clone(&tenant), Arc::clone(&driver), attempt(1)).await;
    assert!(second.is_err(), "{second:?}");
    assert_stalled_by(&get(&client, &tenant.name_any()).await, 2);
}

#[tokio::test]
async fn failures_in_a_row_stall_with_reconcile_failed_and_keep_retrying() {
    let client = client().await;
    let tenant = create(&client, "bt-fail", spec(&["bob"])).await;
    // A pass that can never finish in time: every attempt fails with Timeout.
    let driver = Arc::new(
        Driver::new(client.clone(), BaseTenants).with_config(DriverConfig {
            timeout: Some(Duration::ZERO),
            ..DriverConfig::default()
        }),
    );
    let attempt = |failures| retry(&tenant, failures);
    let first = Driver::reconcile(Arc::clone(&tenant), Arc::clone(&driver), attempt(0)).await;
    assert!(
        matches!(first, Err(ReconcileError::Timeout(_))),
        "{first:?}"
    );
    assert!(
        get(&client, &tenant.name_any()).await.status.is_none(),
        "not stalled after 1"
    );
    let fifth = Driver::reconcile(Arc::clone(&tenant), Arc::clone(&driver), attempt(4)).await;
    assert!(
        fifth.is_err(),
        "still an error: the controller keeps retrying"
    );
    let stored = get(&client, &tenant.name_any()).await;
    assert_stalled_by(&stored, 5);
    let (_, ready_reason, _) = condition(&stored, "Ready");
    assert_eq!(ready_reason, "ReconcileFailed");
    assert_ne!(condition(&stored, "Reconciling").1, "ReconcileFailed");
    // The 6th to 9th failures with the same error leave the message as it is (the status
    // writer writes nothing for an unchanged status); the 10th says 10. (Not checked by
    // resourceVersion: a pass cut at 0 ns may still have sent a write of its own.)
    for failures in 5..9 {
        let again = Driver::reconcile(
            Arc::new(stored.clone()),
            Arc::clone(&driver),
            attempt(failures),
        );
        assert!(again.await.is_err());
        let now = get(&client, &tenant.name_any()).await;
        let (_, _, message) = condition(&now, "Stalled");
        assert!(
            message.starts_with("5 or more reconciles failed in a row"),
            "after {} failures: {message}",
            failures + 1
        );
    }
    let tenth = Driver::reconcile(Arc::new(stored), Arc::clone(&driver), attempt(9)).await;
    assert!(tenth.is_err());
    let stored = get(&client, &tenant.name_any()).await;
    let (_, _, message) = condition(&stored, "Stalled");
    assert!(
        message.starts_with("10 or more reconciles failed in a row"),
        "{message}"
    );
}

#[tokio::test]
async fn the_controller_driven_driver_converges_and_repairs_a_deleted_child() {
    let client = client().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(Driver::new(client.clone(), BaseTenants).run(
        controller_of(&client, "ctl"),
        async {
            let _ = stopped.await;
        },
    ));
    let tenant = create_for(&client, "bt-ctl", Some("ctl"), spec(&["carol"])).await;
    let name = tenant.name_any();
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), &name);
    wait("Ready", || async {
        let t = get(&client, &name).await;
        has_condition(&t, "Ready") && condition(&t, "Ready").0 == "True"
    })
    .await;
    let uid = bindings.get("owners").await.unwrap().uid();
    bindings
        .delete("owners", &DeleteParams::default())
        .await
        .unwrap();
    wait("the RoleBinding recreated", || async {
        matches!(bindings.get_opt("owners").await, Ok(Some(b)) if b.uid() != uid)
    })
    .await;
    stop.send(()).unwrap();
    let report = run.await.unwrap().expect("run");
    assert!(report.drained(), "{report:?}");
}

/// A reconciler with a finalizer whose cleanup hook counts its runs.
struct Finalizing(Arc<AtomicU32>);

impl Reconciler for Finalizing {
    type Resource = BaseTenant;
    const FINALIZER: Option<&'static str> = Some("example.idem.dev/cleanup");
    fn children() -> ChildKinds<BaseTenant> {
        BaseTenants::children()
    }
    fn desired(
        &self,
        tenant: &BaseTenant,
    ) -> Result<idem_runtime::apply::DesiredChildren, ReconcileError> {
        base_tenant::desired(tenant)
    }
    async fn cleanup(
        &self,
        _: &BaseTenant,
        _: &mut Pass<BaseTenant>,
    ) -> Result<Cleanup<BaseTenant>, ReconcileError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Cleanup::Done)
    }
}

#[tokio::test]
async fn a_finalizer_is_added_and_removed_after_the_cleanup_hook() {
    let client = client().await;
    let runs = Arc::new(AtomicU32::new(0));
    let driver = Driver::new(client.clone(), Finalizing(Arc::clone(&runs)));
    let tenant = create(&client, "bt-fin", spec(&["dave"])).await;
    let name = tenant.name_any();
    driver.reconcile_once(client.clone(), tenant).await.unwrap();
    let stored = get(&client, &name).await;
    assert_eq!(stored.finalizers(), ["example.idem.dev/cleanup"]);
    let api = Api::<BaseTenant>::all(client.clone());
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    let deleting = get(&client, &name).await;
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    driver
        .reconcile_once(client.clone(), Arc::new(deleting))
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the cleanup hook ran once");
    wait("the BaseTenant gone", || async {
        api.get_opt(&name).await.unwrap().is_none()
    })
    .await;
}

async fn wait<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {WAIT:?} for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The BaseTenant reconciler, counting its passes per object name.
struct Counting(Arc<std::sync::Mutex<std::collections::BTreeMap<String, u32>>>);

impl Counting {
    fn passes(&self, name: &str) -> u32 {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

impl Reconciler for Counting {
    type Resource = BaseTenant;
    fn children() -> ChildKinds<BaseTenant> {
        BaseTenants::children()
    }
    fn desired(
        &self,
        tenant: &BaseTenant,
    ) -> Result<idem_runtime::apply::DesiredChildren, ReconcileError> {
        *self.0.lock().unwrap().entry(tenant.name_any()).or_default() += 1;
        base_tenant::desired(tenant)
    }
}

/// A child the API server's validation refuses (422 Invalid: a negative memory quota, which the
/// BaseTenant schema does not forbid) stalls its owner at once with reason `ChildInvalid` and
/// the server's message on one line, is not retried while the spec stays (a handful of passes,
/// where retries with backoff would make one after another), and converges once the spec
/// changes.
#[tokio::test]
async fn a_child_the_server_refuses_as_invalid_stalls_until_the_spec_changes() {
    let client = client().await;
    let passes = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
    let counting = Counting(Arc::clone(&passes));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(
        Driver::new(client.clone(), Counting(Arc::clone(&passes))).run(
            controller_of(&client, "inv"),
            async {
                let _ = stopped.await;
            },
        ),
    );
    let mut bad = spec(&["erin"]);
    bad.memory = "-1Gi".into();
    let tenant = create_for(&client, "bt-inv", Some("inv"), bad).await;
    let name = tenant.name_any();
    // A failed pass may first write only its record of the children it created.
    let stalled = |t: &BaseTenant| {
        has_condition(t, "Stalled") && {
            let (status, reason, _) = condition(t, "Stalled");
            status == "True" && reason == "ChildInvalid"
        }
    };
    wait("Stalled with ChildInvalid", || async {
        stalled(&get(&client, &name).await)
    })
    .await;
    let stored = get(&client, &name).await;
    let (_, _, message) = condition(&stored, "Stalled");
    assert!(
        message.contains("ResourceQuota") && message.contains("422 Invalid"),
        "{message}"
    );
    assert!(
        message.contains("must be greater than or equal to 0"),
        "the server's reason: {message}"
    );
    assert!(!message.contains('\n'), "one line: {message:?}");
    assert_eq!(condition(&stored, "Ready").0, "False");
    // What the failed pass did before the refusal is told: a `Created` Event per child it
    // created (the namespace, at least).
    let created: Vec<String> = Api::<k8s_openapi::api::events::v1::Event>::all(client.clone())
        .list(&kube::api::ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("Created")
                && e.regarding.as_ref().and_then(|r| r.uid.as_deref())
                    == stored.metadata.uid.as_deref()
        })
        .filter_map(|e| e.note)
        .collect();
    assert!(
        created
            .iter()
            .any(|n| n.contains(&format!("Namespace/{name}"))),
        "no Created Event for the children the failed pass created: {created:?}"
    );

    // Another object converging meanwhile: the workers are busy, the stalled one is not retried.
    let good = create_for(&client, "bt-inv-ok", Some("inv"), spec(&["erin"])).await;
    wait("the other BaseTenant Ready", || async {
        let t = get(&client, &good.name_any()).await;
        has_condition(&t, "Ready") && condition(&t, "Ready").0 == "True"
    })
    .await;
    let before_fix = counting.passes(&name);
    // The first pass, and one for the namespace it created (a child event).
    assert!(
        (1..=3).contains(&before_fix),
        "{before_fix} passes for a spec that cannot work"
    );
    assert!(stalled(&get(&client, &name).await), "still stalled");

    // The spec changes: the object converges.
    let api: Api<BaseTenant> = Api::all(client.clone());
    api.patch(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"spec": {"memory": "4Gi"}})),
    )
    .await
    .unwrap();
    wait("Ready after the fix", || async {
        let t = get(&client, &name).await;
        has_condition(&t, "Ready") && condition(&t, "Ready").0 == "True"
    })
    .await;
    assert!(counting.passes(&name) > before_fix);
    stop.send(()).unwrap();
    let report = run.await.unwrap().expect("run");
    assert!(report.drained(), "{report:?}");
}

/// A held child whose repair an administrator's policy refuses (403) does not fail the pass,
/// and nothing watched changes when the policy does: the owner is looked at again after
/// `BLOCKED_POLL`, so the repair is made once the refusal ends.
#[tokio::test]
async fn a_held_childs_refused_repair_is_looked_at_again() {
    use idem_runtime::controller::blocked::BLOCKED_POLL;
    use kube::api::{Patch, PatchParams};
    use serde_json::json;
    let client = client().await;
    let tenant = create(&client, "bt-refused", spec(&["bob"])).await;
    let name = tenant.name_any();
    let driver = Arc::new(Driver::new(client.clone(), BaseTenants));
    let attempt = || changed(&name);
    let first = Driver::reconcile(Arc::clone(&tenant), Arc::clone(&driver), attempt()).await;
    assert_ne!(first.expect("first pass"), Action::requeue(BLOCKED_POLL));
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), &name);
    let hold = json!({"metadata": {"finalizers": ["example.com/hold"]},
        "subjects": [{"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"}]});
    bindings
        .patch("owners", &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .expect("hold and drift");
    bindings
        .delete("owners", &DeleteParams::default())
        .await
        .expect("delete");
    let policy = idem_tests::admission::RefusingPolicy::create(
        &client,
        &format!("refuse-subjects-{name}"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        &name,
        (
            "object.subjects == oldObject.subjects",
            "the subjects are frozen",
        ),
        || {
            let change = json!({"subjects": [{"kind": "User", "name": "bob",
                "apiGroup": "rbac.authorization.k8s.io"}]});
            let bindings = bindings.clone();
            async move {
                let dry_run = PatchParams::default().dry_run();
                bindings
                    .patch("owners", &dry_run, &Patch::Merge(&change))
                    .await
            }
        },
    )
    .await;
    let stored = Arc::new(get(&client, &name).await);
    let action = Driver::reconcile(stored, Arc::clone(&driver), attempt())
        .await
        .expect("a refused repair of a held child does not fail the pass");
    assert_eq!(action, Action::requeue(BLOCKED_POLL));

    policy.remove().await;
    bindings
        .patch(
            "owners",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release");
}

/// The BaseTenant reconciler, desiring the LimitRange only while `limits` holds.
struct DroppingLimits {
    limits: std::sync::atomic::AtomicBool,
}

impl Reconciler for DroppingLimits {
    type Resource = BaseTenant;
    fn children() -> ChildKinds<BaseTenant> {
        BaseTenants::children()
    }
    fn desired(
        &self,
        tenant: &BaseTenant,
    ) -> Result<idem_runtime::apply::DesiredChildren, ReconcileError> {
        if self.limits.load(Ordering::SeqCst) {
            return base_tenant::desired(tenant);
        }
        // The namespace alone: nothing is said of the other declared kinds.
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": tenant.name_any()}}))
        .unwrap();
        let mut children = idem_runtime::apply::DesiredChildren::new();
        children.add(&ns)?;
        Ok(children)
    }
}

/// A desired state that drops the last child of a declared kind prunes it (the kind need not
/// be named with `DesiredChildren::prune_kind`): the children are deleted and leave the
/// record.
#[tokio::test]
async fn the_last_children_of_declared_kinds_are_pruned_when_no_longer_desired() {
    let client = client().await;
    let reconciler = DroppingLimits {
        limits: std::sync::atomic::AtomicBool::new(true),
    };
    let driver = Driver::new(client.clone(), reconciler);
    let tenant = create(&client, "bt-drop", spec(&["erin"])).await;
    let name = tenant.name_any();
    driver.reconcile_once(client.clone(), tenant).await.unwrap();
    let limits = Api::<LimitRange>::namespaced(client.clone(), &name);
    let quotas = Api::<ResourceQuota>::namespaced(client.clone(), &name);
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), &name);
    let uid = limits.get("limits").await.expect("the LimitRange").uid();
    let recorded = |t: &BaseTenant| {
        let record = &t.status.as_ref().expect("status").created_children;
        record.iter().any(|c| Some(&c.uid) == uid.as_ref())
    };
    assert!(recorded(&get(&client, &name).await), "recorded as created");
    driver.reconciler().limits.store(false, Ordering::SeqCst);
    let stored = Arc::new(get(&client, &name).await);
    driver.reconcile_once(client.clone(), stored).await.unwrap();
    for (what, gone) in [
        (
            "LimitRange",
            limits.get_opt("limits").await.unwrap().is_none(),
        ),
        (
            "ResourceQuota",
            quotas.get_opt("quota").await.unwrap().is_none(),
        ),
        (
            "RoleBinding",
            bindings.get_opt("owners").await.unwrap().is_none(),
        ),
    ] {
        assert!(gone, "the {what} is deleted by the pass");
    }
    let t = get(&client, &name).await;
    let record = &t.status.as_ref().expect("status").created_children;
    assert!(!recorded(&t), "the LimitRange left the record: {record:?}");
    assert_eq!(record.len(), 1, "only the Namespace is left: {record:?}");
    assert_eq!(condition(&t, "Ready").0, "True");
}

/// The example's reconciler with every kind but `Namespace` dropped from `children()`.
struct NamespacesOnly;

impl Reconciler for NamespacesOnly {
    type Resource = BaseTenant;
    fn children() -> ChildKinds<BaseTenant> {
        ChildKinds::new().owns::<Namespace>()
    }
    fn child_record(
        status: &mut base_tenant::BaseTenantStatus,
    ) -> Option<&mut Vec<idem_runtime::apply::CreatedChild>> {
        Some(&mut status.created_children)
    }
    fn desired(
        &self,
        tenant: &BaseTenant,
    ) -> Result<idem_runtime::apply::DesiredChildren, ReconcileError> {
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": tenant.name_any()}}))
                .map_err(|e| ReconcileError::terminal("InvalidSpec", e.to_string()))?;
        let mut children = idem_runtime::apply::DesiredChildren::new();
        children.add(&namespace)?;
        Ok(children)
    }
}

/// A reconciler that no longer declares kinds it created children of leaves those children
/// (no version to find them by, no watch: neither repaired nor pruned) and says so once: a
/// `Warning` `UndeclaredChildren` naming them, not repeated by the next pass.
#[tokio::test]
async fn children_of_kinds_no_longer_declared_are_named_once_and_kept() {
    use k8s_openapi::api::events::v1::Event;
    let client = client().await;
    let tenant = create(&client, "bt-undecl", spec(&["dana"])).await;
    let name = tenant.name_any();
    let attempt = || changed(&name);
    let all = Arc::new(Driver::new(client.clone(), BaseTenants));
    Driver::reconcile(Arc::clone(&tenant), all, attempt())
        .await
        .expect("first pass");
    let narrow = Arc::new(Driver::new(client.clone(), NamespacesOnly));
    for _ in 0..2 {
        let stored = Arc::new(get(&client, &name).await);
        Driver::reconcile(stored, Arc::clone(&narrow), attempt())
            .await
            .expect("pass declaring only namespaces");
    }
    let told: Vec<Event> = Api::<Event>::all(client.clone())
        .list(&kube::api::ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("UndeclaredChildren")
                && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == tenant.uid().as_deref()
        })
        .collect();
    assert_eq!(told.len(), 1, "one Warning: {told:?}");
    assert!(told[0].series.is_none(), "told once, not again: {told:?}");
    let note = told[0].note.clone().unwrap_or_default();
    assert!(
        note.starts_with("3 of this object's created children")
            && note.contains(&format!("RoleBinding/{name}/owners"))
            && note.contains("status.createdChildren"),
        "{note}"
    );
    // Kept: nothing of an undeclared kind is deleted.
    Api::<RoleBinding>::namespaced(client.clone(), &name)
        .get("owners")
        .await
        .expect("the RoleBinding is kept");
}

/// The controller's cache of primaries keeps no `kubectl.kubernetes.io/last-applied-configuration`
/// (a copy of the whole object as kubectl last applied it; here 64 KiB), and the status the
/// driver writes from that cached copy leaves it on the server, with the object's other
/// annotations.
#[tokio::test]
async fn the_primary_cache_keeps_no_last_applied_copy_and_the_server_keeps_it() {
    let client = client().await;
    let last_applied = "kubectl.kubernetes.io/last-applied-configuration";
    let big = format!("{{\"spec\":\"{}\"}}", "x".repeat(64 * 1024));
    let mut tenant = BaseTenant::new(&idem_tests::unique_name("bt-la"), spec(&["lee"]));
    tenant
        .labels_mut()
        .insert(GROUP_LABEL.to_owned(), "la".to_owned());
    tenant
        .annotations_mut()
        .insert(last_applied.into(), big.clone());
    tenant
        .annotations_mut()
        .insert("example.com/note".into(), "kept".into());
    let name = tenant.name_any();
    Api::<BaseTenant>::all(client.clone())
        .create(&PostParams::default(), &tenant)
        .await
        .expect("create");
    let controller = controller_of(&client, "la");
    let store = controller.store();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(
        Driver::new(client.clone(), BaseTenants).run(controller, async {
            let _ = stopped.await;
        }),
    );
    wait("Ready", || async {
        let t = get(&client, &name).await;
        has_condition(&t, "Ready") && condition(&t, "Ready").0 == "True"
    })
    .await;
    let cached = store
        .get(&kube::runtime::reflector::ObjectRef::new(&name))
        .expect("cached");
    assert!(
        !cached.annotations().contains_key(last_applied),
        "the cache holds kubectl's copy of the object"
    );
    assert_eq!(
        cached
            .annotations()
            .get("example.com/note")
            .map(String::as_str),
        Some("kept")
    );
    let stored = get(&client, &name).await;
    assert_eq!(
        stored.annotations().get(last_applied),
        Some(&big),
        "the status write removed it on the server"
    );
    stop.send(()).unwrap();
    run.await.unwrap().expect("run");
}

/// The example's reconciler with a `ready()` that says Ready whatever the children are.
struct AlwaysReady;

impl Reconciler for AlwaysReady {
    type Resource = BaseTenant;
    fn children() -> ChildKinds<BaseTenant> {
        BaseTenants::children()
    }
    fn child_record(
        status: &mut base_tenant::BaseTenantStatus,
    ) -> Option<&mut Vec<idem_runtime::apply::CreatedChild>> {
        BaseTenants::child_record(status)
    }
    fn desired(
        &self,
        tenant: &BaseTenant,
    ) -> Result<idem_runtime::apply::DesiredChildren, ReconcileError> {
        BaseTenants.desired(tenant)
    }
    fn ready(
        &self,
        _: &BaseTenant,
        _: &idem_runtime::reconciler::Children<'_>,
    ) -> Result<idem_runtime::reconciler::Outcome<BaseTenant>, ReconcileError> {
        Ok(idem_runtime::status::Readiness::Ready {
            reason: "Available".into(),
            message: "all good".into(),
        }
        .into())
    }
}

/// A `ready()` that says Ready does not hide a child whose name an object that is not ours
/// takes: the children's own readiness (`Stalled`, `ChildNotOwned`) is the status.
#[tokio::test]
async fn a_ready_that_says_ready_does_not_hide_a_child_that_is_not_ours() {
    let client = client().await;
    let tenant = create(&client, "bt-lies", spec(&["dana"])).await;
    let name = tenant.name_any();
    // Someone else's namespace at the name of the tenant's.
    let foreign: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("ns");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &foreign)
        .await
        .expect("a foreign namespace");
    let driver = Arc::new(Driver::new(client.clone(), AlwaysReady));
    let _ = Driver::reconcile(Arc::clone(&tenant), driver, changed(&name)).await;
    let stored = get(&client, &name).await;
    assert_eq!(
        condition(&stored, "Ready").0,
        "False",
        "{:?}",
        stored.status
    );
    let (status, reason, message) = condition(&stored, "Stalled");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ChildNotOwned"),
        "{message}"
    );
}
