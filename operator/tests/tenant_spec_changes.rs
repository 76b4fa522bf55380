//! Spec changes of a converged Tenant against the real control plane: shrinking or turning off
//! features updates and prunes children, a namespace removed is kept under `deletionPolicy:
//! Retain` and deleted under `Delete` (removed and re-added, it comes back), and a namespace
//! conflict clears once the other tenant lets the namespace go.

mod common;

use std::collections::BTreeMap;

use common::tenants::{self, full_spec, labelled, quantities};
use common::{TIMEOUT, eventually, shared_operator, why};
use idem_operator::tenant::desired::{OWNERS, QUOTA};
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

/// Merge-patches tenant `name`'s spec with `spec`.
async fn patch_spec(client: &kube::Client, name: &str, spec: Value) {
    tenants::api(client)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .unwrap_or_else(|e| panic!("patching tenant {name}: {e}"));
}

#[tokio::test]
async fn shrinking_the_spec_removes_fields_and_prunes_children_of_features_turned_off() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("shr");
    tenants::create(&client, &name, full_spec(&["a", "b"])).await;
    tenants::wait_ready(&client, &name).await;

    // Fewer quota keys, a different single owner, no container defaults, no isolation, no
    // extra RoleBindings, no namespace labels or annotations.
    patch_spec(
        &client,
        &name,
        json!({
            // A JSON merge patch removes map keys with `null`.
            "quota": {"hard": {"cpu": null, "memory": null, "pods": "10"}},
            "owners": [{"kind": "User", "name": "bob"}],
            "limits": null,
            "isolation": false,
            "roleBindings": [],
            "namespaceMetadata": null,
        }),
    )
    .await;
    let tenant = tenants::wait_ready(&client, &name).await;
    assert_eq!(tenant.status.as_ref().unwrap().namespace_count, 2);
    for ns in labelled::<Namespace>(&client, &name).await {
        assert_eq!(ns.labels().get("team"), None, "namespace label removed");
        assert_eq!(
            ns.annotations().get("example.com/cost-center"),
            None,
            "namespace annotation removed"
        );
    }

    let quotas: Vec<ResourceQuota> = labelled(&client, &name).await;
    assert_eq!(quotas.len(), 2);
    for q in &quotas {
        let hard = q.spec.clone().and_then(|s| s.hard).unwrap_or_default();
        assert_eq!(
            hard,
            quantities(&[("pods", "10")]),
            "{QUOTA}: dropped keys removed"
        );
    }
    let bindings: Vec<RoleBinding> = labelled(&client, &name).await;
    assert_eq!(bindings.len(), 2);
    for b in &bindings {
        let subjects: Vec<(String, String)> = b
            .subjects
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|s| (s.kind, s.name))
            .collect();
        assert_eq!(
            subjects,
            [("User".to_string(), "bob".to_string())],
            "{OWNERS}"
        );
    }
    let limits: Vec<LimitRange> = labelled(&client, &name).await;
    assert!(
        limits.is_empty(),
        "LimitRanges pruned: {:?}",
        tenants::keys(&limits)
    );
    let policies: Vec<NetworkPolicy> = labelled(&client, &name).await;
    assert!(
        policies.is_empty(),
        "NetworkPolicies pruned: {:?}",
        tenants::keys(&policies)
    );

    // No owners at all: the RoleBindings go too; the namespaces stay.
    patch_spec(&client, &name, json!({"owners": []})).await;
    tenants::wait_ready(&client, &name).await;
    let bindings: Vec<RoleBinding> = labelled(&client, &name).await;
    assert!(bindings.is_empty(), "{:?}", tenants::keys(&bindings));
    assert_eq!(labelled::<Namespace>(&client, &name).await.len(), 2);
}

