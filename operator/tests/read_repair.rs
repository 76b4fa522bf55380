//! The tampering matrix: another writer changes what the operator made; the reconcile
//! triggered by the child's event restores it (or leaves it, where the field is theirs), and a
//! second pass makes no request of any verb. Requests are counted from the API server's own
//! `/metrics`. The tests of this binary run one at a time (they count requests).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Operator, TIMEOUT, apps, eventually, install_crds, tenants, why};
use idem_operator::resources::{Tenant, TenantApp, TenantAppSpec};
use idem_operator::tenant::desired::{ISOLATION, LIMITS, OWNERS, QUOTA};
use idem_tests::{shared, unique_name};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, LimitRange, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::{Mutex, OnceCell};

/// Every resource the operator reads or writes, as `(API group, plural)`.
const RESOURCES: [(&str, &str); 11] = [
    ("", "namespaces"),
    ("", "resourcequotas"),
    ("", "limitranges"),
    ("rbac.authorization.k8s.io", "rolebindings"),
    ("networking.k8s.io", "networkpolicies"),
    ("tenancy.idem.dev", "tenants"),
    ("tenancy.idem.dev", "tenantapps"),
    ("", "configmaps"),
    ("apps", "deployments"),
    ("", "services"),
    ("events.k8s.io", "events"),
];

/// Every verb but WATCH (long-running; not made by a reconcile).
const VERBS: [&str; 8] = [
    "GET",
    "LIST",
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

static SERIAL: Mutex<()> = Mutex::const_new(());

/// Requests (every verb but WATCH) on [`RESOURCES`], from the API server's `/metrics`, by
/// `verb resource.group`.
async fn requests() -> BTreeMap<String, u64> {
    let text = shared().metrics().await.expect("apiserver /metrics");
    RESOURCES
        .iter()
        .flat_map(|(g, r)| VERBS.iter().map(move |v| (g, r, v)))
        .map(|(g, r, v)| {
            (
                format!("{v} {r}.{g}"),
                idem_tests::metrics::requests(&text, v, g, r),
            )
        })
        .collect()
}

/// What grew from `a` to `b`.
fn grown(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    b.iter()
        .filter_map(|(k, v)| {
            let d = v - a.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Waits until no request is made on [`RESOURCES`] for 2 s (the restore's follow-ups done).
async fn quiet() {
    eventually("2 s without requests", TIMEOUT, || async {
        let a = requests().await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let d = grown(&a, &requests().await);
        if d.is_empty() {
            Ok(())
        } else {
            Err(format!("{d:?}"))
        }
    })
    .await;
}

/// The operator and one tenant (namespace `<t>-x`) with an app `web` in it, all Ready.
struct World {
    operator: Operator,
    tenant: String,
    ns: String,
}

async fn world() -> &'static World {
    static WORLD: OnceCell<World> = OnceCell::const_new();
    WORLD
        .get_or_init(|| async {
            let client = shared().client();
            install_crds(&client).await;
            let operator = Operator::start(Duration::from_secs(3600)).await;
            let tenant = unique_name("rr");
            tenants::create(&client, &tenant, tenants::full_spec(&["x"])).await;
            tenants::wait_ready(&client, &tenant).await;
            let ns = format!("{tenant}-x");
            let mut spec: TenantAppSpec = apps::spec(0, "hello");
            spec.config.insert("empty".into(), String::new());
            spec.config.insert("storage".into(), "1Gi".into());
            apps::create(&client, &ns, "web", spec).await;
            apps::wait_ready(&client, &ns, "web").await;
            World {
                operator,
                tenant,
                ns,
            }
        })
        .await
}

fn by(manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(manager.into()),
        ..PatchParams::default()
    }
}

fn json_patch(ops: Value) -> Patch<()> {
    Patch::Json(serde_json::from_value(ops).expect("a JSON patch"))
}

/// Waits until `check` holds on the child, read as JSON.
async fn until<K>(ns: &str, name: &str, what: &str, check: impl Fn(&Value) -> bool)
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(shared().client(), ns);
    eventually(what, TIMEOUT, || async {
        let obj = serde_json::to_value(api.get(name).await.map_err(why)?).map_err(why)?;
        if check(&obj) {
            Ok(())
        } else {
            Err(obj.to_string())
        }
    })
    .await;
}

/// A second pass, triggered by an annotation of someone else's on the owner of `child` (one on
/// the child itself triggers nothing: another manager's metadata on a child does not reconcile
/// its owner), makes no request: the only request counted is that annotation itself.
///
/// The control plane's own controllers also read now and then; a count that includes one of
/// their reads is measured again (up to 3 times): a pass of ours that made requests would make
/// them every time.
async fn second_pass_makes_no_request(w: &World, api: &Api<DynamicObject>, child: &str) {
    let (owners, owner) = owner_of(api, child, &w.ns).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        quiet().await;
        let reconciles =
            w.operator.reconciles("tenant").await + w.operator.reconciles("tenantapp").await;
        let before = requests().await;
        let poke = json!({"metadata": {"annotations": {"example.com/poke": unique_name("p")}}});
        owners
            .patch(&owner, &by("poker"), &Patch::Merge(&poke))
            .await
            .expect("poke");
        eventually("a reconcile after the poke", TIMEOUT, || async {
            let now =
                w.operator.reconciles("tenant").await + w.operator.reconciles("tenantapp").await;
            if now > reconciles {
                Ok(())
            } else {
                Err(format!("{now}"))
            }
        })
        .await;
        let d = grown(&before, &requests().await);
        if d.values().sum::<u64>() == 1 {
            return;
        }
        seen.push(d);
    }
    panic!("requests during a converged pass (besides the poke): {seen:?}");
}

/// The API and name of the Tenant or TenantApp that controls `child`.
async fn owner_of(api: &Api<DynamicObject>, child: &str, ns: &str) -> (Api<DynamicObject>, String) {
    let obj = api.get(child).await.expect("child");
    let owner = obj
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .find(|r| r.controller == Some(true))
        .expect("a controller ownerReference");
    let api = if owner.kind == "Tenant" {
        Api::all_with(shared().client(), &ApiResource::erase::<Tenant>(&()))
    } else {
        Api::namespaced_with(shared().client(), ns, &ApiResource::erase::<TenantApp>(&()))
    };
    (api, owner.name)
}

fn dynamic<K: kube::Resource<DynamicType = ()>>(ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        shared().client(),
        ns,
        &kube::api::ApiResource::erase::<K>(&()),
    )
}

