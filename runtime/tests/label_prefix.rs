//! The labels and the annotation idem stamps on a user's children live under the user's
//! prefix, against the real control plane:
//!
//! - a `Team` (group `prefix.test.idem.dev`) with `#[idempotent(label_prefix =
//!   "teams.example.com")]`: its ConfigMaps carry `teams.example.com/owner-uid`, `/tenant`,
//!   `/shard-bucket` and `/applied-fingerprint`, and no key of idem's operator
//!   (`tenancy.idem.dev/`) nor of the group; a converged pass makes no request; a deleted
//!   child is made again; a child no longer desired is pruned (listed by the prefixed
//!   owner-uid label);
//! - the example `BaseTenant`, relying on the default (its group, `example.idem.dev`): its
//!   children carry `example.idem.dev/*` and no `tenancy.idem.dev/*` key; a converged pass
//!   of a `Driver` whose child watches fill its caches (no controller) makes no request
//!   (counted by the API server for the pass's own user); a deleted child is made again; a
//!   foreign object at a desired child's name is not owned (`ChildNotOwned`) and left alone.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;

use base_tenant::{BaseTenant, BaseTenants};
use common::user::CountedUser;
use idem_runtime::IdempotentResource;
use idem_runtime::apply::{CreatedChild, DesiredChildren};
use idem_runtime::controller::Action;
use idem_runtime::reconciler::{ChildKinds, Driver, ReconcileError, Reconciler};
use k8s_openapi::api::core::v1::{ConfigMap, LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Mutex;

/// The tests count requests at the API server: one at a time.
static COUNTING: Mutex<()> = Mutex::const_new(());

const WAIT: Duration = Duration::from_secs(60);

/// A team: one ConfigMap per name in `spec.names`.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "prefix.test.idem.dev",
    version = "v1",
    kind = "Team",
    namespaced,
    status = "TeamStatus"
)]
#[idempotent(tenant = namespace, label_prefix = "teams.example.com")]
pub struct TeamSpec {
    /// The ConfigMaps to have.
    pub names: Vec<String>,
}

/// The Team's status.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TeamStatus {
    /// The generation the conditions describe.
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling, Stalled.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The children created (what the prune may delete).
    #[serde(default)]
    pub created_children: Vec<CreatedChild>,
}

struct Teams;

impl Reconciler for Teams {
    type Resource = Team;

    fn children() -> ChildKinds<Team> {
        ChildKinds::new().owns::<ConfigMap>()
    }

    fn desired(&self, t: &Team) -> Result<DesiredChildren, ReconcileError> {
        let mut children = DesiredChildren::new();
        for name in &t.spec.names {
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": name}, "data": {"team": t.name_any()},
            }))
            .map_err(|e| ReconcileError::terminal("InvalidSpec", e.to_string()))?;
            children.add(&cm)?;
        }
        Ok(children)
    }
}

/// The counts of `resources`, by verb, resource and subresource, for messages.
async fn request_counts(resources: &[(&str, &str)]) -> BTreeMap<String, u64> {
    let text = idem_tests::shared().metrics().await.expect("metrics");
    idem_tests::metrics::all_requests(&text)
        .iter()
        .filter(|c| c.verb != "WATCH")
        .filter(|c| resources.contains(&(c.group.as_str(), c.resource.as_str())))
        .map(|c| {
            (
                format!("{} {}/{}", c.verb, c.resource, c.subresource),
                c.count,
            )
        })
        .collect()
}

/// Requests (every verb but WATCH, counted when a watch ends) the API server counted on
/// `resources` (`(group, plural)`).
async fn requests(resources: &[(&str, &str)]) -> u64 {
    counted(resources, |verb| verb != "WATCH").await
}