/// Under `deletionPolicy: Retain` (the default), a namespace taken out of the spec is kept
/// with everything in it, as deleting the Tenant would keep it: released (no ownerReference to
/// the Tenant, no owner-uid label, out of its record), the owner's data and idem's objects in
/// it untouched, and a `Released` Event says so.
#[tokio::test]
async fn a_namespace_removed_under_retain_is_kept_with_everything_in_it() {
    use idem_operator::resources::tenant::DeletionPolicy;
    use idem_runtime::apply::OWNER_UID_LABEL;
    use k8s_openapi::api::core::v1::ConfigMap;
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("keep");
    let mut spec = full_spec(&["a", "b"]);
    spec.deletion_policy = DeletionPolicy::Retain;
    let tenant = tenants::create(&client, &name, spec).await;
    tenants::wait_ready(&client, &name).await;
    let kept = format!("{name}-b");
    let data: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "data"}, "data": {"k": "v"},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), &kept)
        .create(&Default::default(), &data)
        .await
        .expect("the owner's data");
    let before = Api::<Namespace>::all(client.clone())
        .get(&kept)
        .await
        .unwrap();

    patch_spec(&client, &name, json!({"namespaces": ["a"]})).await;
    let note = eventually("a Released Event about the namespace", TIMEOUT, || async {
        let events = tenants::events_about(&client, &name, "Released").await;
        (events.into_iter())
            .filter_map(|e| e.note)
            .find(|n| n.contains(&kept))
            .ok_or_else(|| "none yet".to_string())
    })
    .await;
    assert!(
        note.contains("no longer in spec.namespaces and deletionPolicy is Retain"),
        "{note}"
    );
    let ready = tenants::wait_ready(&client, &name).await;
    let status = ready.status.clone().unwrap();
    assert_eq!(status.namespaces, [format!("{name}-a")]);
    assert!(
        !status
            .created_children
            .iter()
            .any(|c| c.name == kept || c.namespace.as_deref() == Some(kept.as_str())),
        "out of the record: {:?}",
        status.created_children
    );
    let ns = Api::<Namespace>::all(client.clone())
        .get(&kept)
        .await
        .unwrap();
    assert_eq!(ns.uid(), before.uid(), "the same namespace");
    assert!(
        ns.metadata.deletion_timestamp.is_none(),
        "not being deleted"
    );
    let uid = tenant.uid().unwrap();
    let released = |meta: &kube::api::ObjectMeta| {
        !meta.owner_references.iter().flatten().any(|r| r.uid == uid)
            && !meta
                .labels
                .iter()
                .flatten()
                .any(|(k, _)| k == OWNER_UID_LABEL)
    };
    assert!(released(&ns.metadata), "{:?}", ns.metadata);
    let data = Api::<ConfigMap>::namespaced(client.clone(), &kept)
        .get("data")
        .await
        .expect("the owner's data is kept");
    assert_eq!(data.data.unwrap()["k"], "v");
    let quota = Api::<ResourceQuota>::namespaced(client.clone(), &kept)
        .get(QUOTA)
        .await
        .expect("idem's quota is kept");
    assert!(released(&quota.metadata), "{:?}", quota.metadata);
    let owners = Api::<RoleBinding>::namespaced(client.clone(), &kept)
        .get(OWNERS)
        .await
        .expect("the owners' RoleBinding is kept");
    assert!(released(&owners.metadata), "{:?}", owners.metadata);
}

#[tokio::test]
async fn a_namespace_removed_and_re_added_at_once_is_recreated() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("readd");
    tenants::create(&client, &name, full_spec(&["a", "b"])).await;
    tenants::wait_ready(&client, &name).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let old = namespaces.get(&format!("{name}-b")).await.unwrap();

    patch_spec(&client, &name, json!({"namespaces": ["a"]})).await;
    // Wait until the removal has started, then ask for the namespace again.
    eventually("the namespace to be terminating", TIMEOUT, || async {
        match namespaces.get_opt(&old.name_any()).await.map_err(why)? {
            Some(ns) if ns.metadata.deletion_timestamp.is_none() => Err("not yet".into()),
            _ => Ok(()),
        }
    })
    .await;
    patch_spec(&client, &name, json!({"namespaces": ["a", "b"]})).await;

    let tenant = tenants::wait_ready(&client, &name).await;
    tenants::assert_full_children(&client, &tenant, &["a", "b"]).await;
    let new = namespaces.get(&old.name_any()).await.unwrap();
    assert_ne!(
        new.uid(),
        old.uid(),
        "a new namespace, not the terminating one"
    );
}