/// An Event with reason `DriftRepaired` on tenant or app `owner` whose note has `needle`.
async fn drift_event(owner: &str, needle: &str) {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(shared().client());
    eventually("a DriftRepaired event", TIMEOUT, || async {
        let list = events.list(&Default::default()).await.map_err(why)?;
        let notes: Vec<String> = list
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("DriftRepaired"))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(owner))
            .filter_map(|e| e.note.clone())
            .collect();
        if notes.iter().any(|n| n.contains(needle)) {
            Ok(())
        } else {
            Err(format!("{notes:?}"))
        }
    })
    .await;
}

fn subjects(v: &Value) -> Vec<String> {
    v["subjects"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| s["name"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The owners' binding as stored, with the subject mallory added.
async fn with_mallory(api: &Api<DynamicObject>) -> Value {
    let mut rb = serde_json::to_value(api.get(OWNERS).await.expect("rb")).expect("json");
    rb["subjects"]
        .as_array_mut()
        .expect("subjects")
        .push(json!({"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"}));
    rb
}

#[tokio::test]
async fn extra_subject_in_owners_binding_is_removed() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<RoleBinding>(&w.ns);
    let rb = with_mallory(&api).await;
    let rb: DynamicObject = serde_json::from_value(rb).expect("rb");
    api.replace(
        OWNERS,
        &kube::api::PostParams {
            field_manager: Some("kubectl-replace".into()),
            ..Default::default()
        },
        &rb,
    )
    .await
    .expect("replace");
    until::<RoleBinding>(&w.ns, OWNERS, "mallory gone", |v| {
        subjects(v) == ["alice", "admins"]
    })
    .await;
    drift_event(
        &w.tenant,
        ".subjects changed by kubectl-replace (Update), restored",
    )
    .await;
    second_pass_makes_no_request(w, &api, OWNERS).await;
}

/// A write under the operator's own field manager name (anyone allowed to write the object
/// can make one) does not hide the next tamper: taking a field from the operator is still
/// reported as the taker's.
#[tokio::test]
async fn a_write_under_our_name_does_not_hide_the_next_tamper() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<RoleBinding>(&w.ns);
    let rb = with_mallory(&api).await;
    let tampered = json!({"subjects": rb["subjects"]});
    // Adds mallory to the owners' binding as `manager`; waits until the operator has taken
    // the subject out again, said so naming `manager`, and is converged.
    let tamper = |manager: &'static str| {
        let (api, tampered) = (&api, &tampered);
        async move {
            api.patch(OWNERS, &by(manager), &Patch::Merge(tampered))
                .await
                .expect("patch");
            until::<RoleBinding>(&w.ns, OWNERS, "mallory gone", |v| {
                subjects(v) == ["alice", "admins"]
            })
            .await;
            let note = format!(".subjects changed by {manager} (Update), restored");
            drift_event(&w.tenant, &note).await;
            second_pass_makes_no_request(w, api, OWNERS).await;
        }
    };
    // A first tamper, repaired by an apply: the operator's record is an `Apply` entry now.
    tamper("before-forgery").await;
    // The write under our name: an `Update` entry of ours beside the `Apply` entry.
    let forged = json!({"metadata": {"labels": {"forged": "x"}}});
    api.patch(OWNERS, &by("idem-operator"), &Patch::Merge(&forged))
        .await
        .expect("patch as idem-operator");
    tamper("after-forgery").await;
}

