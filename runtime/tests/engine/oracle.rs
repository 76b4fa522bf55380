//! The convergence check against the real API server: for random desired bodies of the child
//! kinds the operator manages and random tampering by other field managers, `compare::check`
//! says "converged" exactly when a `dryRun=All` forced server-side apply of the desired body
//! would leave the object unchanged.
//!
//! `IDEM_ORACLE_SEED` replays a run (the seed is printed); `IDEM_ORACLE_CASES` sets the number
//! of cases (default 240, at least 200 are required).

use idem_runtime::TenantKey;
use idem_runtime::apply::{Applier, ChildOutcome, DesiredChildren, Owner, as_applied};
use idem_runtime::compare::{DriftKind, check};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, LimitRange, ResourceQuota, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::common::*;

const FM: &str = "idem-operator";

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    items.choose(rng).expect("non-empty")
}

fn quantity(rng: &mut StdRng) -> &'static str {
    const Q: [&str; 10] = [
        "1", "1000m", "2", "500m", "0.5", "1Gi", "1024Mi", "10", "100m", "0.1",
    ];
    Q[rng.random_range(0..Q.len())]
}

/// A random desired body (JSON) of one of the child kinds, named `name`.
fn desired(rng: &mut StdRng, kind: &str, name: &str) -> Value {
    let meta = json!({"name": name});
    match kind {
        "ConfigMap" => {
            let mut data = serde_json::Map::new();
            for _ in 0..rng.random_range(0..4) {
                let k = *pick(rng, &["a", "storage", "hard", "empty", "cpu"]);
                let v = *pick(rng, &["", "1Gi", "1024Mi", "x", "ä€", "false", "0"]);
                data.insert(k.into(), json!(v));
            }
            let mut body = json!({"metadata": meta, "data": data});
            if rng.random_bool(0.3) {
                body["metadata"]["labels"] = json!({"team": pick(rng, &["a", "b"])});
            }
            body
        }
        "ResourceQuota" => {
            let mut hard = serde_json::Map::new();
            for _ in 0..rng.random_range(1..4) {
                let k = *pick(
                    rng,
                    &["cpu", "memory", "pods", "requests.storage", "limits.cpu"],
                );
                let v = if k == "pods" {
                    "10".to_owned()
                } else {
                    quantity(rng).to_owned()
                };
                hard.insert(k.into(), json!(v));
            }
            json!({"metadata": meta, "spec": {"hard": hard}})
        }
        "LimitRange" => {
            let mut item = json!({"type": "Container"});
            if rng.random_bool(0.7) {
                item["default"] = json!({"cpu": pick(rng, &["1", "1000m", "2"])});
            }
            if rng.random_bool(0.7) {
                item["defaultRequest"] = json!({"cpu": pick(rng, &["100m", "0.1", "500m"])});
            }
            json!({"metadata": meta, "spec": {"limits": [item]}})
        }
        "RoleBinding" => {
            let mut subjects = Vec::new();
            for i in 0..rng.random_range(1..3) {
                subjects.push(match rng.random_range(0..3) {
                    0 => json!({"kind": "User", "name": format!("u{i}"),
                                "apiGroup": "rbac.authorization.k8s.io"}),
                    1 => json!({"kind": "Group", "name": format!("g{i}"),
                                "apiGroup": "rbac.authorization.k8s.io"}),
                    _ => json!({"kind": "ServiceAccount", "name": format!("s{i}"),
                                "namespace": "default"}),
                });
            }
            json!({"metadata": meta, "subjects": subjects,
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": pick(rng, &["admin", "edit", "view"])}})
        }
        "NetworkPolicy" => {
            let selector = if rng.random_bool(0.6) {
                json!({})
            } else {
                json!({"matchLabels": {"app": "x"}})
            };
            let mut rule = json!({"from": [{"namespaceSelector":
                {"matchLabels": {"tenancy.idem.dev/tenant": pick(rng, &["acme", "beta"])}}}]});
            if rng.random_bool(0.3) {
                rule["ports"] = json!([{"port": 80}]);
            }
            json!({"metadata": meta, "spec": {"podSelector": selector,
                   "policyTypes": ["Ingress"], "ingress": [rule]}})
        }
        "Deployment" => {
            let mut container =
                json!({"name": "app", "image": pick(rng, &["nginx:1.27", "nginx:1.28"])});
            if rng.random_bool(0.5) {
                container["securityContext"] = json!({"allowPrivilegeEscalation": false});
            }
            if rng.random_bool(0.5) {
                container["env"] = json!([{"name": "A", "value": pick(rng, &["1", "", "x"])}]);
            }
            if rng.random_bool(0.5) {
                container["resources"] = json!({"requests": {"cpu": pick(rng, &["100m", "0.1"])}});
            }
            if rng.random_bool(0.3) {
                container["ports"] = json!([{"containerPort": 8080, "name": "http"}]);
            }
            json!({"metadata": meta, "spec": {"replicas": rng.random_range(0..2),
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                             "spec": {"containers": [container]}}}})
        }
        _ => {
            let target = if rng.random_bool(0.5) {
                json!(8080)
            } else {
                json!("http")
            };
            json!({"metadata": meta, "spec": {"selector": {"app": name},
                   "ports": [{"name": "http", "port": 80, "targetPort": target}]}})
        }
    }
}

fn add(d: &mut DesiredChildren, kind: &str, body: Value) {
    fn typed<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).expect("valid typed body")
    }
    match kind {
        "ConfigMap" => d.add(&typed::<ConfigMap>(body)),
        "ResourceQuota" => d.add(&typed::<ResourceQuota>(body)),
        "LimitRange" => d.add(&typed::<LimitRange>(body)),
        "RoleBinding" => d.add(&typed::<RoleBinding>(body)),
        "NetworkPolicy" => d.add(&typed::<NetworkPolicy>(body)),
        "Deployment" => d.add(&typed::<Deployment>(body)),
        _ => d.add(&typed::<Service>(body)),
    }
    .expect("add");
}