#[tokio::test]
async fn a_namespace_conflict_clears_when_the_other_tenant_lets_the_namespace_go() {
    shared_operator().await;
    let client = shared().client();
    let first = unique_name("clr");
    let second = format!("{first}-b");
    tenants::create(&client, &first, full_spec(&["b-c", "keep"])).await;
    tenants::wait_ready(&client, &first).await;
    tenants::create(&client, &second, full_spec(&["c"])).await;
    tenants::wait_condition(&client, &second, "Stalled", "NamespaceConflict").await;

    // The first tenant gives the namespace up: it is deleted, and then the second tenant,
    // which still wants it, gets it without anyone touching the second tenant.
    patch_spec(&client, &first, json!({"namespaces": ["keep"]})).await;
    let tenant = tenants::wait_ready(&client, &second).await;
    tenants::assert_full_children(&client, &tenant, &["c"]).await;
    let owner = tenants::wait_ready(&client, &first).await;
    tenants::assert_full_children(&client, &owner, &["keep"]).await;
}

#[tokio::test]
async fn a_namespace_conflict_with_an_unmanaged_namespace_clears_when_it_is_deleted() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("hand");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let taken = format!("{name}-x");
    let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": taken}})).unwrap();
    namespaces.create(&Default::default(), &obj).await.unwrap();
    tenants::create(&client, &name, full_spec(&["x"])).await;
    let stalled = tenants::wait_condition(&client, &name, "Stalled", "NamespaceConflict").await;
    let message = &tenants::condition(&stalled, "Stalled").unwrap().message;
    assert!(message.contains(&taken), "{message}");
    let untouched = namespaces.get(&taken).await.unwrap();
    assert_eq!(
        untouched.labels().clone(),
        BTreeMap::from([("kubernetes.io/metadata.name".to_string(), taken.clone())]),
        "the unmanaged namespace is left alone"
    );

    namespaces
        .delete(&taken, &Default::default())
        .await
        .unwrap();
    let tenant = tenants::wait_ready(&client, &name).await;
    tenants::assert_full_children(&client, &tenant, &["x"]).await;
}

#[tokio::test]
async fn a_paused_tenant_leaves_its_children_alone_until_resumed() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("pause");
    tenants::create(&client, &name, full_spec(&["a"])).await;
    tenants::wait_ready(&client, &name).await;
    patch_spec(&client, &name, json!({"paused": true})).await;
    let paused = tenants::wait_condition(&client, &name, "Stalled", "Paused").await;
    assert_eq!(
        tenants::condition(&paused, "Ready").unwrap().status,
        "False"
    );

    // A hand edit while paused stays; a spec change is not applied.
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &format!("{name}-a"));
    quotas
        .patch(
            QUOTA,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"hard": {"pods": "99"}}})),
        )
        .await
        .unwrap();
    patch_spec(&client, &name, json!({"namespaces": ["a", "b"]})).await;
    // Not a sleep: this waits for the reconcile of the new generation (the condition's and the
    // status' observedGeneration must equal it), which has seen both the spec change and the
    // hand edit; it would have applied them before writing that status.
    let generation = tenants::api(&client)
        .get(&name)
        .await
        .unwrap()
        .metadata
        .generation;
    let stalled = tenants::wait_condition(&client, &name, "Stalled", "Paused").await;
    assert_eq!(stalled.metadata.generation, generation);
    let hard = quotas.get(QUOTA).await.unwrap().spec.unwrap().hard.unwrap();
    assert_eq!(hard.get("pods").map(|q| q.0.as_str()), Some("99"));
    assert_eq!(labelled::<Namespace>(&client, &name).await.len(), 1);

    patch_spec(&client, &name, json!({"paused": false})).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    tenants::assert_full_children(&client, &tenant, &["a", "b"]).await;
}