#[tokio::test]
async fn removed_subject_is_restored() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<RoleBinding>(&w.ns);
    api.patch(
        OWNERS,
        &by("kubectl-patch"),
        &json_patch(json!([{"op": "remove", "path": "/subjects/1"}])),
    )
    .await
    .expect("patch");
    until::<RoleBinding>(&w.ns, OWNERS, "admins back", |v| {
        subjects(v) == ["alice", "admins"]
    })
    .await;
    second_pass_makes_no_request(w, &api, OWNERS).await;
}

#[tokio::test]
async fn narrowed_pod_selector_is_restored() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<NetworkPolicy>(&w.ns);
    let p = json!({"spec": {"podSelector": {"matchLabels": {"nope": "x"}}}});
    api.patch(ISOLATION, &by("kubectl-patch"), &Patch::Merge(&p))
        .await
        .expect("patch");
    until::<NetworkPolicy>(&w.ns, ISOLATION, "podSelector {}", |v| {
        v["spec"]["podSelector"] == json!({})
    })
    .await;
    second_pass_makes_no_request(w, &api, ISOLATION).await;
}

#[tokio::test]
async fn added_match_expressions_are_removed() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<NetworkPolicy>(&w.ns);
    let p = json!({"spec": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}}});
    api.patch(ISOLATION, &by("kubectl-patch"), &Patch::Merge(&p))
        .await
        .expect("patch");
    until::<NetworkPolicy>(&w.ns, ISOLATION, "podSelector {}", |v| {
        v["spec"]["podSelector"] == json!({})
    })
    .await;
    second_pass_makes_no_request(w, &api, ISOLATION).await;
}

#[tokio::test]
async fn added_ingress_rule_is_removed() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<NetworkPolicy>(&w.ns);
    api.patch(
        ISOLATION,
        &by("kubectl-patch"),
        &json_patch(json!([{"op": "add", "path": "/spec/ingress/-", "value": {}}])),
    )
    .await
    .expect("patch");
    until::<NetworkPolicy>(&w.ns, ISOLATION, "one ingress rule", |v| {
        v["spec"]["ingress"].as_array().map(Vec::len) == Some(1)
    })
    .await;
    second_pass_makes_no_request(w, &api, ISOLATION).await;
}

