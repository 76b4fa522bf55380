//! Unit tests of ownership stamping and desired-children bookkeeping.

use super::*;
use crate::labels::{FINGERPRINT_ANNOTATION, OWNER_UID_LABEL, SHARD_BUCKET_LABEL, TENANT_LABEL};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::ClusterRole;

fn stored_cm(ns: Option<&str>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("owner".into()),
            namespace: ns.map(Into::into),
            uid: Some("uid-1".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

fn cm(name: &str, ns: Option<&str>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: ns.map(Into::into),
            resource_version: Some("42".into()),
            uid: Some("child-uid".into()),
            ..ObjectMeta::default()
        },
        data: Some([("k".to_string(), "v".to_string())].into()),
        ..ConfigMap::default()
    }
}

#[test]
fn owner_needs_a_stored_object() {
    let fresh = ConfigMap::default();
    assert!(matches!(
        Owner::labelled(&fresh, "m", None, Labels::operator()),
        Err(ApplyError::OwnerNotStored { .. })
    ));
}

#[test]
fn stamping_adds_ownership_and_strips_server_fields() {
    let owner = Owner::labelled(
        &stored_cm(Some("ns")),
        "idem-operator",
        Some(TenantKey::new("acme")),
        Labels::operator(),
    )
    .expect("owner");
    let mut d = DesiredChildren::new();
    d.add(&cm("child", None)).expect("add");
    let (key, body) = d.children()[0].stamped(&owner).expect("stamp");
    assert_eq!(key, ObjectKey::namespaced("ConfigMap", "ns", "child"));
    let meta = &body["metadata"];
    assert_eq!(meta["namespace"], "ns");
    assert_eq!(meta["labels"][MANAGED_BY_LABEL], "idem-operator");
    assert_eq!(meta["labels"][TENANT_LABEL], "acme");
    assert_eq!(meta["labels"][OWNER_UID_LABEL], "uid-1");
    let bucket = crate::shard::fnv1a64(b"uid-1") >> 56;
    assert_eq!(meta["labels"][SHARD_BUCKET_LABEL], bucket.to_string());
    assert_eq!(meta["ownerReferences"][0]["uid"], "uid-1");
    assert_eq!(meta["ownerReferences"][0]["controller"], true);
    assert!(meta.get("resourceVersion").is_none() && meta.get("uid").is_none());
    assert_eq!(body["apiVersion"], "v1");
    assert_eq!(body["kind"], "ConfigMap");
    let print = meta["annotations"][FINGERPRINT_ANNOTATION]
        .as_str()
        .expect("fingerprint");
    assert_eq!(print.len(), 16);

    // The fingerprint follows the desired content.
    let mut other = cm("child", None);
    other.data = Some([("k".to_string(), "changed".to_string())].into());
    let mut d2 = DesiredChildren::new();
    d2.add(&other).expect("add");
    let (_, body2) = d2.children()[0].stamped(&owner).expect("stamp");
    assert_ne!(
        body2["metadata"]["annotations"][FINGERPRINT_ANNOTATION],
        print
    );
}

