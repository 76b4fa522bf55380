//! Tenant lifecycle against the real control plane, with one in-process operator for the whole
//! binary: convergence, repair of hand edits, namespace removal, deletion, conflicts, and
//! `kubectl wait`.

mod common;

use std::collections::BTreeMap;

use common::tenants::{self, assert_full_children, full_spec, labelled, quantities};
use common::{TIMEOUT, eventually, shared_operator, why};
use idem_operator::tenant::desired::{ISOLATION, OWNERS, QUOTA};
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn a_tenant_converges_to_ready_with_every_child_present_and_correct() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("conv");
    tenants::create(&client, &name, full_spec(&["dev", "prod"])).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    assert_full_children(&client, &tenant, &["dev", "prod"]).await;
    let ready = tenants::condition(&tenant, "Ready").unwrap();
    assert!(ready.message.contains("2 namespaces"), "{}", ready.message);
    for type_ in ["Reconciling", "Stalled"] {
        assert_eq!(tenants::condition(&tenant, type_).unwrap().status, "False");
    }
}

#[tokio::test]
async fn hand_edits_and_deletions_of_children_are_repaired() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("fix");
    tenants::create(&client, &name, full_spec(&["a", "b"])).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    let ns = format!("{name}-a");

    // A human raises the quota (an update by another field manager, as `kubectl edit` does).
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    let edit = json!({"spec": {"hard": {"cpu": "64", "pods": "1000"}}});
    quotas
        .patch(
            QUOTA,
            &PatchParams {
                field_manager: Some("kubectl-edit".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(&edit),
        )
        .await
        .unwrap();
    // ... deletes the NetworkPolicy, and empties the RoleBinding's subjects.
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let old_policy = policies.get(ISOLATION).await.unwrap();
    policies
        .delete(ISOLATION, &DeleteParams::default())
        .await
        .unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);
    bindings
        .patch(
            OWNERS,
            &PatchParams::default(),
            &Patch::Merge(&json!({"subjects": null})),
        )
        .await
        .unwrap();

    let want = quantities(&[("cpu", "4"), ("memory", "8Gi"), ("pods", "20")]);
    eventually("the children repaired", TIMEOUT, || async {
        let hard = quotas
            .get(QUOTA)
            .await
            .map_err(why)?
            .spec
            .and_then(|s| s.hard)
            .unwrap_or_default();
        if hard != want {
            return Err(format!("quota hard {hard:?}"));
        }
        let policy = policies.get_opt(ISOLATION).await.map_err(why)?;
        if policy.as_ref().and_then(|p| p.uid()) == old_policy.uid() || policy.is_none() {
            return Err("NetworkPolicy not recreated".into());
        }
        let subjects = bindings.get(OWNERS).await.map_err(why)?.subjects;
        if subjects.unwrap_or_default().len() != 2 {
            return Err("RoleBinding subjects not restored".into());
        }
        Ok(())
    })
    .await;
    let tenant = tenants::wait_ready(&client, &tenant.name_any()).await;
    assert_full_children(&client, &tenant, &["a", "b"]).await;
}

#[tokio::test]
async fn removing_a_namespace_from_the_spec_deletes_it_and_only_it() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("rm");
    // A namespace that merely looks like the tenant's: it must survive the prune.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let lookalike = format!("{name}-extra");
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": lookalike}})).unwrap(),
        )
        .await
        .unwrap();
    tenants::create(&client, &name, full_spec(&["a", "b", "c"])).await;
    tenants::wait_ready(&client, &name).await;
    let uid = |ns: &Namespace| ns.uid().unwrap();
    let before: BTreeMap<String, String> = labelled::<Namespace>(&client, &name)
        .await
        .iter()
        .map(|n| (n.name_any(), uid(n)))
        .collect();
    assert_eq!(before.len(), 3);

    tenants::api(&client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"namespaces": ["a", "c"]}})),
        )
        .await
        .unwrap();
    let removed = format!("{name}-b");
    eventually(&format!("{removed} deleted"), TIMEOUT, || async {
        match namespaces.get_opt(&removed).await.map_err(why)? {
            None => Ok(()),
            Some(ns) => Err(format!("{:?}", ns.status)),
        }
    })
    .await;
    let tenant = tenants::wait_ready(&client, &name).await;
    assert_full_children(&client, &tenant, &["a", "c"]).await;
    // The kept namespaces are the same objects (not recreated), the lookalike is untouched.
    for short in ["a", "c"] {
        let ns = namespaces.get(&format!("{name}-{short}")).await.unwrap();
        assert_eq!(Some(&uid(&ns)), before.get(&ns.name_any()), "{short} kept");
    }
    let kept = namespaces.get(&lookalike).await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_none());
}