fn resource(kind: &str) -> ApiResource {
    match kind {
        "ConfigMap" => ApiResource::erase::<ConfigMap>(&()),
        "ResourceQuota" => ApiResource::erase::<ResourceQuota>(&()),
        "LimitRange" => ApiResource::erase::<LimitRange>(&()),
        "RoleBinding" => ApiResource::erase::<RoleBinding>(&()),
        "NetworkPolicy" => ApiResource::erase::<NetworkPolicy>(&()),
        "Deployment" => ApiResource::erase::<Deployment>(&()),
        _ => ApiResource::erase::<Service>(&()),
    }
}

/// JSON pointers of the leaves (and whole lists) of `v` under `prefix`, skipping names.
fn leaves(v: &Value, prefix: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if prefix.is_empty() && matches!(k.as_str(), "apiVersion" | "kind") {
                    continue;
                }
                if prefix == "/metadata" && matches!(k.as_str(), "name" | "namespace") {
                    continue;
                }
                leaves(
                    x,
                    &format!("{prefix}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(a) => {
            out.push(prefix.to_owned());
            for (i, x) in a.iter().enumerate() {
                leaves(x, &format!("{prefix}/{i}"), out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

fn mutate(rng: &mut StdRng, v: &Value) -> Value {
    match v {
        Value::Bool(b) => json!(!b),
        Value::Number(n) => json!(n.as_i64().unwrap_or(0) + 1),
        Value::String(s) => match rng.random_range(0..4) {
            0 => json!(format!("{s}x")),
            1 => json!(quantity(rng)),
            2 => json!(""),
            _ => json!(s.clone()),
        },
        Value::Array(a) => {
            let mut a = a.clone();
            if let Some(first) = a.first().cloned() {
                a.push(first);
            }
            Value::Array(a)
        }
        Value::Object(m) if m.is_empty() || rng.random_bool(0.5) => {
            let mut m = m.clone();
            m.insert("injected".into(), json!("x"));
            Value::Object(m)
        }
        Value::Object(_) => json!({}),
        Value::Null => json!("x"),
    }
}

/// A merge patch setting pointer `ptr` to `value`.
fn merge_at(ptr: &str, value: Value) -> Value {
    let mut out = value;
    for part in ptr.trim_start_matches('/').split('/').rev() {
        let key = part.replace("~1", "/").replace("~0", "~");
        out = json!({ key: out });
    }
    out
}

/// The object `name` of case `i` as it is now; `None` when it is gone after a tampering of its
/// ownerReference (`done`): re-pointed (another uid, kind or name), the reference names an owner
/// that does not exist, and the garbage collector deletes the object, at a moment of its own.
///
/// # Panics
/// When the read fails otherwise.
async fn read(
    api: &Api<DynamicObject>,
    name: &str,
    done: &[String],
    i: usize,
    kind: &str,
) -> Option<DynamicObject> {
    match api.get(name).await {
        Ok(obj) => Some(obj),
        Err(kube::Error::Api(s))
            if s.code == 404 && done.iter().any(|d| d.contains("/metadata/ownerReferences")) =>
        {
            None
        }
        Err(e) => panic!("case {i} {kind}: read after tampering {done:?}: {e}"),
    }
}

/// One random tampering of `live` by another writer; returns a description (or `None` when the
/// server refused it, e.g. an invalid value).
async fn tamper(
    rng: &mut StdRng,
    api: &Api<DynamicObject>,
    name: &str,
    body: &Value,
    live: &Value,
) -> Option<String> {
    let mut paths = Vec::new();
    leaves(body, "", &mut paths);
    let ptr = pick(rng, &paths).clone();
    let current = live.pointer(&ptr).cloned().unwrap_or(Value::Null);
    let is_list_item = ptr
        .rsplit('/')
        .next()
        .is_some_and(|p| p.parse::<usize>().is_ok());
    let other = |m: &str| PatchParams {
        field_manager: Some(m.into()),
        ..PatchParams::default()
    };
    let (what, result) = match rng.random_range(0..12) {
        0 | 1 if !is_list_item => {
            let v = mutate(rng, &current);
            let p = merge_at(&ptr, v.clone());
            (
                format!("merge {ptr}={v}"),
                api.patch(name, &other("kubectl-edit"), &Patch::Merge(&p))
                    .await,
            )
        }
        2 => {
            let p = json!([{"op": "remove", "path": ptr}]);
            (
                format!("json-patch remove {ptr}"),
                api.patch(
                    name,
                    &other("kubectl-patch"),
                    &Patch::Json::<()>(serde_json::from_value(p).ok()?),
                )
                .await,
            )
        }
        3 => {
            // Append to a list of ours (a duplicate of an item, or a new item).
            let lists: Vec<&String> = paths
                .iter()
                .filter(|p| live.pointer(p).is_some_and(Value::is_array))
                .collect();
            let list = (*lists.choose(rng)?).clone();
            let arr = live.pointer(&list)?.as_array()?;
            let mut item = arr.first()?.clone();
            if rng.random_bool(0.5)
                && let Some(o) = item.as_object_mut()
                && o.contains_key("name")
            {
                o.insert("name".into(), json!("mallory"));
            }
            let p = json!([{"op": "add", "path": format!("{list}/-"), "value": item}]);
            (
                format!("json-patch add {list}/- {item}"),
                api.patch(
                    name,
                    &other("kubectl-patch"),
                    &Patch::Json::<()>(serde_json::from_value(p).ok()?),
                )
                .await,
            )
        }
        4 => {
            let p =
                json!({"metadata": {"labels": {"theirs": "1"}, "annotations": {"theirs": "1"}}});
            (
                "their label".into(),
                api.patch(name, &other("kubectl-label"), &Patch::Merge(&p))
                    .await,
            )
        }
        5 if !is_list_item => {
            // Another manager applies one of our fields with another value (force).
            let v = mutate(rng, &current);
            let mut p = merge_at(&ptr, v.clone());
            p["apiVersion"] = body["apiVersion"].clone();
            p["kind"] = body["kind"].clone();
            p["metadata"]["name"] = json!(name);
            (
                format!("their forced apply {ptr}={v}"),
                api.patch(
                    name,
                    &PatchParams::apply("their-apply").force(),
                    &Patch::Apply(&p),
                )
                .await,
            )
        }
        6 => {
            // Someone writing under our manager name (operation Update).
            let v = mutate(rng, &current);
            let p = merge_at(&ptr, v.clone());
            (
                format!("merge as {FM} {ptr}={v}"),
                api.patch(name, &other(FM), &Patch::Merge(&p)).await,
            )
        }
        9 | 10 => {
            // Someone applying under our own manager name: a value changed, or a key added
            // (to a map, or to a struct we own whole).
            let mut mine = body.clone();
            let parent = ptr
                .rsplit_once('/')
                .map(|(p, _)| p.to_owned())
                .unwrap_or_default();
            let target = if rng.random_bool(0.5) && !parent.is_empty() {
                parent
            } else {
                ptr.clone()
            };
            let v = mutate(rng, live.pointer(&target).unwrap_or(&Value::Null));
            *mine.pointer_mut(&target)? = v.clone();
            (
                format!("apply as {FM} {target}={v}"),
                api.patch(name, &PatchParams::apply(FM).force(), &Patch::Apply(&mine))
                    .await,
            )
        }
        7 => {
            // A same-value update: changes nothing.
            let p = merge_at(&ptr, current.clone());
            (
                "same-value merge".into(),
                api.patch(name, &other("kubectl-edit"), &Patch::Merge(&p))
                    .await,
            )
        }
        8 => {
            // A key added to a map of ours by someone else.
            let parent = ptr
                .rsplit_once('/')
                .map(|(p, _)| p.to_owned())
                .unwrap_or_default();
            if !live.pointer(&parent).is_some_and(Value::is_object) || parent.is_empty() {
                return None;
            }
            let p = merge_at(&format!("{parent}/theirs"), json!(quantity(rng)));
            (
                format!("their key {parent}/theirs"),
                api.patch(name, &other("kubectl-edit"), &Patch::Merge(&p))
                    .await,
            )
        }
        _ => (
            "nothing".into(),
            Ok(DynamicObject::new(
                name,
                &ApiResource::erase::<ConfigMap>(&()),
            )),
        ),
    };
    result.ok().map(|_| what)
}

/// `obj` without its `managedFields`: its values alone.
fn values_only(mut obj: Value) -> Value {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    obj
}

/// Drops `manager`'s `Update` entries on the main resource from `obj`'s managedFields.
fn without_update_entry(obj: &mut Value, manager: &str) {
    if let Some(Value::Array(entries)) = obj.pointer_mut("/metadata/managedFields") {
        entries.retain(|e| {
            !(e["manager"] == manager
                && e["operation"] == "Update"
                && e["subresource"].as_str().unwrap_or_default().is_empty())
        });
    }
}

/// The object without what changes on every write regardless of content (resourceVersion,
/// managedFields timestamps) and with managedFields in a canonical order, keeping only our
/// field manager's entries: what an apply would change in other managers' entries alone is
/// a field they co-own at an equal value (a quantity spelled otherwise), which the rule
/// counts as converged (`idem_runtime::compare`); a change of a value or of our own entry
/// still shows.
fn normalised(mut v: Value) -> Value {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        if let Some(Value::Array(entries)) = m.get_mut("managedFields") {
            entries.retain(|e| e["manager"] == FM);
            for e in entries.iter_mut() {
                if let Some(e) = e.as_object_mut() {
                    e.remove("time");
                }
            }
            // A field our `Apply` entry owns is ours whichever of our entries also records it:
            // an apply that changes only its spelling drops it from our create's `Update`
            // entry, which changes no value and no ownership (see `compare::settled`).
            let apply = entries
                .iter()
                .find(|e| e["operation"] == "Apply" && e.get("subresource").is_none())
                .map(|e| e["fieldsV1"].clone());
            if let Some(apply) = apply {
                for e in entries.iter_mut() {
                    if e["operation"] == "Update" && e.get("subresource").is_none() {
                        subtract(&mut e["fieldsV1"], &apply);
                    }
                }
            }
            // Entries are keyed by manager, operation and subresource; the server moves the
            // applying manager's entry last, which means nothing.
            entries.sort_by_key(|e| {
                ["manager", "operation", "subresource"]
                    .map(|k| e[k].as_str().unwrap_or_default().to_owned())
            });
        }
    }
    v
}

/// Removes from the `fieldsV1` set `from` what `owned` owns: a leaf of `owned` (a value owned
/// whole) takes the whole node; a path is followed, and the node's own member (`.`, the map or
/// list itself) goes too, as a field `owned` holds below it needs it to exist; what is left
/// empty is removed. (An apply that respells a quantity below a map drops the map's `.` from
/// our create's `Update` entry: ownership moves between our own entries, no value changes.)
fn subtract(from: &mut Value, owned: &Value) {
    let (Some(f), Some(o)) = (from.as_object_mut(), owned.as_object()) else {
        return;
    };
    for (k, ov) in o {
        if k == "." {
            continue;
        }
        let Some(fv) = f.get_mut(k) else { continue };
        if ov.as_object().is_some_and(|m| m.is_empty()) {
            f.remove(k);
        } else {
            if let Some(m) = fv.as_object_mut() {
                m.remove(".");
            }
            subtract(fv, ov);
            if fv.as_object().is_some_and(|m| m.is_empty()) {
                f.remove(k);
            }
        }
    }
}

#[tokio::test]
async fn check_agrees_with_a_dry_run_apply_of_the_real_api_server() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let seed: u64 = std::env::var("IDEM_ORACLE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let cases: usize = std::env::var("IDEM_ORACLE_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(240);
    println!("oracle seed {seed} (IDEM_ORACLE_SEED), {cases} cases");
    let mut rng = StdRng::seed_from_u64(seed);
    let ns = namespace(&client, "oracle").await;
    let w = create_widget(&client, &ns, "owner", widget_spec()).await;
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(TenantKey::new(&ns))).expect("owner");
    let applier = Applier::new(client.clone());
    let kinds = [
        "ConfigMap",
        "ResourceQuota",
        "LimitRange",
        "RoleBinding",
        "NetworkPolicy",
        "Deployment",
        "Service",
    ];
    let mut disagreements = Vec::new();
    let (mut checked, mut drifted, mut deferred) = (0, 0, 0);
    // Cases whose object the garbage collector deleted (see `read`).
    let mut collected = 0;
    'cases: for i in 0..cases {
        let kind = *pick(&mut rng, &kinds);
        let name = format!("c{i}");
        let mut first = DesiredChildren::new();
        add(&mut first, kind, desired(&mut rng, kind, &name));
        applier
            .apply_observed(&owner, &first.children()[0], None)
            .await
            .unwrap_or_else(|e| panic!("case {i}: create {kind}: {e}"));
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource(kind));
        // Sometimes our desired body changes since (fields dropped, values changed).
        let mut now = DesiredChildren::new();
        let changed_desired = rng.random_bool(0.2);
        if changed_desired {
            add(&mut now, kind, desired(&mut rng, kind, &name));
        } else {
            now = first.clone();
        }
        let mut done = Vec::new();
        for _ in 0..rng.random_range(0..3) {
            let Some(live) = read(&api, &name, &done, i, kind).await else {
                collected += 1;
                continue 'cases;
            };
            let live = serde_json::to_value(live).expect("json");
            let body = stamped(&now, &owner, &ns);
            if let Some(what) = tamper(&mut rng, &api, &name, &body, &live).await {
                done.push(what);
            }
        }
        // Judge one stable snapshot: read, dry-run apply, read again; retry when it moved
        // (the controller-manager writes Deployments).
        let body = stamped(&now, &owner, &ns);
        let mut verdict = None;
        for _ in 0..10 {
            let Some(before) = read(&api, &name, &done, i, kind).await else {
                collected += 1;
                continue 'cases;
            };
            let dry = PatchParams {
                dry_run: true,
                ..PatchParams::apply(FM).force()
            };
            let result = api.patch(&name, &dry, &Patch::Apply(&body)).await;
            let Some(after) = read(&api, &name, &done, i, kind).await else {
                collected += 1;
                continue 'cases;
            };
            if before.metadata.resource_version != after.metadata.resource_version {
                continue;
            }
            let live = serde_json::to_value(&after).expect("json");
            // A child created by `POST` and not applied to since is judged with its create's
            // `Update` entry seen as the `Apply` entry an apply records (`as_applied`): the
            // dry-run apply leaves that `Update` entry beside its new `Apply` entry, so it is
            // set aside there, and the server's `Apply` entry must equal the one seen.
            let judged = as_applied(&live, owner.label_names(), FM, &body);
            let values_change = match &result {
                Ok(res) => {
                    let dry = serde_json::to_value(res).expect("json");
                    normalised(values_only(dry)) != normalised(values_only(live.clone()))
                }
                Err(_) => true,
            };
            let would_change = match result {
                Ok(res) => {
                    let mut dry = serde_json::to_value(&res).expect("json");
                    if judged.is_some() {
                        without_update_entry(&mut dry, FM);
                    }
                    let dry = normalised(dry);
                    let changed = dry != normalised(judged.clone().unwrap_or_else(|| live.clone()));
                    if changed && std::env::var("IDEM_ORACLE_DEBUG").is_ok() {
                        println!("DRY case {i}: {dry}");
                    }
                    changed
                }
                // The server refuses the apply (e.g. an invalid merge): not converged either.
                Err(e) => {
                    if std::env::var("IDEM_ORACLE_DEBUG").is_ok() {
                        println!("DRY ERR case {i}: {e}");
                    }
                    true
                }
            };
            let drift = check(&body, judged.as_ref().unwrap_or(&live), FM);
            verdict = Some((
                would_change,
                values_change,
                drift,
                live,
                after,
                judged.is_some(),
            ));
            break;
        }
        let (would_change, values_change, drift, live, after, as_created) =
            verdict.expect("a stable snapshot");
        checked += 1;
        if !drift.is_empty() {
            drifted += 1;
        }
        // A zero value or empty map that neither the create's record nor the object holds:
        // omitted by Go on the wire, or removed by another writer. The check leaves it to the
        // server, so here the engine judges it (with the create's response it kept, or a
        // dry-run apply), and its verdict must agree with whether the server's apply would
        // change a value (the apply would also move the create's record into an `Apply` entry,
        // which is never a reason to write).
        let leave_to_server = as_created
            && !drift.is_empty()
            && drift.iter().all(|d| d.kind == DriftKind::Unrecorded);
        let would_change = if leave_to_server {
            values_change
        } else {
            would_change
        };
        let converged = if leave_to_server {
            deferred += 1;
            let outcome = applier
                .apply_observed(&owner, &now.children()[0], Some(after))
                .await
                .unwrap_or_else(|e| panic!("case {i}: engine pass {kind}: {e}"));
            if std::env::var("IDEM_ORACLE_DEBUG").is_ok() {
                println!("ENGINE case {i}: {outcome:?}");
            }
            outcome == ChildOutcome::Unchanged
        } else {
            drift.is_empty()
        };
        // Nobody touched it and we desire the same: a fresh create is converged (its create's
        // record, seen as an apply's, is exactly what an apply would have recorded), so it
        // costs no second write.
        if done.is_empty() && !changed_desired && !converged {
            disagreements.push(format!(
                "case {i} {kind}: fresh create not converged: {drift:?}\n  live {live}"
            ));
        }
        if would_change == converged {
            disagreements.push(format!(
                "case {i} {kind}: tampering {done:?}: server would change: {would_change}, check: {drift:?}\n  desired {body}\n  live {live}"
            ));
        }
    }
    // The namespace stays: the namespace controller would empty it after this test let go of
    // METRICS_LOCK, inside another test's count of writes.
    println!(
        "oracle: {checked} cases, {drifted} drifted, {deferred} left to the server, {collected} collected, {} disagreements",
        disagreements.len()
    );
    assert!(checked >= 200.min(cases), "only {checked} cases");
    assert!(
        disagreements.is_empty(),
        "seed {seed}: {} disagreements:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
}

/// The body the engine applies for the only child of `d`.
fn stamped(d: &DesiredChildren, owner: &Owner, ns: &str) -> Value {
    let mut body = d.children()[0].stamped_body(owner).expect("stamp");
    body["metadata"]["namespace"] = json!(ns);
    body
}