#[tokio::test]
async fn quota_cpu_changed_by_another_manager_is_restored() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<ResourceQuota>(&w.ns);
    let p = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": QUOTA}, "spec": {"hard": {"cpu": "100"}}});
    api.patch(
        QUOTA,
        &PatchParams::apply("other-tool").force(),
        &Patch::Apply(&p),
    )
    .await
    .expect("apply");
    until::<ResourceQuota>(&w.ns, QUOTA, "cpu 4", |v| v["spec"]["hard"]["cpu"] == "4").await;
    let quota = format!(
        "ResourceQuota/{}/{QUOTA}: .spec.hard.cpu changed by other-tool (Apply), restored",
        w.ns
    );
    drift_event(&w.tenant, &quota).await;
    second_pass_makes_no_request(w, &api, QUOTA).await;
}

#[tokio::test]
async fn quota_key_added_by_another_manager_stays_theirs() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<ResourceQuota>(&w.ns);
    let p = json!({"spec": {"hard": {"secrets": "5"}}});
    api.patch(QUOTA, &by("other-tool"), &Patch::Merge(&p))
        .await
        .expect("patch");
    second_pass_makes_no_request(w, &api, QUOTA).await;
    let q = api.get(QUOTA).await.expect("quota");
    assert_eq!(q.data["spec"]["hard"]["secrets"], "5", "theirs, kept");
}

#[tokio::test]
async fn limit_range_default_changed_is_restored() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<LimitRange>(&w.ns);
    api.patch(
        LIMITS,
        &by("kubectl-patch"),
        &json_patch(
            json!([{"op": "replace", "path": "/spec/limits/0/defaultRequest/cpu", "value": "1"}]),
        ),
    )
    .await
    .expect("patch");
    until::<LimitRange>(&w.ns, LIMITS, "cpu 100m", |v| {
        v["spec"]["limits"][0]["defaultRequest"]["cpu"] == "100m"
    })
    .await;
    second_pass_makes_no_request(w, &api, LIMITS).await;
}

#[tokio::test]
async fn removed_managed_by_label_is_restored() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<RoleBinding>(&w.ns);
    api.patch(
        OWNERS,
        &by("kubectl-label"),
        &json_patch(
            json!([{"op": "remove", "path": "/metadata/labels/app.kubernetes.io~1managed-by"}]),
        ),
    )
    .await
    .expect("patch");
    until::<RoleBinding>(&w.ns, OWNERS, "label back", |v| {
        v["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "idem-operator"
    })
    .await;
    second_pass_makes_no_request(w, &api, OWNERS).await;
}

#[tokio::test]
async fn removed_owner_reference_is_restored() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<LimitRange>(&w.ns);
    api.patch(
        LIMITS,
        &by("kubectl-patch"),
        &json_patch(json!([{"op": "remove", "path": "/metadata/ownerReferences"}])),
    )
    .await
    .expect("patch");
    until::<LimitRange>(&w.ns, LIMITS, "ownerReference back", |v| {
        v["metadata"]["ownerReferences"][0]["kind"] == "Tenant"
    })
    .await;
    second_pass_makes_no_request(w, &api, LIMITS).await;
}

#[tokio::test]
async fn finalizer_added_by_another_controller_is_kept() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<NetworkPolicy>(&w.ns);
    let p = json!({"metadata": {"finalizers": ["example.com/keep"]}});
    api.patch(ISOLATION, &by("other-controller"), &Patch::Merge(&p))
        .await
        .expect("patch");
    second_pass_makes_no_request(w, &api, ISOLATION).await;
    let np = api.get(ISOLATION).await.expect("np");
    assert_eq!(
        np.metadata.finalizers,
        Some(vec!["example.com/keep".to_owned()])
    );
    let p = json!({"metadata": {"finalizers": null}});
    api.patch(ISOLATION, &by("other-controller"), &Patch::Merge(&p))
        .await
        .expect("release");
}

#[tokio::test]
async fn removed_allow_privilege_escalation_is_restored() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<Deployment>(&w.ns);
    api.patch("web", &by("kubectl-patch"), &json_patch(json!([{"op": "remove", "path": "/spec/template/spec/containers/0/securityContext/allowPrivilegeEscalation"}])))
        .await
        .expect("patch");
    until::<Deployment>(&w.ns, "web", "allowPrivilegeEscalation false", |v| {
        v["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] == false
    })
    .await;
    // The second pass is poked through the app, the owner of both.
    second_pass_makes_no_request(w, &dynamic::<ConfigMap>(&w.ns), "web-config").await;
}

