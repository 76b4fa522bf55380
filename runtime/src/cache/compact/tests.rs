use serde_json::{Value, json};

use super::*;
use crate::cache::Trust;
use crate::labels::OWNER_UID_LABEL;

/// A RoleBinding as the API server returns it after our apply, with a `kubectl apply`
/// (client-side) annotation and a status some controller wrote.
fn child(apply_owns_last_applied: bool) -> Value {
    let ours = if apply_owns_last_applied {
        json!({"f:metadata": {"f:annotations": {format!("f:{LAST_APPLIED}"): {}},
                              "f:labels": {format!("f:{OWNER_UID_LABEL}"): {}}}})
    } else {
        json!({"f:metadata": {"f:labels": {format!("f:{OWNER_UID_LABEL}"): {}}}})
    };
    json!({
        "metadata": {
            "name": "idem-owners", "namespace": "acme", "uid": "c1", "resourceVersion": "7",
            "labels": {OWNER_UID_LABEL: "owner-1"},
            "annotations": {LAST_APPLIED: "{\"big\":\"copy\"}", "keep": "me"},
            "managedFields": [
                {"manager": "idem-operator", "operation": "Apply", "time": "2026-01-01T00:00:00Z",
                 "fieldsV1": ours},
                {"manager": "kubectl-client-side-apply", "operation": "Update",
                 "time": "2026-01-01T00:00:01Z",
                 "fieldsV1": {"f:metadata": {"f:annotations": {format!("f:{LAST_APPLIED}"): {}}}}}
            ]
        },
        "subjects": [{"kind": "User", "name": "alice"}],
        "status": {"observed": 1}
    })
}

fn store(keep_status: bool) -> CompactStore {
    let s = CompactStore::new(
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        keep_status,
        None,
    );
    s.apply(child(false));
    s
}

#[test]
fn stripped_fields_are_absent_and_the_rest_is_kept() {
    let (got, _) = store(false)
        .get(Some("acme"), "idem-owners")
        .expect("cached");
    assert_eq!(got.get("status"), None, "status stripped: {got}");
    assert_eq!(
        got.pointer("/metadata/annotations"),
        Some(&json!({"keep": "me"})),
        "last-applied stripped, other annotations kept"
    );
    for entry in got["metadata"]["managedFields"]
        .as_array()
        .expect("entries")
    {
        assert_eq!(entry.get("time"), None, "{entry}");
        assert!(entry.get("fieldsV1").is_some() && entry.get("manager").is_some());
    }
    // Everything else as the server sent it, plus apiVersion and kind.
    let mut expected = child(false);
    strip(&mut expected, false);
    expected["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
    expected["kind"] = json!("RoleBinding");
    assert_eq!(got, expected);
    assert_eq!(got["subjects"], json!([{"kind": "User", "name": "alice"}]));
}

#[test]
fn a_status_reading_kind_keeps_its_status() {
    let (got, _) = store(true)
        .get(Some("acme"), "idem-owners")
        .expect("cached");
    assert_eq!(got["status"], json!({"observed": 1}));
}

#[test]
fn last_applied_owned_by_an_apply_entry_is_kept() {
    let mut obj = child(true);
    strip(&mut obj, false);
    assert!(
        obj.pointer("/metadata/annotations")
            .and_then(|a| a.get(LAST_APPLIED))
            .is_some(),
        "{obj}"
    );
}

#[test]
fn owned_by_lists_only_the_owners_children_in_the_namespace() {
    let s = store(false);
    let mut other = child(false);
    other["metadata"]["name"] = json!("other");
    other["metadata"]["labels"][OWNER_UID_LABEL] = json!("owner-2");
    s.apply(other);
    let mut elsewhere = child(false);
    elsewhere["metadata"]["namespace"] = json!("beta");
    s.apply(elsewhere);
    let names = |ns: Option<&str>| {
        let mut v: Vec<_> = s
            .owned_by(ns, Labels::operator(), "owner-1")
            .into_iter()
            .map(|m| (m.namespace.unwrap_or_default(), m.name.unwrap_or_default()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(Some("acme")), [("acme".into(), "idem-owners".into())]);
    assert_eq!(names(None).len(), 2);
    assert_eq!(s.len(), 3);
}

#[test]
fn a_relist_replaces_the_content_only_when_done() {
    let s = store(false);
    s.init();
    let mut fresh = child(false);
    fresh["metadata"]["name"] = json!("fresh");
    s.init_apply(fresh);
    assert!(
        s.get(Some("acme"), "idem-owners").is_some(),
        "old content served"
    );
    assert!(s.get(Some("acme"), "fresh").is_none());
    s.init_done();
    assert!(
        s.get(Some("acme"), "idem-owners").is_none(),
        "vanished in the relist"
    );
    assert!(s.get(Some("acme"), "fresh").is_some());
    s.delete(Some("acme"), "fresh");
    assert_eq!(s.len(), 0);
}

/// A ConfigMap of `bytes` bytes of data claiming owner `owner-1` as idem's child would: its
/// labels and controller ownerReference.
fn claiming(name: &str, uid: &str, bytes: usize) -> Value {
    json!({
        "metadata": {
            "name": name, "namespace": "acme", "uid": uid, "resourceVersion": "7",
            "labels": {OWNER_UID_LABEL: "owner-1", MANAGED_BY_LABEL: "idem-operator",
                       "other": "x".repeat(60)},
            "annotations": {"big": "y".repeat(bytes)},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Thing", "name": "n".repeat(10_000), "uid": "o0"},
                {"apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "TenantApp",
                 "name": "web", "uid": "owner-1", "controller": true}
            ],
            "managedFields": [{"manager": "idem-operator", "operation": "Apply",
                               "fieldsV1": {"f:data": {}}}]
        },
        "data": {"blob": "z".repeat(bytes)}
    })
}

fn trusting_store(trust: &Arc<Trust>) -> CompactStore {
    CompactStore::new("v1", "ConfigMap", false, Some(Arc::clone(trust)))
}

fn cm_key(name: &str) -> ObjectKey {
    ObjectKey::namespaced("ConfigMap", "acme", name)
}

#[test]
fn an_object_no_record_holds_is_kept_as_a_small_stub_whatever_it_claims() {
    let trust = Arc::new(Trust::default());
    trust.set_record(&ObjectKey::cluster("TenantApp", "web"), vec!["ours".into()]);
    let s = trusting_store(&trust);
    s.apply(claiming("forged", "theirs", 1_000_000));
    s.init();
    s.init_apply(claiming("forged", "theirs", 1_000_000));
    s.init_apply(claiming("child", "ours", 1_000));
    s.init_done();
    let (stub, is_stub) = s.get(Some("acme"), "forged").expect("listed");
    assert!(is_stub);
    assert!(stub.to_string().len() < 1_000, "{stub}");
    assert_eq!(
        stub,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "forged", "namespace": "acme", "uid": "theirs", "resourceVersion": "7",
            "labels": {OWNER_UID_LABEL: "owner-1", MANAGED_BY_LABEL: "idem-operator"},
            "ownerReferences": [{"apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "TenantApp",
                                 "name": "web", "uid": "owner-1", "controller": true}]}})
    );
    // Still listed as claiming the owner (the prune reports it, never deletes it).
    let claims = s.owned_by(Some("acme"), Labels::operator(), "owner-1");
    assert_eq!(claims.len(), 2);
    let (whole, is_stub) = s.get(Some("acme"), "child").expect("listed");
    assert!(!is_stub);
    assert_eq!(whole["data"]["blob"].as_str().map(str::len), Some(1_000));
}

