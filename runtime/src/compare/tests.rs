//! Unit tests of comparison by meaning.

use super::*;
use serde_json::json;

#[test]
fn server_defaults_are_not_drift() {
    let desired = json!({"spec": {"replicas": 2, "template": {"spec": {"containers": [
        {"name": "app", "image": "nginx:1", "ports": [{"containerPort": 80}]}]}}}});
    let live = json!({"spec": {"replicas": 2, "strategy": {"type": "RollingUpdate"},
        "template": {"spec": {"restartPolicy": "Always", "containers": [
        {"name": "app", "image": "nginx:1", "imagePullPolicy": "IfNotPresent",
         "terminationMessagePath": "/dev/termination-log",
         "ports": [{"containerPort": 80, "protocol": "TCP"}]}]}}}});
    assert!(is_applied(&desired, Some(&live)));
    assert!(drift(&desired, &live).is_empty());
}

#[test]
fn changed_owned_field_is_drift_with_path() {
    let desired = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "app", "image": "nginx:2"}]}}}});
    let live = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "app", "image": "nginx:1"}, {"name": "sidecar", "image": "x"}]}}}});
    assert!(!is_applied(&desired, Some(&live)));
    assert_eq!(
        drift(&desired, &live),
        vec![".spec.template.spec.containers[name=app].image"]
    );
}

#[test]
fn quantities_compare_by_value() {
    let desired = json!({"spec": {"hard": {"cpu": "1000m", "memory": "1Gi", "pods": "20"}}});
    let live = json!({"spec": {"hard": {"cpu": "1", "memory": "1024Mi", "pods": "20"}}});
    assert!(is_applied(&desired, Some(&live)));
    let changed = json!({"spec": {"hard": {"cpu": "2", "memory": "1Gi", "pods": "20"}}});
    assert_eq!(drift(&desired, &changed), vec![".spec.hard.cpu"]);
    // A container's resources.
    let d = json!({"resources": {"limits": {"cpu": "0.5"}, "requests": {"memory": 1048576}}});
    let l = json!({"resources": {"limits": {"cpu": "500m"}, "requests": {"memory": "1Mi"}}});
    assert!(is_applied(&d, Some(&l)));
}

#[test]
fn quantity_rules_do_not_leak_to_other_strings() {
    let desired = json!({"metadata": {"labels": {"v": "1000m"}}});
    let live = json!({"metadata": {"labels": {"v": "1"}}});
    assert!(!is_applied(&desired, Some(&live)));
}

#[test]
fn int_or_string() {
    let desired = json!({"ports": [{"port": 80, "targetPort": 8080}]});
    let live = json!({"ports": [{"port": 80, "targetPort": "8080", "protocol": "TCP"}]});
    assert!(is_applied(&desired, Some(&live)));
    let named = json!({"ports": [{"port": 80, "targetPort": "http", "protocol": "TCP"}]});
    assert!(!is_applied(&desired, Some(&named)));
}

#[test]
fn empty_equals_absent() {
    let desired = json!({"metadata": {"annotations": {}}, "spec": {"args": [], "paused": false,
        "note": "", "x": null}});
    let live = json!({"metadata": {}, "spec": {}});
    assert!(is_applied(&desired, Some(&live)));
    assert!(is_applied(&json!({}), None));
    assert!(!is_applied(&json!({"a": 1}), None));
}

#[test]
fn atomic_lists_need_same_length_and_order() {
    let desired = json!({"args": ["a", "b"]});
    assert!(is_applied(&desired, Some(&json!({"args": ["a", "b"]}))));
    assert!(!is_applied(&desired, Some(&json!({"args": ["b", "a"]}))));
    assert!(!is_applied(
        &desired,
        Some(&json!({"args": ["a", "b", "c"]}))
    ));
}

#[test]
fn port_protocol_is_part_of_the_key() {
    let desired = json!({"ports": [{"port": 53, "protocol": "UDP", "name": "dns"}]});
    let live = json!({"ports": [{"port": 53, "protocol": "TCP", "name": "dns-tcp"}]});
    // Matched by name first: "dns" is missing in live.
    assert!(!is_applied(&desired, Some(&live)));
}

#[test]
fn same_meaning_is_symmetric_for_spec_values() {
    assert!(same_meaning(
        &json!({"a": [1, 2]}),
        &json!({"a": [1, 2]}),
        false
    ));
    assert!(!same_meaning(
        &json!({"a": [1, 2]}),
        &json!({"a": [1]}),
        false
    ));
    assert!(same_meaning(
        &json!({"limits": {"cpu": "1000m"}}),
        &json!({"limits": {"cpu": "1"}}),
        false
    ));
    assert!(!same_meaning(&json!("1000m"), &json!("1"), false));
    assert!(same_meaning(&json!(80), &json!("80"), false));
}

#[test]
fn field_diff_paths() {
    let mut out = Vec::new();
    __field_diff("replicas", &1, &2, &mut out);
    __field_diff("same", &"x", &"x", &mut out);
    let a: std::collections::BTreeMap<&str, &str> = [("a", "1"), ("b", "2")].into();
    let b: std::collections::BTreeMap<&str, &str> = [("a", "1"), ("c", "3")].into();
    __field_diff("config", &a, &b, &mut out);
    __field_diff("list", &vec![1, 2], &vec![1, 3], &mut out);
    __field_diff("opt", &None::<u8>, &Some(1u8), &mut out);
    assert_eq!(
        out,
        vec!["replicas", "config.b", "config.c", "list[1]", "opt"]
    );
}