#[tokio::test]
async fn duplicate_env_entry_is_removed() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<Deployment>(&w.ns);
    api.patch("web", &by("kubectl-patch"), &json_patch(json!([{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {"name": "LOG_LEVEL", "value": "debug"}}])))
        .await
        .expect("patch");
    until::<Deployment>(&w.ns, "web", "one LOG_LEVEL=info", |v| {
        v["spec"]["template"]["spec"]["containers"][0]["env"]
            == json!([{"name": "LOG_LEVEL", "value": "info"}])
    })
    .await;
    // The second pass is poked through the app, the owner of both.
    second_pass_makes_no_request(w, &dynamic::<ConfigMap>(&w.ns), "web-config").await;
}

#[tokio::test]
async fn config_map_empty_value_changed_is_restored() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<ConfigMap>(&w.ns);
    let p = json!({"data": {"empty": "x"}});
    api.patch("web-config", &by("kubectl-patch"), &Patch::Merge(&p))
        .await
        .expect("patch");
    until::<ConfigMap>(&w.ns, "web-config", "empty again", |v| {
        v["data"]["empty"] == ""
    })
    .await;
    second_pass_makes_no_request(w, &api, "web-config").await;
}

#[tokio::test]
async fn config_map_key_named_storage_is_a_string() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let api = dynamic::<ConfigMap>(&w.ns);
    let p = json!({"data": {"storage": "1024Mi"}});
    api.patch("web-config", &by("kubectl-patch"), &Patch::Merge(&p))
        .await
        .expect("patch");
    until::<ConfigMap>(&w.ns, "web-config", "1Gi again", |v| {
        v["data"]["storage"] == "1Gi"
    })
    .await;
    second_pass_makes_no_request(w, &api, "web-config").await;
}

/// The `DriftRepaired` Events on tenant or app `owner` whose note has `needle`.
async fn drift_events(owner: &str, needle: &str) -> usize {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(shared().client());
    let list = events.list(&Default::default()).await.expect("events");
    list.items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("DriftRepaired"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(owner))
        .filter(|e| e.note.as_deref().is_some_and(|n| n.contains(needle)))
        .count()
}

/// A ConfigMap's only key removed while another manager shares its `data` (it added a key of
/// its own) is restored and named every time, not only the first: each removal is a
/// `DriftRepaired` Event of its own naming the key. (The removal leaves our entry holding the
/// map alone, `f:data: {}`, which once read as owning the whole map: the first Event named
/// `.data`, the later ones were never published.)
#[tokio::test]
async fn the_only_key_removed_again_and_again_from_a_shared_config_map_is_named_each_time() {
    let _s = SERIAL.lock().await;
    let w = world().await;
    let client = shared().client();
    apps::create(&client, &w.ns, "shared", apps::spec(0, "k1")).await;
    apps::wait_ready(&client, &w.ns, "shared").await;
    let api = dynamic::<ConfigMap>(&w.ns);
    let theirs = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"extra": "theirs"}});
    api.patch(
        "shared-config",
        &PatchParams::apply("sidecar-injector"),
        &Patch::Apply(&theirs),
    )
    .await
    .expect("another manager's key");
    let remove = json!([{"op": "remove", "path": "/data/app.toml"}]);
    for round in 1..=3 {
        let before = drift_events("shared", ".data.app.toml").await;
        api.patch(
            "shared-config",
            &by("kubectl-patch"),
            &json_patch(remove.clone()),
        )
        .await
        .expect("remove the key");
        until::<ConfigMap>(&w.ns, "shared-config", "the key back", |v| {
            v["data"]["app.toml"] == "k1" && v["data"]["extra"] == "theirs"
        })
        .await;
        eventually(
            &format!("removal {round} named in an Event of its own"),
            TIMEOUT,
            || async {
                let now = drift_events("shared", ".data.app.toml").await;
                if now > before {
                    Ok(())
                } else {
                    Err(format!("{now} Events naming .data.app.toml"))
                }
            },
        )
        .await;
    }
    second_pass_makes_no_request(w, &api, "shared-config").await;
}
