//! A Tenant's `roleBindings` and `namespaceMetadata`, kept by the operator running as its
//! ServiceAccount under the shipped RBAC and admission policies: the bindings and namespace
//! labels follow the spec (a changed ClusterRole recreates its binding, a removed label goes),
//! a ClusterRole the operator may not bind stalls the Tenant with the API server's reason (a
//! child deleted while it backs off comes back at once, not at its next retry), and a
//! tenant owner can change none of it from inside their namespaces (an edit is put back, and
//! the shipped admission policy keeps the bindings' names for the operator).

mod common;

use common::deployed::{install, kubectl, operator_kubeconfig, text};
use common::process::OperatorProcess;
use common::tenants;
use common::{TIMEOUT, eventually, why};
use idem_operator::resources::TenantSpec;
use idem_operator::resources::tenant::{NamespaceMetadata, Owner, OwnerKind, TenantRoleBinding};
use idem_operator::tenant::desired::{OWNERS, ROLE_BINDING_PREFIX};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use idem_tests::{shared, unique_name};

fn subject(kind: OwnerKind, name: &str) -> Owner {
    Owner {
        kind,
        name: name.into(),
        namespace: None,
    }
}

/// Whether `user` in `group` may `verb` `resource` in `ns` (`kubectl auth can-i`).
fn can_i(user: &str, group: Option<&str>, verb: &str, resource: &str, ns: &str) -> bool {
    let mut args = vec!["auth", "can-i", verb, resource, "-n", ns, "--as", user];
    if let Some(group) = group {
        args.extend(["--as-group", group]);
    }
    String::from_utf8_lossy(&kubectl(&args).stdout).trim() == "yes"
}

/// Waits until RoleBinding `name` binds exactly the group `auditors` (the spec's subjects).
async fn bound_to_auditors(bindings: &Api<RoleBinding>, name: &str, what: &str) {
    eventually(what, TIMEOUT, || async {
        let b = bindings.get(name).await.map_err(why)?;
        let names: Vec<String> = b
            .subjects
            .unwrap_or_default()
            .into_iter()
            .map(|s| s.name)
            .collect();
        (names == ["auditors"])
            .then_some(())
            .ok_or(format!("{names:?}"))
    })
    .await;
}

