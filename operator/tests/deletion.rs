//! What deleting a Tenant does, on the real control plane: `deletionPolicy: Retain` (the
//! default) keeps the namespaces and the user's data in them, `Delete` deletes them; the
//! finalizer always completes, waits only on namespaces the Tenant controls, and orphaning
//! (`--cascade=orphan`, or an ownerReference removed by hand) keeps what it says.

mod common;
use common::users::{assert_user_data, user_data};

use common::{TIMEOUT, eventually, shared_operator, tenants, why};
use idem_operator::resources::TENANT_LABEL;
use idem_operator::resources::tenant::DeletionPolicy;
use idem_runtime::apply::OWNER_UID_LABEL;
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn deleting_a_tenant_with_the_default_policy_retains_its_namespaces_and_data() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("ret");
    // Created as a user would, without saying a deletion policy.
    let tenant: idem_operator::resources::Tenant = serde_json::from_value(json!({
        "apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": name},
        "spec": {"namespaces": ["a", "b"], "owners": [{"kind": "User", "name": "alice"}],
                 "quota": {"hard": {"pods": "5"}}, "isolation": true}
    }))
    .unwrap();
    tenants::api(&client)
        .create(&PostParams::default(), &tenant)
        .await
        .unwrap();
    let ready = tenants::wait_ready(&client, &name).await;
    assert_eq!(
        ready.spec.deletion_policy,
        DeletionPolicy::Retain,
        "the default"
    );
    let uid = ready.uid().unwrap();
    user_data(&client, &format!("{name}-a")).await;

    tenants::api(&client)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    tenants::wait_tenant_object_gone(&client, &name).await;
    for short in ["a", "b"] {
        let ns = tenants::assert_retained(&client, &format!("{name}-{short}"), &uid).await;
        let labels = ns.labels();
        assert!(!labels.contains_key(OWNER_UID_LABEL), "{labels:?}");
        // What idem made inside is kept too, no longer owned by the gone tenant, so the
        // garbage collector has nothing to delete.
        let quota = Api::<ResourceQuota>::namespaced(client.clone(), &ns.name_any())
            .get("idem-quota")
            .await
            .unwrap();
        assert!(
            quota.owner_references().iter().all(|r| r.uid != uid),
            "{:?}",
            quota.owner_references()
        );
    }
    assert_user_data(&client, &format!("{name}-a")).await;
    let note = tenants::wait_retained_note(&client, &name, &format!("{name}-a")).await;
    assert!(
        note.contains("deletionPolicy is Retain") && note.contains(&format!("{name}-a")),
        "{note}"
    );
}

#[tokio::test]
async fn deleting_a_tenant_with_policy_delete_is_not_blocked_by_a_foreign_namespace_with_its_labels()
 {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("forge");
    tenants::create(&client, &name, tenants::full_spec(&["own"])).await;
    let ready = tenants::wait_ready(&client, &name).await;
    let uid = ready.uid().unwrap();
    // Someone labels an unrelated namespace with the tenant's owner-uid and tenant labels.
    let foreign = unique_name("foreign");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": foreign,
                "labels": {OWNER_UID_LABEL: uid, TENANT_LABEL: name}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    user_data(&client, &foreign).await;

    tenants::api(&client)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    tenants::wait_tenant_object_gone(&client, &name).await;
    // Its own namespace is deleted (policy Delete), the foreign one is untouched.
    eventually("the tenant's namespace deleted", TIMEOUT, || async {
        match Api::<Namespace>::all(client.clone())
            .get_opt(&format!("{name}-own"))
            .await
            .map_err(why)?
        {
            None => Ok(()),
            Some(ns) if ns.metadata.deletion_timestamp.is_some() => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
    tenants::assert_retained(&client, &foreign, "").await;
    assert_user_data(&client, &foreign).await;
    // The Event of the namespace's deletion says why: the Tenant is deleted (not the prune's
    // "no longer desired", which would send a reader to the spec).
    // The Event is published after the pass that deleted the namespace: waited for.
    let deleted = format!("Namespace/{name}-own");
    eventually("the namespace's Deleted Event", TIMEOUT, || async {
        let notes: Vec<String> = tenants::events_about(&client, &name, "Deleted")
            .await
            .into_iter()
            .filter_map(|e| e.note)
            .filter(|n| n.contains(&deleted))
            .collect();
        let said = |n: &String| n.contains("with everything in it: its owner is being deleted");
        if !notes.is_empty() && notes.iter().all(said) {
            Ok(())
        } else {
            Err(format!("{notes:?}"))
        }
    })
    .await;
}

#[tokio::test]
async fn deleting_a_paused_tenant_keeps_its_namespaces_whatever_the_policy() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("paus");
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;
    let ready = tenants::wait_ready(&client, &name).await;
    assert_eq!(ready.spec.deletion_policy, DeletionPolicy::Delete);
    let uid = ready.uid().unwrap();
    user_data(&client, &format!("{name}-a")).await;
    tenants::pause(&client, &name).await;

    tenants::api(&client)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    tenants::wait_tenant_object_gone(&client, &name).await;
    tenants::assert_retained(&client, &format!("{name}-a"), &uid).await;
    assert_user_data(&client, &format!("{name}-a")).await;
}

#[tokio::test]
async fn deleting_a_tenant_with_cascade_orphan_keeps_its_namespaces_whatever_the_policy() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("orph");
    tenants::create(&client, &name, tenants::full_spec(&["a", "b"])).await;
    let ready = tenants::wait_ready(&client, &name).await;
    assert_eq!(ready.spec.deletion_policy, DeletionPolicy::Delete);
    let uid = ready.uid().unwrap();
    user_data(&client, &format!("{name}-a")).await;

    // `kubectl delete tenant X --cascade=orphan`.
    let out = shared()
        .kubectl()
        .args([
            "delete",
            "tenant",
            &name,
            "--cascade=orphan",
            "--wait=false",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tenants::wait_tenant_object_gone(&client, &name).await;
    for short in ["a", "b"] {
        tenants::assert_retained(&client, &format!("{name}-{short}"), &uid).await;
    }
    assert_user_data(&client, &format!("{name}-a")).await;
}

#[tokio::test]
async fn a_namespace_whose_owner_reference_was_removed_by_hand_is_kept_and_does_not_block_deletion()
{
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("hand");
    tenants::create(&client, &name, tenants::full_spec(&["keep", "drop"])).await;
    let ready = tenants::wait_ready(&client, &name).await;
    let uid = ready.uid().unwrap();
    let keep = format!("{name}-keep");
    // The admin takes the namespace away from the tenant: no ownerReference any more.
    Api::<Namespace>::all(client.clone())
        .patch(
            &keep,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": null}})),
        )
        .await
        .unwrap();
    user_data(&client, &keep).await;

    tenants::api(&client)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    tenants::wait_tenant_object_gone(&client, &name).await;
    tenants::assert_retained(&client, &keep, &uid).await;
    assert_user_data(&client, &keep).await;
    let dropped = Api::<Namespace>::all(client.clone())
        .get_opt(&format!("{name}-drop"))
        .await
        .unwrap();
    assert!(
        dropped.is_none_or(|ns| ns.metadata.deletion_timestamp.is_some()),
        "the namespace the tenant still controlled is deleted (policy Delete)"
    );
}