#[test]
fn every_string_of_a_stub_is_capped() {
    let mut obj = claiming("forged", "theirs", 10);
    obj["metadata"]["ownerReferences"][1]["kind"] = json!("k".repeat(100_000));
    obj["metadata"]["labels"][MANAGED_BY_LABEL] = json!("m".repeat(100_000));
    let stub = stub(&obj, "v1", "ConfigMap");
    assert!(stub.to_string().len() < 2_000, "{}", stub.to_string().len());
}

#[test]
fn the_engines_own_copy_replaces_a_stub_of_that_object_not_of_another() {
    let trust = Arc::new(Trust::default());
    let s = trusting_store(&trust);
    // The watch delivered our create before its answer came back: a stub.
    s.apply(claiming("child", "ours", 100));
    assert!(s.get(Some("acme"), "child").expect("stored").1);
    // The answer: trusted, then the stub replaced.
    trust.own(&cm_key("child"), "ours");
    s.upgrade(&claiming("child", "ours", 100));
    let (got, is_stub) = s.get(Some("acme"), "child").expect("stored");
    assert!(!is_stub);
    assert_eq!(got["data"]["blob"].as_str().map(str::len), Some(100));
    // Later events of it are kept whole.
    s.apply(claiming("child", "ours", 200));
    assert!(!s.get(Some("acme"), "child").expect("stored").1);
    // Another object at another name, or a copy with another uid, upgrades nothing.
    s.apply(claiming("forged", "theirs", 100));
    s.upgrade(&claiming("forged", "other", 100));
    assert!(s.get(Some("acme"), "forged").expect("stored").1);
}

#[test]
fn without_a_trust_every_object_is_kept_whole() {
    let s = CompactStore::new("v1", "ConfigMap", false, None);
    s.apply(claiming("forged", "theirs", 100));
    assert!(!s.get(Some("acme"), "forged").expect("stored").1);
}
