//! Unit tests of the convergence rule on hand-written objects (the real API server's answers
//! are checked by the oracle test in `runtime/tests/engine/oracle.rs`).

use super::*;
use serde_json::{Value, json};

const M: &str = "idem-operator";

fn entry(manager: &str, op: &str, fields: Value) -> Value {
    json!({"manager": manager, "operation": op, "apiVersion": "v1", "fieldsType": "FieldsV1",
           "fieldsV1": fields})
}

fn with_fields(mut live: Value, entries: Vec<Value>) -> Value {
    live["metadata"]["managedFields"] = Value::Array(entries);
    live
}

fn rolebinding(subjects: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": "idem-owners", "namespace": "ns", "labels": {"a": "b"}},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
           "subjects": subjects})
}

fn rb_fields() -> Value {
    json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:roleRef": {}, "f:subjects": {}})
}

#[test]
fn converged_when_our_entry_covers_and_values_equal() {
    let d = rolebinding(
        json!([{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]),
    );
    let live = with_fields(d.clone(), vec![entry(M, "Apply", rb_fields())]);
    assert_eq!(check(&d, &live, M), vec![]);
}

#[test]
fn never_applied_and_update_entries_do_not_count() {
    let d = rolebinding(json!([]));
    let live = with_fields(d.clone(), vec![entry(M, "Update", rb_fields())]);
    assert_eq!(check(&d, &live, M)[0].kind, DriftKind::NeverApplied);
}

#[test]
fn atomic_list_taken_by_another_manager_names_it() {
    let d = rolebinding(json!([{"kind": "User", "name": "alice"}]));
    let mut live = rolebinding(
        json!([{"kind": "User", "name": "alice"}, {"kind": "User", "name": "mallory"}]),
    );
    live = with_fields(
        live,
        vec![
            entry(
                M,
                "Apply",
                json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:roleRef": {}}),
            ),
            entry("kubectl-edit", "Update", json!({"f:subjects": {}})),
        ],
    );
    let drift = check(&d, &live, M);
    assert_eq!(drift.len(), 1, "{drift:?}");
    assert_eq!(
        drift[0].to_string(),
        ".subjects changed by kubectl-edit (Update)"
    );
}

#[test]
fn atomic_value_compares_whole_even_when_still_ours() {
    // Someone applying under our own manager name with extra items.
    let d = rolebinding(json!([{"kind": "User", "name": "alice"}]));
    let live = with_fields(
        rolebinding(
            json!([{"kind": "User", "name": "alice"}, {"kind": "User", "name": "mallory"}]),
        ),
        vec![entry(M, "Apply", rb_fields())],
    );
    assert_eq!(check(&d, &live, M)[0].kind, DriftKind::Changed);
    // An empty atomic struct (podSelector: {}) against a non-empty one.
    let d = json!({"kind": "NetworkPolicy", "metadata": {}, "spec": {"podSelector": {}}});
    let live = with_fields(
        json!({"kind": "NetworkPolicy", "metadata": {}, "spec": {"podSelector": {"matchLabels": {"x": "y"}}}}),
        vec![entry(M, "Apply", json!({"f:spec": {"f:podSelector": {}}}))],
    );
    assert_eq!(check(&d, &live, M)[0].path, ".spec.podSelector");
}

#[test]
fn quantities_by_path_only() {
    let d = json!({"kind": "ResourceQuota", "metadata": {}, "spec": {"hard": {"cpu": "1000m", "memory": "1Gi"}}});
    let f = json!({"f:spec": {"f:hard": {"f:cpu": {}, "f:memory": {}}}});
    let live = with_fields(
        json!({"kind": "ResourceQuota", "metadata": {}, "spec": {"hard": {"cpu": "1", "memory": "1024Mi"}}}),
        vec![entry(M, "Apply", f.clone())],
    );
    assert!(is_converged(&d, &live, M));
    // A ConfigMap key called `storage` is a string.
    let d = json!({"kind": "ConfigMap", "metadata": {}, "data": {"storage": "1Gi"}});
    let live = with_fields(
        json!({"kind": "ConfigMap", "metadata": {}, "data": {"storage": "1024Mi"}}),
        vec![entry(M, "Apply", json!({"f:data": {"f:storage": {}}}))],
    );
    assert_eq!(check(&d, &live, M)[0].path, ".data.storage");
}

#[test]
fn a_quantity_spelled_otherwise_and_owned_by_another_manager_too_is_converged() {
    // Their apply of the stored "500m" shares the field with our "0.5": the values and our
    // record would stay as they are, so no apply (which would strip their ownership, and a
    // co-applier judging its own record would then apply again: a fight).
    let d = json!({"kind": "ResourceQuota", "metadata": {}, "spec": {"hard": {"requests.storage": "0.5"}}});
    let f = json!({"f:spec": {"f:hard": {"f:requests.storage": {}}}});
    let live = json!({"kind": "ResourceQuota", "metadata": {}, "spec": {"hard": {"requests.storage": "500m"}}});
    let shared = with_fields(
        live.clone(),
        vec![
            entry("their-apply", "Apply", f.clone()),
            entry(M, "Apply", f.clone()),
        ],
    );
    assert!(is_converged(&d, &shared, M));
    // Another value, though, is drift whoever else owns the field.
    let d = json!({"kind": "ResourceQuota", "metadata": {}, "spec": {"hard": {"requests.storage": "0.6"}}});
    assert_eq!(check(&d, &shared, M)[0].path, ".spec.hard.requests.storage");
}

#[test]
fn removed_field_is_drift_and_omitted_zero_is_not() {
    let d = json!({"kind": "X", "metadata": {}, "spec": {"a": false, "b": false}});
    // `a` was removed (its ownership went with it); `b` is owned but Go omitted the zero value.
    let live = with_fields(
        json!({"kind": "X", "metadata": {}, "spec": {}}),
        vec![entry(M, "Apply", json!({"f:spec": {"f:b": {}}}))],
    );
    let drift = check(&d, &live, M);
    assert_eq!(drift.len(), 1, "{drift:?}");
    // A zero value no one owns is drift; whether removed or never stored, the server says
    // (the engine asks it before writing).
    assert_eq!(drift[0].to_string(), ".spec.a removed or never stored");
    assert_eq!(drift[0].kind, DriftKind::Unrecorded);
    // A non-zero owned value that is absent is drift.
    let d = json!({"kind": "X", "metadata": {}, "spec": {"b": true}});
    assert_eq!(check(&d, &live, M)[0].kind, DriftKind::Changed);
}

#[test]
fn fields_we_own_but_no_longer_desire_are_stale() {
    let d = json!({"kind": "ConfigMap", "metadata": {}, "data": {"a": "1"}});
    let live = with_fields(
        json!({"kind": "ConfigMap", "metadata": {}, "data": {"a": "1", "b": "2"}}),
        vec![entry(M, "Apply", json!({"f:data": {"f:a": {}, "f:b": {}}}))],
    );
    let drift = check(&d, &live, M);
    assert_eq!(
        drift,
        vec![Drift {
            path: ".data.b".into(),
            kind: DriftKind::Stale
        }]
    );
}

#[test]
fn keys_other_managers_own_in_granular_maps_stay_theirs() {
    let d = json!({"kind": "ResourceQuota", "metadata": {}, "spec": {"hard": {"cpu": "1"}}});
    let live = with_fields(
        json!({"kind": "ResourceQuota", "metadata": {}, "spec": {"hard": {"cpu": "1", "pods": "3"}}}),
        vec![
            entry(M, "Apply", json!({"f:spec": {"f:hard": {"f:cpu": {}}}})),
            entry(
                "kubectl",
                "Update",
                json!({"f:spec": {"f:hard": {"f:pods": {}}}}),
            ),
        ],
    );
    assert!(is_converged(&d, &live, M));
}

#[test]
fn keyed_lists_match_by_recorded_key_with_defaulted_key_fields() {
    let d = json!({"kind": "Service", "metadata": {}, "spec": {"ports": [{"name": "http", "port": 80}]}});
    let ours = json!({"f:spec": {"f:ports": {"k:{\"port\":80,\"protocol\":\"TCP\"}":
        {".": {}, "f:name": {}, "f:port": {}}}}});
    let live = with_fields(
        json!({"kind": "Service", "metadata": {}, "spec": {"ports": [
            {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}]}}),
        vec![entry(M, "Apply", ours.clone())],
    );
    assert!(is_converged(&d, &live, M), "{:?}", check(&d, &live, M));
    // A duplicate of our item is drift.
    let dup = with_fields(
        json!({"kind": "Service", "metadata": {}, "spec": {"ports": [
            {"name": "http", "port": 80, "protocol": "TCP"},
            {"name": "http2", "port": 80, "protocol": "TCP"}]}}),
        vec![entry(M, "Apply", ours)],
    );
    assert_eq!(
        check(&d, &dup, M)[0].path,
        ".spec.ports[port=80,protocol=TCP]"
    );
}

#[test]
fn integers_compare_exactly_above_two_to_the_53() {
    let d = json!({"kind": "X", "metadata": {}, "spec": {"n": 9_007_199_254_740_993_i64}});
    let live = with_fields(
        json!({"kind": "X", "metadata": {}, "spec": {"n": 9_007_199_254_740_992_i64}}),
        vec![entry(M, "Apply", json!({"f:spec": {"f:n": {}}}))],
    );
    assert_eq!(check(&d, &live, M)[0].kind, DriftKind::Changed);
}

#[test]
fn spec_diff_paths() {
    let mut out = Vec::new();
    __field_diff("replicas", &1, &2, &mut out);
    __field_diff("same", &"x", &"x", &mut out);
    let a: std::collections::BTreeMap<&str, &str> = [("a", "1"), ("b", "2")].into();
    let b: std::collections::BTreeMap<&str, &str> = [("a", "1"), ("c", "3")].into();
    __field_diff("config", &a, &b, &mut out);
    __field_diff("list", &vec![1, 2], &vec![1, 3], &mut out);
    __field_diff("opt", &None::<u8>, &Some(1u8), &mut out);
    __field_diff("q", &"1000m", &"1", &mut out);
    assert_eq!(
        out,
        vec!["replicas", "config.b", "config.c", "list[1]", "opt", "q"]
    );
}

#[test]
fn a_zero_value_no_one_records_and_the_object_lacks_is_left_to_the_server() {
    let desired = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "ns"},
        "data": {"a": "", "b": "x"}});
    let fields = json!({"f:data": {"f:b": {}}});
    // `a` absent: omitted on the wire, or removed by someone; the check cannot tell.
    let mut live = with_fields(desired.clone(), vec![entry(M, "Apply", fields.clone())]);
    live["data"] = json!({"b": "x"});
    assert_eq!(
        check(&desired, &live, M),
        vec![Drift {
            path: ".data.a".into(),
            kind: DriftKind::Unrecorded
        }]
    );
    // Held by the object yet owned by no one: not that (an apply would record it).
    let mut held = with_fields(desired.clone(), vec![entry(M, "Apply", fields.clone())]);
    held["data"] = json!({"a": "", "b": "x"});
    assert_eq!(
        check(&desired, &held, M),
        vec![Drift {
            path: ".data.a".into(),
            kind: DriftKind::NotOwned { managers: vec![] }
        }]
    );
    // A value that is not a zero value, absent: removed, whoever did it.
    let desired = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "y", "b": "x"}});
    assert_eq!(
        check(&desired, &live, M),
        vec![Drift {
            path: ".data.a".into(),
            kind: DriftKind::NotOwned { managers: vec![] }
        }]
    );
}