/// Requests with a verb `verb` accepts on `resources`.
async fn counted(resources: &[(&str, &str)], verb: impl Fn(&str) -> bool) -> u64 {
    let text = idem_tests::shared().metrics().await.expect("metrics");
    idem_tests::metrics::all_requests(&text)
        .iter()
        .filter(|c| verb(&c.verb))
        .filter(|c| resources.contains(&(c.group.as_str(), c.resource.as_str())))
        // The controller-manager writes the quotas' usage, not idem.
        .filter(|c| !(c.resource == "resourcequotas" && c.subresource == "status"))
        .map(|c| c.count)
        .sum()
}

fn ready<K: idem_runtime::resource::IdempotentResource>(obj: &K) -> bool {
    obj.status()
        .map(K::conditions_of)
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Reconciles `obj` (read again from `api` each time) until it is Ready.
async fn converge<R: Reconciler>(
    driver: &Driver<R>,
    client: &Client,
    api: &Api<R::Resource>,
    name: &str,
) -> Arc<R::Resource>
where
    <R::Resource as kube::Resource>::Scope: idem_runtime::apply::ChildScope,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let obj = Arc::new(api.get(name).await.expect("get"));
        if ready(obj.as_ref()) {
            // One more pass: the children the last one wrote are in the caches now.
            driver
                .reconcile_once(client.clone(), Arc::clone(&obj))
                .await
                .expect("reconcile");
            return Arc::new(api.get(name).await.expect("get"));
        }
        assert!(tokio::time::Instant::now() < deadline, "not Ready: {obj:?}");
        driver
            .reconcile_once(client.clone(), obj)
            .await
            .expect("reconcile");
    }
}

/// Every label and annotation key of `meta`.
fn keys(meta: &ObjectMeta) -> Vec<String> {
    let labels = meta.labels.iter().flatten().map(|(k, _)| k.clone());
    let annotations = meta.annotations.iter().flatten().map(|(k, _)| k.clone());
    labels.chain(annotations).collect()
}