#[test]
fn scope_rules_of_owner_references() {
    let namespaced =
        Owner::labelled(&stored_cm(Some("ns")), "m", None, Labels::operator()).expect("owner");
    let cluster = Owner::labelled(
        &Namespace {
            metadata: ObjectMeta {
                name: Some("acme".into()),
                uid: Some("u".into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        },
        "m",
        None,
        Labels::operator(),
    )
    .expect("owner");
    let stamp = |owner: &Owner, d: &mut DesiredChildren| d.children()[0].stamped(owner).map(|_| ());
    let mut other_ns = DesiredChildren::new();
    other_ns.add(&cm("c", Some("elsewhere"))).expect("add");
    assert!(matches!(
        stamp(&namespaced, &mut other_ns),
        Err(ApplyError::InvalidScope { .. })
    ));
    let mut cluster_child = DesiredChildren::new();
    cluster_child
        .add(&ClusterRole {
            metadata: ObjectMeta {
                name: Some("r".into()),
                ..ObjectMeta::default()
            },
            ..ClusterRole::default()
        })
        .expect("add");
    assert!(matches!(
        stamp(&namespaced, &mut cluster_child),
        Err(ApplyError::InvalidScope { .. })
    ));
    assert!(stamp(&cluster, &mut cluster_child).is_ok());
    let mut no_ns = DesiredChildren::new();
    no_ns.add(&cm("c", None)).expect("add");
    assert!(matches!(
        stamp(&cluster, &mut no_ns),
        Err(ApplyError::InvalidScope { .. })
    ));
    let mut with_ns = DesiredChildren::new();
    with_ns.add(&cm("c", Some("acme-dev"))).expect("add");
    assert!(
        stamp(&cluster, &mut with_ns).is_ok(),
        "cluster owner, namespaced child: allowed"
    );
    // A cluster-scoped child given a namespace would be sent to a namespaced path that does
    // not exist (a 404 at every pass): refused; an empty namespace is none.
    let role = |namespace: &str| ClusterRole {
        metadata: ObjectMeta {
            name: Some("r".into()),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        ..ClusterRole::default()
    };
    let mut misplaced = DesiredChildren::new();
    misplaced.add(&role("acme-dev")).expect("add");
    assert!(matches!(
        stamp(&cluster, &mut misplaced),
        Err(ApplyError::InvalidScope { .. })
    ));
    let mut empty = DesiredChildren::new();
    empty.add(&role("")).expect("add");
    let key = empty.children()[0].placed(&cluster).expect("placed");
    assert_eq!(key.namespace, None);
    let mut empty_ns = DesiredChildren::new();
    empty_ns.add(&cm("c", Some(""))).expect("add");
    let key = empty_ns.children()[0].placed(&namespaced).expect("placed");
    assert_eq!(
        key.namespace.as_deref(),
        Some("ns"),
        "in its owner's namespace"
    );
}

#[test]
fn a_child_without_a_name_is_an_error() {
    let mut d = DesiredChildren::new();
    assert!(matches!(
        d.add(&ConfigMap::default()),
        Err(ApplyError::MissingName { .. })
    ));
    assert!(d.is_empty());
}

#[test]
fn ownership_is_by_controller_reference_uid() {
    let owner =
        Owner::labelled(&stored_cm(Some("ns")), "m", None, Labels::operator()).expect("owner");
    let mut meta = ObjectMeta::default();
    assert!(!owner.owns(&meta));
    let mut r = owner.owner_reference();
    r.controller = Some(false);
    meta.owner_references = Some(vec![r.clone()]);
    assert!(
        !owner.owns(&meta),
        "a non-controller reference is not ownership"
    );
    r.controller = Some(true);
    r.uid = "someone-else".into();
    meta.owner_references = Some(vec![r]);
    assert!(!owner.owns(&meta));
    assert!(owner.describe_foreign(&meta).contains("someone-else"));
    meta.owner_references = Some(vec![owner.owner_reference()]);
    assert!(owner.owns(&meta));
}

#[test]
fn kinds_are_registered_once() {
    let mut d = DesiredChildren::new();
    d.add(&cm("a", None)).expect("add");
    d.add(&cm("b", None)).expect("add");
    d.prune_kind::<ConfigMap>();
    assert_eq!(d.kinds.len(), 1);
    assert_eq!(d.len(), 2);
}

#[test]
fn a_secrets_string_data_is_folded_into_its_data() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("creds".into()),
            ..ObjectMeta::default()
        },
        data: Some(
            [
                ("kept".to_owned(), ByteString(b"old".to_vec())),
                ("both".to_owned(), ByteString(b"from data".to_vec())),
            ]
            .into(),
        ),
        string_data: Some(
            [
                ("both".to_owned(), "from stringData".to_owned()),
                ("password".to_owned(), "s3cret".to_owned()),
            ]
            .into(),
        ),
        ..Secret::default()
    };
    let mut desired = DesiredChildren::new();
    desired.add(&secret).unwrap();
    let body = &desired.children()[0].body;
    assert!(body.get("stringData").is_none(), "{body}");
    // The server's rule: stringData wins over a data key of the same name.
    assert_eq!(
        body["data"],
        serde_json::json!({"kept": "b2xk", "both": "ZnJvbSBzdHJpbmdEYXRh", "password": "czNjcmV0"})
    );
    // Without stringData (or with an empty one), the body is as given.
    let plain = Secret {
        string_data: Some(Default::default()),
        ..secret.clone()
    };
    let mut desired = DesiredChildren::new();
    desired.add(&plain).unwrap();
    let body = &desired.children()[0].body;
    assert!(body.get("stringData").is_none());
    assert_eq!(
        body["data"],
        serde_json::json!({"kept": "b2xk", "both": "ZnJvbSBkYXRh"})
    );
    // Another kind's stringData is its own field.
    let mut desired = DesiredChildren::new();
    let mut cm = cm("c", Some("ns"));
    cm.binary_data = None;
    desired.add(&cm).unwrap();
    assert!(desired.children()[0].body.get("data").is_some());
}

#[test]
fn two_kinds_of_one_name_in_different_groups_are_refused() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;
    let mut d = DesiredChildren::new();
    d.prune_kind::<CoreEvent>();
    assert!(d.same_kind_names().is_ok());
    d.prune_kind::<CoreEvent>().prune_kind::<ConfigMap>();
    assert!(d.same_kind_names().is_ok(), "one kind twice is one kind");
    d.prune_kind::<Event>();
    let err = d.same_kind_names().unwrap_err();
    assert!(
        matches!(&err, ApplyError::SameKindName { kind, first, second }
            if kind == "Event" && first == "v1" && second == "events.k8s.io/v1"),
        "{err:?}"
    );
    assert!(err.to_string().contains("two kinds named Event"), "{err}");
    // The same check over a pass's declared kinds (a plain list of them).
    let (core, events, cm) = (
        ApiResource::erase::<CoreEvent>(&()),
        ApiResource::erase::<Event>(&()),
        ApiResource::erase::<ConfigMap>(&()),
    );
    assert!(distinct_kind_names([&core, &cm].into_iter()).is_ok());
    assert!(matches!(
        distinct_kind_names([&core, &cm, &events].into_iter()),
        Err(ApplyError::SameKindName { .. })
    ));
}
