//! What a user's own kind gets from tenant input and from its label prefix, against the real
//! control plane:
//!
//! - a `Crew` whose tenant is a spec field (`tenant = field(team)`): a tenant name that is not
//!   a label value ("Acme Corp", 64 characters, unicode) still gets its children, since the
//!   derive accepts any string there;
//! - the example `BaseTenant` with a name at the length limit of a namespace (63) is Ready;
//!   one past it (64, still a valid object name) is `Stalled` at once, and a second pass makes
//!   no write (no request storm);
//! - a `BaseTenant` with a 300 kB `spec.cpu` is `Stalled` with a bounded message; unicode
//!   owners are granted `edit`;
//! - two kinds sharing one label prefix (`Alpha`, `Beta`: `shared.example.com`), with the
//!   same name in one namespace: each one's prune deletes only its own children, a child
//!   name the other holds is not adopted, and a converged pass of one makes no request while
//!   the other prunes.

use std::collections::BTreeMap;
use std::sync::Arc;

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;

use base_tenant::{BaseTenant, BaseTenants};
use idem_runtime::IdempotentResource;
use idem_runtime::apply::{CreatedChild, DesiredChildren};
use idem_runtime::reconciler::{ChildKinds, Driver, ReconcileError, Reconciler};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Mutex;

/// The tests count requests at the API server: one at a time.
static COUNTING: Mutex<()> = Mutex::const_new(());

/// Passes a test allows a reconcile to converge in.
const PASSES: usize = 6;

/// A crew: one ConfigMap per name, its tenant named by `spec.team`.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "attack.test.idem.dev",
    version = "v1",
    kind = "Crew",
    namespaced,
    status = "AttackStatus"
)]
#[idempotent(tenant = field(team))]
pub struct CrewSpec {
    /// The tenant.
    pub team: String,
    /// The ConfigMaps to have.
    pub names: Vec<String>,
}

/// The status of every kind here.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttackStatus {
    /// The generation the conditions describe.
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling, Stalled.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The children created.
    #[serde(default)]
    pub created_children: Vec<CreatedChild>,
}

/// One kind of two sharing a label prefix.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "alpha.attack.test.idem.dev",
    version = "v1",
    kind = "Alpha",
    namespaced,
    status = "AttackStatus"
)]
#[idempotent(tenant = namespace, label_prefix = "shared.example.com")]
pub struct AlphaSpec {
    /// The ConfigMaps to have.
    pub names: Vec<String>,
}

/// The other kind with the same label prefix.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "beta.attack.test.idem.dev",
    version = "v1",
    kind = "Beta",
    namespaced,
    status = "AttackStatus"
)]
#[idempotent(tenant = namespace, label_prefix = "shared.example.com")]
pub struct BetaSpec {
    /// The ConfigMaps to have.
    pub names: Vec<String>,
}

/// ConfigMaps named `names`, each saying who wants it.
fn config_maps(names: &[String], by: &str) -> Result<DesiredChildren, ReconcileError> {
    let mut children = DesiredChildren::new();
    for name in names {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name}, "data": {"by": by},
        }))
        .map_err(|e| ReconcileError::terminal("InvalidSpec", e.to_string()))?;
        children.add(&cm)?;
    }
    Ok(children)
}

struct Crews;
impl Reconciler for Crews {
    type Resource = Crew;
    fn children() -> ChildKinds<Crew> {
        ChildKinds::new().owns::<ConfigMap>()
    }
    fn desired(&self, c: &Crew) -> Result<DesiredChildren, ReconcileError> {
        config_maps(&c.spec.names, "crew")
    }
}

struct Alphas;
impl Reconciler for Alphas {
    type Resource = Alpha;
    fn children() -> ChildKinds<Alpha> {
        ChildKinds::new().owns::<ConfigMap>()
    }
    fn desired(&self, a: &Alpha) -> Result<DesiredChildren, ReconcileError> {
        config_maps(&a.spec.names, "alpha")
    }
}

struct Betas;
impl Reconciler for Betas {
    type Resource = Beta;
    fn children() -> ChildKinds<Beta> {
        ChildKinds::new().owns::<ConfigMap>()
    }
    fn desired(&self, b: &Beta) -> Result<DesiredChildren, ReconcileError> {
        config_maps(&b.spec.names, "beta")
    }
}

/// Requests (every verb but WATCH) the API server counted on `resources` (`(group, plural)`).
async fn requests(resources: &[(&str, &str)]) -> u64 {
    counted(resources, |verb| verb != "WATCH").await
}

