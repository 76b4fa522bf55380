use serde_json::{Value, json};

use super::*;

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
    let s = CompactStore::new("rbac.authorization.k8s.io/v1", "RoleBinding", keep_status);
    s.apply(child(false));
    s
}

#[test]
fn stripped_fields_are_absent_and_the_rest_is_kept() {
    let got = store(false)
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
    let got = store(true)
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
            .owned_by(ns, "owner-1")
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