/// Asserts that `meta` carries idem's names under `prefix` only, for the owner with `uid`.
fn assert_under(prefix: &str, meta: &ObjectMeta, uid: &str, tenant: &str) {
    let name = meta.name.clone().unwrap_or_default();
    let labels: BTreeMap<String, String> = meta.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get(&format!("{prefix}/owner-uid"))
            .map(String::as_str),
        Some(uid),
        "{name}: {labels:?}"
    );
    assert_eq!(
        labels.get(&format!("{prefix}/tenant")).map(String::as_str),
        Some(tenant),
        "{name}: {labels:?}"
    );
    let bucket = labels
        .get(&format!("{prefix}/shard-bucket"))
        .unwrap_or_else(|| panic!("{name}: no shard bucket: {labels:?}"));
    assert!(bucket.parse::<u8>().is_ok(), "{name}: bucket {bucket}");
    let annotations = meta.annotations.clone().unwrap_or_default();
    assert!(
        annotations.contains_key(&format!("{prefix}/applied-fingerprint")),
        "{name}: {annotations:?}"
    );
    let foreign: Vec<String> = keys(meta)
        .into_iter()
        .filter(|k| k.starts_with("tenancy.idem.dev/"))
        .collect();
    assert!(
        foreign.is_empty(),
        "{name}: idem's operator's keys {foreign:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kinds_children_carry_its_label_prefix_and_converge_repair_and_prune_by_it() {
    let _guard = COUNTING.lock().await;
    let client = idem_tests::shared().client();
    idem_tests::install_crd(&client, &Team::crd())
        .await
        .expect("install the Team CRD");
    let ns = idem_tests::create_namespace(&client, "prefix")
        .await
        .expect("namespace");
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    // The controller-manager's own ConfigMap of every namespace: made before any count.
    let deadline = tokio::time::Instant::now() + WAIT;
    while config_maps
        .get_opt("kube-root-ca.crt")
        .await
        .unwrap()
        .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no kube-root-ca.crt"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let teams: Api<Team> = Api::namespaced(client.clone(), &ns);
    let spec = TeamSpec {
        names: vec!["a".into(), "b".into()],
    };
    teams
        .create(&PostParams::default(), &Team::new("blue", spec))
        .await
        .expect("create the Team");

    let driver = Driver::new(client.clone(), Teams);
    let _watches = driver.watch_children().await.expect("child watches");
    let team = converge(&driver, &client, &teams, "blue").await;
    let uid = team.uid().expect("uid");
    let selector = format!("teams.example.com/owner-uid={uid}");
    let listed = config_maps
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("list");
    let mut names: Vec<String> = listed.items.iter().map(ResourceExt::name_any).collect();
    names.sort();
    assert_eq!(names, ["a", "b"], "listed by the prefixed owner-uid label");
    // One `Created` Event per child, each naming it (a series per related child, not one
    // series counting up the first child's note).
    let mut created: Vec<String> = Api::<Event>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("Created")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("blue")
        })
        .filter_map(|e| e.note)
        .collect();
    created.sort();
    assert_eq!(
        created,
        [
            format!("created ConfigMap/{ns}/a"),
            format!("created ConfigMap/{ns}/b")
        ]
    );
    for cm in &listed.items {
        assert_under("teams.example.com", &cm.metadata, &uid, &ns);
        assert!(
            !keys(&cm.metadata)
                .iter()
                .any(|k| k.starts_with("prefix.test.idem.dev/")),
            "label_prefix, not the group: {:?}",
            cm.metadata
        );
    }

    // Converged: a pass makes no request.
    let counted = &[("", "configmaps"), ("prefix.test.idem.dev", "teams")];
    let before = requests(counted).await;
    let action = driver
        .reconcile_once(client.clone(), Arc::clone(&team))
        .await
        .expect("reconcile");
    assert_eq!(action, Action::await_change());
    assert_eq!(
        requests(counted).await - before,
        0,
        "a converged pass makes no request"
    );

    // A deleted child is made again, under the prefix.
    config_maps
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete a");
    let deadline = tokio::time::Instant::now() + WAIT;
    let repaired = loop {
        let team = Arc::new(teams.get("blue").await.expect("get"));
        driver
            .reconcile_once(client.clone(), team)
            .await
            .expect("reconcile");
        if let Some(cm) = config_maps.get_opt("a").await.expect("get a") {
            break cm;
        }
        assert!(tokio::time::Instant::now() < deadline, "a not made again");
    };
    assert_under("teams.example.com", &repaired.metadata, &uid, &ns);

    // A child no longer desired is pruned.
    teams
        .patch(
            "blue",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"names": ["a"]}})),
        )
        .await
        .expect("drop b");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let team = Arc::new(teams.get("blue").await.expect("get"));
        driver
            .reconcile_once(client.clone(), team)
            .await
            .expect("reconcile");
        let b = config_maps.get_opt("b").await.expect("get b");
        if b.is_none_or(|b| b.metadata.deletion_timestamp.is_some()) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "b not pruned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(config_maps.get_opt("a").await.expect("get a").is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_base_tenants_children_carry_its_group_as_prefix() {
    let _guard = COUNTING.lock().await;
    let client = idem_tests::shared().client();
    base_tenant::install_crd(&client).await.expect("install");
    let name = idem_tests::unique_name("bt");
    let api: Api<BaseTenant> = Api::all(client.clone());
    let spec = json!({"owners": ["alice"], "cpu": "1", "memory": "1Gi"});
    api.create(
        &PostParams::default(),
        &BaseTenant::new(&name, serde_json::from_value(spec).unwrap()),
    )
    .await
    .expect("create the BaseTenant");
    let driver = Driver::new(client.clone(), BaseTenants);
    let _watches = driver.watch_children().await.expect("child watches");
    let bt = converge(&driver, &client, &api, &name).await;
    let uid = bt.uid().expect("uid");

    let ns = Api::<Namespace>::all(client.clone())
        .get(&name)
        .await
        .expect("namespace");
    assert_under("example.idem.dev", &ns.metadata, &uid, &name);
    let quota = Api::<ResourceQuota>::namespaced(client.clone(), &name)
        .get("quota")
        .await
        .expect("quota");
    assert_under("example.idem.dev", &quota.metadata, &uid, &name);
    let limits = limits_api(&client, &name)
        .get("limits")
        .await
        .expect("limits");
    assert_under("example.idem.dev", &limits.metadata, &uid, &name);
    let owners = Api::<RoleBinding>::namespaced(client.clone(), &name)
        .get("owners")
        .await
        .expect("owners");
    assert_under("example.idem.dev", &owners.metadata, &uid, &name);

    // The namespace's kube-root-ca.crt is the controller-manager's, made before any count.
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &name);
    let deadline = tokio::time::Instant::now() + WAIT;
    while config_maps
        .get_opt("kube-root-ca.crt")
        .await
        .unwrap()
        .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no kube-root-ca.crt"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let counted = &[
        ("", "namespaces"),
        ("", "resourcequotas"),
        ("", "limitranges"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("example.idem.dev", "basetenants"),
    ];
    // Converged: a pass through the caches the driver's child watches fill makes no request.
    // Counted for the pass's own user (a FlowSchema of its own): the garbage collector reads
    // each namespaced child of a cluster-scoped owner once, at a time of its choosing, which
    // a count of every client's requests on these kinds would charge to the pass.
    let user = CountedUser::create(&client, "label-prefix").await;
    let (before, seen) = (user.requests().await, request_counts(counted).await);
    let action = driver
        .reconcile_once(user.client(), Arc::clone(&bt))
        .await
        .expect("reconcile");
    assert_eq!(action, Action::await_change());
    assert_eq!(
        user.requests().await - before,
        0,
        "a converged pass makes no request: the API server's counts on these kinds before \
         {seen:?}, after {:?}",
        request_counts(counted).await
    );

    // A child that really is missing is created again (the cache says it is gone).
    limits_api(&client, &name)
        .delete("limits", &DeleteParams::default())
        .await
        .expect("delete limits");
    let deadline = tokio::time::Instant::now() + WAIT;
    let remade = loop {
        let bt = Arc::new(api.get(&name).await.expect("get"));
        driver
            .reconcile_once(client.clone(), bt)
            .await
            .expect("reconcile");
        match limits_api(&client, &name)
            .get_opt("limits")
            .await
            .expect("get")
        {
            Some(l) if l.metadata.deletion_timestamp.is_none() => break l,
            _ => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "limits not made again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_under("example.idem.dev", &remade.metadata, &uid, &name);
    assert_ne!(remade.uid(), limits.uid(), "a new LimitRange");

    // A foreign object at a desired name (someone's own binding, not labelled for the child
    // watches) is not owned: the owner is Stalled with ChildNotOwned and the binding is left
    // as it is.
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &name);
    bindings
        .delete("owners", &DeleteParams::default())
        .await
        .expect("delete owners");
    let deadline = tokio::time::Instant::now() + WAIT;
    while bindings.get_opt("owners").await.expect("get").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "owners not gone");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let foreign: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "owners"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "erin"}],
    }))
    .unwrap();
    bindings
        .create(&PostParams::default(), &foreign)
        .await
        .expect("create the foreign binding");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let bt = Arc::new(api.get(&name).await.expect("get"));
        let stalled = bt.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "ChildNotOwned")
        });
        if stalled {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ChildNotOwned: {bt:?}"
        );
        driver
            .reconcile_once(client.clone(), bt)
            .await
            .expect("reconcile");
    }
    let left = bindings.get("owners").await.expect("owners");
    assert_eq!(
        left.subjects.unwrap_or_default()[0].name,
        "erin",
        "left as it is"
    );
    assert!(left.metadata.owner_references.is_none_or(|r| r.is_empty()));
}

fn limits_api(client: &Client, namespace: &str) -> Api<LimitRange> {
    Api::namespaced(client.clone(), namespace)
}