/// Writes the API server counted on `resources`.
async fn writes(resources: &[(&str, &str)]) -> u64 {
    counted(resources, |verb| !matches!(verb, "GET" | "LIST" | "WATCH")).await
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

/// What grew from `before` to `after`.
fn grown(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

async fn counted(resources: &[(&str, &str)], verb: impl Fn(&str) -> bool) -> u64 {
    let text = idem_tests::shared().metrics().await.expect("metrics");
    idem_tests::metrics::all_requests(&text)
        .iter()
        .filter(|c| verb(&c.verb))
        .filter(|c| resources.contains(&(c.group.as_str(), c.resource.as_str())))
        .filter(|c| !(c.resource == "resourcequotas" && c.subresource == "status"))
        .map(|c| c.count)
        .sum()
}

/// The condition `type_` of `obj`.
fn condition<K: idem_runtime::resource::IdempotentResource>(
    obj: &K,
    type_: &str,
) -> Option<Condition> {
    obj.status()
        .map(K::conditions_of)
        .and_then(|c| c.iter().find(|c| c.type_ == type_).cloned())
}

fn ready<K: idem_runtime::resource::IdempotentResource>(obj: &K) -> bool {
    condition(obj, "Ready").is_some_and(|c| c.status == "True")
}

/// Up to [`PASSES`] reconciles of `name` (read again each time) until it is Ready, then one
/// more (the caches hold what the last one wrote); the object as it ends, Ready or not.
async fn settle<R: Reconciler>(
    driver: &Driver<R>,
    client: &Client,
    api: &Api<R::Resource>,
    name: &str,
) -> Arc<R::Resource>
where
    <R::Resource as kube::Resource>::Scope: idem_runtime::apply::ChildScope,
{
    for _ in 0..PASSES {
        let obj = Arc::new(api.get(name).await.expect("get"));
        let was_ready = ready(obj.as_ref());
        let _ = driver.reconcile_once(client.clone(), obj).await;
        if was_ready {
            break;
        }
    }
    Arc::new(api.get(name).await.expect("get"))
}

/// The conditions of `obj`, for messages.
fn conditions<K: idem_runtime::resource::IdempotentResource>(obj: &K) -> Vec<String> {
    obj.status()
        .map(K::conditions_of)
        .into_iter()
        .flatten()
        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_named_by_a_spec_field_that_is_no_label_value_still_gets_its_children() {
    let _guard = COUNTING.lock().await;
    let client = idem_tests::shared().client();
    idem_tests::install_crd(&client, &Crew::crd())
        .await
        .expect("install the Crew CRD");
    let ns = idem_tests::create_namespace(&client, "crew")
        .await
        .expect("namespace");
    let crews: Api<Crew> = Api::namespaced(client.clone(), &ns);
    let driver = Driver::new(client.clone(), Crews);
    let _watches = driver.watch_children().await.expect("child watches");
    let teams = [
        "Acme Corp".to_owned(),
        "é".repeat(3),
        "t".repeat(64),
        "acme".to_owned(),
    ];
    let mut failed = BTreeMap::new();
    for (i, team) in teams.iter().enumerate() {
        let name = format!("crew-{i}");
        let spec = CrewSpec {
            team: team.clone(),
            names: vec![format!("cm-{i}")],
        };
        crews
            .create(&PostParams::default(), &Crew::new(&name, spec))
            .await
            .expect("create the Crew");
        let crew = settle(&driver, &client, &crews, &name).await;
        if !ready(crew.as_ref()) {
            failed.insert(team.clone(), conditions(crew.as_ref()));
            continue;
        }
        let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get(&format!("cm-{i}"))
            .await
            .expect("the Crew's ConfigMap");
        let labels = cm.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("attack.test.idem.dev/owner-uid"),
            crew.uid().as_ref(),
            "{labels:?}"
        );
        let stamped = labels.get("attack.test.idem.dev/tenant");
        if idem_runtime::apply::Labels::is_value(team) {
            assert_eq!(stamped, Some(team), "{labels:?}");
        } else {
            assert_eq!(
                stamped, None,
                "no tenant label a server refuses: {labels:?}"
            );
        }
    }
    assert!(
        failed.is_empty(),
        "Crews whose tenant (spec.team) is any string the derive accepts are not Ready: {failed:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn base_tenant_names_at_and_past_a_namespaces_length_limit() {
    let _guard = COUNTING.lock().await;
    let client = idem_tests::shared().client();
    base_tenant::install_crd(&client).await.expect("install");
    let api: Api<BaseTenant> = Api::all(client.clone());
    let driver = Driver::new(client.clone(), BaseTenants);
    let _watches = driver.watch_children().await.expect("child watches");
    let spec = || {
        serde_json::from_value::<base_tenant::BaseTenantSpec>(
            json!({"owners": ["alice"], "cpu": "1", "memory": "1Gi"}),
        )
    };
    let base = idem_tests::unique_name("long");
    let at_limit = format!("{base}{}", "x".repeat(63 - base.len()));
    let past_limit = format!("{base}{}", "y".repeat(64 - base.len()));
    for name in [&at_limit, &past_limit] {
        api.create(
            &PostParams::default(),
            &BaseTenant::new(name, spec().unwrap()),
        )
        .await
        .expect("a valid object name");
    }
    let at = settle(&driver, &client, &api, &at_limit).await;
    assert!(
        ready(at.as_ref()),
        "63 characters: {:?}",
        conditions(at.as_ref())
    );

    let past = settle(&driver, &client, &api, &past_limit).await;
    let stalled = condition(past.as_ref(), "Stalled");
    assert!(
        stalled.as_ref().is_some_and(|c| c.status == "True"),
        "64 characters: Stalled, not retried: {:?}",
        conditions(past.as_ref())
    );
    let counted = &[
        ("", "namespaces"),
        ("", "resourcequotas"),
        ("", "limitranges"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("example.idem.dev", "basetenants"),
    ];
    let (before, seen) = (writes(counted).await, request_counts(counted).await);
    let _ = driver.reconcile_once(client.clone(), past).await;
    eprintln!(
        "a Stalled BaseTenant's forced pass: {} writes {:?}",
        writes(counted).await - before,
        grown(&seen, &request_counts(counted).await)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_spec_value_stalls_with_a_bounded_message_and_unicode_owners_are_granted() {
    let _guard = COUNTING.lock().await;
    let client = idem_tests::shared().client();
    base_tenant::install_crd(&client).await.expect("install");
    let api: Api<BaseTenant> = Api::all(client.clone());
    let driver = Driver::new(client.clone(), BaseTenants);
    let _watches = driver.watch_children().await.expect("child watches");

    let huge = idem_tests::unique_name("huge");
    let spec =
        json!({"owners": ["alice"], "cpu": format!("1{}", "x".repeat(300_000)), "memory": "1Gi"});
    api.create(
        &PostParams::default(),
        &BaseTenant::new(&huge, serde_json::from_value(spec).unwrap()),
    )
    .await
    .expect("create");
    let bt = settle(&driver, &client, &api, &huge).await;
    let messages: Vec<usize> = (bt.status.iter())
        .flat_map(|s| s.conditions.iter())
        .map(|c| c.message.len())
        .collect();
    assert!(
        !ready(bt.as_ref()) && messages.iter().all(|&n| n <= 1024),
        "a 300 kB quantity: {} bytes of messages {messages:?}",
        messages.iter().sum::<usize>()
    );

    // A valid quantity of 300 000 digits: accepted by the API server, converged.
    let big = idem_tests::unique_name("big");
    let spec = json!({"owners": ["alice"], "cpu": "9".repeat(300_000), "memory": "1Gi"});
    api.create(
        &PostParams::default(),
        &BaseTenant::new(&big, serde_json::from_value(spec).unwrap()),
    )
    .await
    .expect("create");
    let bt = settle(&driver, &client, &api, &big).await;
    assert!(
        ready(bt.as_ref()),
        "huge quantity: {:?}",
        conditions(bt.as_ref())
    );
    let counted = &[
        ("", "namespaces"),
        ("", "resourcequotas"),
        ("", "limitranges"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("example.idem.dev", "basetenants"),
    ];
    let (before, seen) = (writes(counted).await, request_counts(counted).await);
    let _ = driver.reconcile_once(client.clone(), bt).await;
    assert_eq!(
        writes(counted).await - before,
        0,
        "a converged pass with a 300 000-digit quota writes nothing: {:?}",
        grown(&seen, &request_counts(counted).await)
    );

    let wide = idem_tests::unique_name("wide");
    let owners = ["álïçé", "用户", "👩‍💻"];
    let spec = json!({"owners": owners, "cpu": "1", "memory": "1Gi"});
    api.create(
        &PostParams::default(),
        &BaseTenant::new(&wide, serde_json::from_value(spec).unwrap()),
    )
    .await
    .expect("create");
    let bt = settle(&driver, &client, &api, &wide).await;
    assert!(
        ready(bt.as_ref()),
        "unicode owners: {:?}",
        conditions(bt.as_ref())
    );
    let rb = Api::<RoleBinding>::namespaced(client.clone(), &wide)
        .get("owners")
        .await
        .expect("owners");
    let names: Vec<String> = rb
        .subjects
        .iter()
        .flatten()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(names, owners);
}

/// The names of the ConfigMaps `cms` lists with `shared.example.com/owner-uid=<uid>`.
async fn children_of(cms: &Api<ConfigMap>, uid: &str) -> Vec<String> {
    let listed = cms
        .list(&ListParams::default().labels(&format!("shared.example.com/owner-uid={uid}")))
        .await
        .expect("list");
    let mut n: Vec<String> = listed.items.iter().map(ResourceExt::name_any).collect();
    n.sort();
    n
}

#[tokio::test(flavor = "multi_thread")]
async fn two_kinds_sharing_a_label_prefix_touch_only_their_own_children() {
    let _guard = COUNTING.lock().await;
    let client = idem_tests::shared().client();
    idem_tests::install_crd(&client, &Alpha::crd())
        .await
        .expect("install Alpha");
    idem_tests::install_crd(&client, &Beta::crd())
        .await
        .expect("install Beta");
    let ns = idem_tests::create_namespace(&client, "shared")
        .await
        .expect("namespace");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let alphas: Api<Alpha> = Api::namespaced(client.clone(), &ns);
    let betas: Api<Beta> = Api::namespaced(client.clone(), &ns);
    let names = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    alphas
        .create(
            &PostParams::default(),
            &Alpha::new(
                "x",
                AlphaSpec {
                    names: names(&["a1", "a2"]),
                },
            ),
        )
        .await
        .expect("Alpha");
    betas
        .create(
            &PostParams::default(),
            &Beta::new(
                "x",
                BetaSpec {
                    names: names(&["b1", "b2"]),
                },
            ),
        )
        .await
        .expect("Beta");
    let alpha_driver = Driver::new(client.clone(), Alphas);
    let _aw = alpha_driver.watch_children().await.expect("watches");
    let beta_driver = Driver::new(client.clone(), Betas);
    let _bw = beta_driver.watch_children().await.expect("watches");
    let a = settle(&alpha_driver, &client, &alphas, "x").await;
    let b = settle(&beta_driver, &client, &betas, "x").await;
    assert!(ready(a.as_ref()), "{:?}", conditions(a.as_ref()));
    assert!(ready(b.as_ref()), "{:?}", conditions(b.as_ref()));
    assert_eq!(children_of(&cms, &a.uid().unwrap()).await, ["a1", "a2"]);
    assert_eq!(children_of(&cms, &b.uid().unwrap()).await, ["b1", "b2"]);

    let counted = &[("", "configmaps"), ("beta.attack.test.idem.dev", "betas")];
    let (before, seen) = (requests(counted).await, request_counts(counted).await);
    let _ = beta_driver
        .reconcile_once(client.clone(), Arc::clone(&b))
        .await;
    assert_eq!(
        requests(counted).await - before,
        0,
        "Beta's converged pass: {:?}",
        grown(&seen, &request_counts(counted).await)
    );

    // Alpha drops a2 and wants b1, which Beta holds: a2 pruned, b1 not adopted.
    alphas
        .patch(
            "x",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"names": ["a1", "b1"]}})),
        )
        .await
        .expect("patch Alpha");
    let _ = settle(&alpha_driver, &client, &alphas, "x").await;
    let b = Arc::new(betas.get("x").await.expect("Beta"));
    let (before, seen) = (requests(counted).await, request_counts(counted).await);
    let _ = beta_driver
        .reconcile_once(client.clone(), Arc::clone(&b))
        .await;
    let beta_pass = requests(counted).await - before;
    let beta_requests = grown(&seen, &request_counts(counted).await);
    let a = alphas.get("x").await.expect("Alpha");
    let b1 = cms.get("b1").await.expect("b1");
    assert_eq!(
        b1.data.unwrap_or_default().get("by").map(String::as_str),
        Some("beta"),
        "Alpha took Beta's b1: {:?}",
        conditions(&a)
    );
    assert!(
        cms.get_opt("a2")
            .await
            .expect("a2")
            .is_none_or(|c| c.metadata.deletion_timestamp.is_some())
    );
    assert_eq!(
        children_of(&cms, &b.uid().unwrap()).await,
        ["b1", "b2"],
        "Beta's children"
    );
    assert_eq!(
        beta_pass, 0,
        "Beta's converged pass after Alpha's prune: {beta_requests:?}"
    );

    // Beta drops everything: its prune deletes b1 and b2, never Alpha's a1.
    betas
        .patch(
            "x",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"names": []}})),
        )
        .await
        .expect("patch Beta");
    let _ = settle(&beta_driver, &client, &betas, "x").await;
    let a1 = cms.get_opt("a1").await.expect("a1");
    assert!(
        a1.is_some_and(|c| c.metadata.deletion_timestamp.is_none()),
        "Beta's prune deleted Alpha's a1"
    );
}