#[tokio::test]
async fn deleting_a_tenant_deletes_its_namespaces_then_the_tenant() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("del");
    tenants::create(&client, &name, full_spec(&["x", "y"])).await;
    tenants::wait_ready(&client, &name).await;
    assert_eq!(labelled::<Namespace>(&client, &name).await.len(), 2);

    tenants::api(&client)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    tenants::wait_gone(&client, &name).await;
    // Nothing labelled for the tenant is left anywhere.
    assert!(labelled::<ResourceQuota>(&client, &name).await.is_empty());
    assert!(labelled::<NetworkPolicy>(&client, &name).await.is_empty());
    assert!(labelled::<RoleBinding>(&client, &name).await.is_empty());
}

#[tokio::test]
async fn a_namespace_conflict_stalls_the_second_tenant_and_leaves_the_first_intact() {
    shared_operator().await;
    let client = shared().client();
    // Tenant `p` with namespace `b-c` and tenant `p-b` with namespace `c` both want `p-b-c`.
    let first = unique_name("cf");
    let second = format!("{first}-b");
    tenants::create(&client, &first, full_spec(&["b-c"])).await;
    let owner = tenants::wait_ready(&client, &first).await;
    tenants::create(&client, &second, full_spec(&["c", "own"])).await;

    let stalled = tenants::wait_condition(&client, &second, "Stalled", "NamespaceConflict").await;
    let message = &tenants::condition(&stalled, "Stalled").unwrap().message;
    assert!(message.contains(&format!("{first}-b-c")), "{message}");
    assert_eq!(
        tenants::condition(&stalled, "Ready").unwrap().status,
        "False"
    );
    // The first tenant keeps its namespace and stays Ready; the second still gets its own
    // namespace, and nothing of it lands in the contested one.
    let contested: Api<Namespace> = Api::all(client.clone());
    let ns = contested.get(&format!("{first}-b-c")).await.unwrap();
    tenants::assert_owned(&ns.metadata, &owner);
    let owner = tenants::wait_ready(&client, &first).await;
    assert_full_children(&client, &owner, &["b-c"]).await;
    let theirs: Vec<Namespace> = labelled(&client, &second).await;
    assert_eq!(
        tenants::keys(&theirs),
        [format!("/{second}-own")],
        "the second tenant owns only its uncontested namespace"
    );
    let quotas: Vec<ResourceQuota> = labelled(&client, &second).await;
    assert_eq!(tenants::keys(&quotas), [format!("{second}-own/{QUOTA}")]);

    // Deleting the stalled tenant must not take the contested namespace with it.
    tenants::api(&client)
        .delete(&second, &DeleteParams::default())
        .await
        .unwrap();
    tenants::wait_gone(&client, &second).await;
    let ns = contested.get(&format!("{first}-b-c")).await.unwrap();
    assert!(
        ns.metadata.deletion_timestamp.is_none(),
        "contested ns kept"
    );
    let owner = tenants::wait_ready(&client, &first).await;
    assert_full_children(&client, &owner, &["b-c"]).await;
}

/// Runs the control plane's kubectl with `args` off the async runtime; returns whether it
/// succeeded and its combined output.
async fn kubectl(args: Vec<String>) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        let out = shared()
            .kubectl()
            .args(&args)
            .output()
            .expect("running kubectl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn kubectl_can_wait_for_a_tenant_to_be_ready() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("kw");
    tenants::create(&client, &name, full_spec(&["one"])).await;
    let (ok, out) = kubectl(vec![
        "wait".into(),
        "--for=condition=Ready".into(),
        format!("tenant/{name}"),
        format!("--timeout={}s", TIMEOUT.as_secs()),
    ])
    .await;
    assert!(ok, "kubectl wait failed: {out}");
    assert!(out.contains("condition met"), "{out}");
    // The printer columns show it too.
    let (ok, out) = kubectl(vec!["get".into(), "tnt".into(), name.clone()]).await;
    assert!(ok, "{out}");
    let row = out.lines().find(|l| l.starts_with(&name)).unwrap_or("");
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(columns.get(1..3), Some(&["1", "True"][..]), "{out}");

    // And the wait really reads the condition: a Ready tenant never becomes Stalled.
    let (ok, out) = kubectl(vec![
        "wait".into(),
        "--for=condition=Stalled".into(),
        format!("tenant/{name}"),
        "--timeout=3s".into(),
    ])
    .await;
    assert!(
        !ok,
        "a Ready tenant is not Stalled, yet kubectl wait said: {out}"
    );
}