#[tokio::test]
async fn role_bindings_and_namespace_metadata_follow_the_spec_and_owners_cannot_change_them() {
    install().await;
    let client = shared().client();
    let operator = OperatorProcess::spawn_with(
        &operator_kubeconfig(),
        "idem-system",
        &unique_name("op"),
        |a| a,
    );
    let name = unique_name("access");
    let ns = format!("{name}-dev");
    let readers = format!("{ROLE_BINDING_PREFIX}readers");
    let spec = TenantSpec {
        namespaces: vec!["dev".into()],
        owners: vec![subject(OwnerKind::User, "alice")],
        role_bindings: vec![TenantRoleBinding {
            name: "readers".into(),
            cluster_role: "view".into(),
            subjects: vec![subject(OwnerKind::Group, "auditors")],
        }],
        namespace_metadata: Some(NamespaceMetadata {
            labels: [("team", "payments"), ("tier", "gold")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
            annotations: [("example.com/cost-center".to_string(), "42".to_string())].into(),
        }),
        weight: 1,
        ..TenantSpec::default()
    };
    tenants::create(&client, &name, spec).await;
    tenants::wait_ready(&client, &name).await;

    // The binding grants what `view` grants, to the group, in the tenant's namespace only.
    assert!(can_i("bob", Some("auditors"), "list", "pods", &ns));
    assert!(!can_i("bob", Some("auditors"), "create", "pods", &ns));
    assert!(!can_i("bob", None, "list", "pods", &ns));
    assert!(!can_i("bob", Some("auditors"), "list", "pods", "default"));
    let namespaces = Api::<Namespace>::all(client.clone());
    let live = namespaces.get(&ns).await.unwrap();
    assert_eq!(
        live.labels().get("team").map(String::as_str),
        Some("payments")
    );
    assert_eq!(live.labels().get("tier").map(String::as_str), Some("gold"));
    assert_eq!(
        live.annotations()
            .get("example.com/cost-center")
            .map(String::as_str),
        Some("42")
    );

    // The owner (`admin` in the namespace) cannot relabel the namespace; the binding they can
    // edit is repaired.
    let as_alice = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--as", "alice"]);
        kubectl(&all)
    };
    let out = as_alice(&["label", "namespace", &ns, "team=other", "--overwrite"]);
    assert!(
        !out.status.success(),
        "the owner relabelled: {}",
        text(&out)
    );
    assert!(text(&out).contains("forbidden"), "{}", text(&out));
    let out = as_alice(&[
        "patch",
        "rolebinding",
        &readers,
        "-n",
        &ns,
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/subjects/0/name","value":"everyone"}]"#,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), &ns);
    bound_to_auditors(
        &bindings,
        &readers,
        "the owner's edit of the binding to be repaired",
    )
    .await;

    // The owner may delete the binding, but not put their own in its place (idem would never
    // adopt it): the name is kept for the operator, which puts its own back.
    let out = as_alice(&["delete", "rolebinding", &readers, "-n", &ns]);
    assert!(out.status.success(), "{}", text(&out));
    let out = as_alice(&[
        "create",
        "rolebinding",
        &readers,
        "--clusterrole=view",
        "--user=alice",
        "-n",
        &ns,
    ]);
    assert!(
        !out.status.success(),
        "the owner took the name: {}",
        text(&out)
    );
    assert!(text(&out).contains("kept for its Tenant"), "{}", text(&out));
    bound_to_auditors(&bindings, &readers, "the operator's binding to be back").await;

    // A binding of the owner's own made with `generateName` has no name at admission: the
    // policy that keeps the names has none to judge and must let it through, not fail on it.
    let file = std::env::temp_dir().join(format!("{ns}-generated-binding.json"));
    let generated = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"generateName": "mine-", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}]});
    std::fs::write(&file, generated.to_string()).expect("writing a manifest");
    let out = as_alice(&["create", "-f", file.to_str().expect("a UTF-8 path")]);
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "the owner's binding made with generateName was refused: {}",
        text(&out)
    );

    // A label removed from the spec goes from the namespace; a binding moved to `edit` is
    // recreated (roleRef is immutable).
    let tenants_api = tenants::api(&client);
    let uid_before = bindings.get(&readers).await.unwrap().metadata.uid;
    tenants_api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "namespaceMetadata": {"labels": {"team": "payments", "tier": null}},
                "roleBindings": [{"name": "readers", "clusterRole": "edit",
                                  "subjects": [{"kind": "Group", "name": "auditors"}]}],
            }})),
        )
        .await
        .unwrap();
    tenants::wait_ready(&client, &name).await;
    let live = namespaces.get(&ns).await.unwrap();
    assert_eq!(live.labels().get("tier"), None, "{:?}", live.labels());
    assert_eq!(
        live.labels().get("team").map(String::as_str),
        Some("payments")
    );
    let binding = bindings.get(&readers).await.unwrap();
    assert_eq!(binding.role_ref.name, "edit");
    assert_ne!(
        binding.metadata.uid, uid_before,
        "recreated with the new roleRef"
    );
    assert!(can_i("bob", Some("auditors"), "create", "pods", &ns));

    // `cluster-admin` is not a ClusterRole the shipped RBAC lets the operator bind: the API
    // server refuses the binding and the Tenant stalls with its reason; `edit` stays bound.
    tenants_api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"roleBindings": [
                {"name": "readers", "clusterRole": "edit",
                 "subjects": [{"kind": "Group", "name": "auditors"}]},
                {"name": "root", "clusterRole": "cluster-admin",
                 "subjects": [{"kind": "User", "name": "mallory"}]},
            ]}})),
        )
        .await
        .unwrap();
    let stalled = tenants::wait_condition(&client, &name, "Stalled", "ReconcileFailed").await;
    let message = &tenants::condition(&stalled, "Stalled").unwrap().message;
    assert!(
        message.contains("forbidden") && message.contains("idem-rb-root"),
        "{message}"
    );
    assert!(
        bindings
            .get_opt(&format!("{ROLE_BINDING_PREFIX}root"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(!can_i("mallory", None, "delete", "namespaces", &ns));

    // The Tenant retries with waits doubling from 200 ms (Stalled after 5 failures); three
    // failures more, its next wait is 25.6 s or more. A child an admin deletes meanwhile comes
    // back at once, not at that retry: the deletion ends the wait.
    let failed = operator.reconciles("tenant").await;
    eventually("three more failed attempts", TIMEOUT, || async {
        let n = operator.reconciles("tenant").await;
        if n >= failed + 3 {
            Ok(())
        } else {
            Err(format!("{} more", n - failed))
        }
    })
    .await;
    let owners = Api::<RoleBinding>::namespaced(client.clone(), &ns);
    let before = owners.get(OWNERS).await.unwrap();
    owners.delete(OWNERS, &Default::default()).await.unwrap();
    let deleted = std::time::Instant::now();
    eventually("idem-owners made again", TIMEOUT, || async {
        match owners.get_opt(OWNERS).await.map_err(why)? {
            Some(b) if b.metadata.uid != before.metadata.uid => Ok(()),
            _ => Err("not yet".into()),
        }
    })
    .await;
    assert!(
        deleted.elapsed() < std::time::Duration::from_secs(10),
        "the deleted child waited for the backoff: {:?}",
        deleted.elapsed()
    );
    drop(operator);
}
