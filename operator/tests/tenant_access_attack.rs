//! A Tenant's `roleBindings` attacked, with the operator running as its ServiceAccount under
//! the shipped RBAC and admission policies: an administrator's admission policy that refuses a
//! binding's new subjects must not make the operator delete the binding that is there (it is
//! recreated only because its `roleRef` cannot change), and the operator binds only the
//! ClusterRoles its shipped RBAC names (`admin`, `edit`, `view`), not every ClusterRole whose
//! rules it happens to hold itself.

mod common;

use std::sync::OnceLock;

use common::deployed::{install, kubectl, operator_kubeconfig, text};
use common::process::OperatorProcess;
use common::tenants;
use common::{TIMEOUT, eventually, why};
use idem_operator::resources::TenantSpec;
use idem_operator::resources::tenant::{Owner, OwnerKind, TenantRoleBinding};
use idem_operator::tenant::desired::{OWNERS, ROLE_BINDING_PREFIX};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use idem_tests::{shared, unique_name};

/// One operator for the binary's tests (several would split the tenants between them).
fn operator() -> &'static OperatorProcess {
    static OPERATOR: OnceLock<OperatorProcess> = OnceLock::new();
    OPERATOR.get_or_init(|| {
        // The process dies with the thread that started it (it is started with a parent-death
        // signal, which the kernel ties to that thread): started by whichever test asks first,
        // it was killed when that test ended. A thread of its own lives as long as the binary.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let operator = OperatorProcess::spawn_with(
                &operator_kubeconfig(),
                "idem-system",
                &unique_name("op"),
                |a| a,
            );
            let _ = tx.send(operator);
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("the operator's thread started it")
    })
}

fn user(name: &str) -> Owner {
    Owner {
        kind: OwnerKind::User,
        name: name.into(),
        namespace: None,
    }
}

/// A Tenant of one namespace, `dev`, owned by alice, with one role binding `binding` of
/// `cluster_role` to user `subject`.
fn with_binding(binding: &str, cluster_role: &str, subject: &str) -> TenantSpec {
    TenantSpec {
        namespaces: vec!["dev".into()],
        owners: vec![user("alice")],
        role_bindings: vec![TenantRoleBinding {
            name: binding.into(),
            cluster_role: cluster_role.into(),
            subjects: vec![user(subject)],
        }],
        weight: 1,
        ..TenantSpec::default()
    }
}

/// Whether `user` may `verb` `resource` in `ns` (`kubectl auth can-i`).
fn can_i(user: &str, verb: &str, resource: &str, ns: &str) -> bool {
    let out = kubectl(&["auth", "can-i", verb, resource, "-n", ns, "--as", user]);
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

/// Waits until tenant `name` has observed its current generation and is either `Ready` or
/// `Stalled`; returns which (`"Ready"` or `"Stalled"`) and the condition's message.
async fn settled(client: &kube::Client, name: &str) -> (String, String) {
    let api = tenants::api(client);
    eventually(
        &format!("tenant {name} Ready or Stalled"),
        TIMEOUT,
        || async {
            let t = api.get(name).await.map_err(why)?;
            let generation = t.metadata.generation;
            for type_ in ["Ready", "Stalled"] {
                if let Some(c) = tenants::condition(&t, type_)
                    && c.status == "True"
                    && c.observed_generation == generation
                {
                    return Ok((type_.to_string(), c.message.clone()));
                }
            }
            Err(format!("{:?}", t.status))
        },
    )
    .await
}

#[tokio::test]
async fn an_admission_policy_refusing_new_subjects_does_not_delete_the_binding_that_is_there() {
    install().await;
    let client = shared().client();
    let _ = operator();
    let name = unique_name("vap");
    let ns = format!("{name}-dev");
    let banned = unique_name("eve");
    tenants::create(
        &client,
        &name,
        TenantSpec {
            namespaces: vec!["dev".into()],
            owners: vec![user("alice")],
            weight: 1,
            ..TenantSpec::default()
        },
    )
    .await;
    tenants::wait_ready(&client, &name).await;
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), &ns);
    let before = bindings.get(OWNERS).await.unwrap().metadata.uid;
    assert!(can_i("alice", "delete", "pods", &ns));

    // An administrator's policy, only for this namespace: `banned` may not be bound. Without a
    // `reason` the API server answers a denial with 422 Invalid, as it does for an immutable
    // field.
    let policy = format!(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: {name}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}
    resourceRules:
    - apiGroups: [rbac.authorization.k8s.io]
      apiVersions: ["*"]
      operations: [CREATE, UPDATE]
      resources: [rolebindings]
  validations:
  - expression: "!has(object.subjects) || !object.subjects.exists(s, s.name == '{banned}')"
    message: "{banned} may not be bound"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: {name}}}
spec:
  policyName: {name}
  validationActions: [Deny]
"#
    );
    let file = std::env::temp_dir().join(format!("{name}-policy.yaml"));
    std::fs::write(&file, policy).unwrap();
    let out = kubectl(&["apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    // In force once a dry-run create binding `banned` is refused (as 422).
    let probe: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": banned}],
    }))
    .unwrap();
    eventually("the policy to be in force", TIMEOUT, || async {
        match bindings
            .create(
                &PostParams {
                    dry_run: true,
                    ..PostParams::default()
                },
                &probe,
            )
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 422 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // The Tenant adds the banned user to its owners: the apply is refused, the Tenant stalls,
    // and the binding the owners had stays (it is not deleted to be created again).
    tenants::api(&client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"owners": [
                {"kind": "User", "name": "alice"}, {"kind": "User", "name": banned}]}})),
        )
        .await
        .unwrap();
    let (state, message) = settled(&client, &name).await;
    assert_eq!(state, "Stalled", "{message}");
    let after = bindings.get_opt(OWNERS).await.unwrap();
    assert_eq!(
        after.and_then(|b| b.metadata.uid),
        before,
        "the owners' RoleBinding was deleted because a policy refused its new subjects: {message}"
    );
    assert!(
        can_i("alice", "delete", "pods", &ns),
        "alice lost her rights"
    );
    let out = kubectl(&["delete", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
}

#[tokio::test]
async fn only_the_cluster_roles_the_shipped_rbac_names_are_bound() {
    install().await;
    let client = shared().client();
    let _ = operator();
    let name = unique_name("bind");
    let ns = format!("{name}-dev");
    // The operator's own ClusterRole: not in its `bind` list, but every rule of it is one the
    // operator holds, so the API server's escalation check alone would let it bind it.
    tenants::create(
        &client,
        &name,
        with_binding("op", "idem-operator", "mallory"),
    )
    .await;
    let (state, message) = settled(&client, &name).await;
    let bound = Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .get_opt(&format!("{ROLE_BINDING_PREFIX}op"))
        .await
        .unwrap();
    assert!(
        bound.is_none(),
        "ClusterRole idem-operator was bound (Tenant {state}: {message}); mallory may now delete the quota: {}",
        can_i("mallory", "delete", "resourcequotas", &ns)
    );
    assert_eq!(state, "Stalled", "{message}");
}

/// An existing `roleBindings` entry changed to a ClusterRole that does not exist (a typo,
/// `viewer`). The API server answers the operator's apply with 404 NotFound for the role (its
/// RBAC escalation check cannot find it), not for the binding: not "deleted since our read",
/// so not read again and applied 5 times a pass; the Tenant stalls with the server's reason
/// (and retries with backoff: an administrator may create the role).
#[tokio::test]
async fn a_binding_changed_to_a_missing_cluster_role_stalls_with_the_servers_reason() {
    stalls_on_a_missing_cluster_role("typo", "auditors", "viewer").await;
}

/// The API server's escalation check answers 404 for the missing ClusterRole, naming the role,
/// not the binding: when the two share a name (`idem-rb-` + the binding's name), only the
/// answer's resource (`clusterroles`) tells that the binding itself was not deleted.
#[tokio::test]
async fn a_binding_named_like_the_missing_cluster_role_it_binds_stalls_with_the_servers_reason() {
    stalls_on_a_missing_cluster_role("twin", "ghost", "idem-rb-ghost").await;
}

async fn stalls_on_a_missing_cluster_role(prefix: &str, binding: &str, missing: &str) {
    install().await;
    let client = shared().client();
    let _ = operator();
    let name = unique_name(prefix);
    tenants::create(&client, &name, with_binding(binding, "view", "audrey")).await;
    tenants::wait_ready(&client, &name).await;
    tenants::api(&client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"roleBindings": [
                {"name": binding, "clusterRole": missing,
                 "subjects": [{"kind": "User", "name": "audrey"}]}]}})),
        )
        .await
        .unwrap();
    let (state, message) = settled(&client, &name).await;
    assert_eq!(state, "Stalled", "{message}");
    assert!(
        message.contains("not found") && message.contains(missing),
        "the Stalled message names the server's reason (ClusterRole {missing} not found): {message}"
    );
}

/// A binding being deleted and held by a finalizer, whose Tenant now binds a ClusterRole that
/// does not exist: the server refuses its repair in place with 404 (for the ClusterRole). As
/// with a policy's 403, it stays terminating with the server's reason: the Tenant waits for
/// its deletion (`ChildTerminating`, naming the reason), not a failing pass retried for good.
/// Once the hold is released the binding cannot be created either: `Stalled`, with the reason.
#[tokio::test]
async fn a_held_binding_whose_repair_binds_a_missing_cluster_role_waits_for_its_deletion() {
    install().await;
    let client = shared().client();
    let _ = operator();
    let name = unique_name("heldrb");
    let missing = unique_name("idem-test-missing");
    tenants::create(&client, &name, with_binding("readers", "view", "audrey")).await;
    tenants::wait_ready(&client, &name).await;
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), &format!("{name}-dev"));
    let binding = format!("{ROLE_BINDING_PREFIX}readers");
    let hold = |f: Option<&str>| json!({"metadata": {"finalizers": f.map(|f| vec![f])}});
    bindings
        .patch(
            &binding,
            &PatchParams::default(),
            &Patch::Merge(hold(Some("example.com/keep"))),
        )
        .await
        .unwrap();
    bindings
        .delete(&binding, &Default::default())
        .await
        .unwrap();
    tenants::api(&client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"roleBindings": [
                {"name": "readers", "clusterRole": missing,
                 "subjects": [{"kind": "User", "name": "audrey"}]}]}})),
        )
        .await
        .unwrap();
    let t = tenants::wait_condition(&client, &name, "Reconciling", "ChildTerminating").await;
    let message = &tenants::condition(&t, "Reconciling").unwrap().message;
    assert!(
        message.contains(&binding)
            && message.contains("not repaired meanwhile")
            && message.contains("404")
            && message.contains(&missing),
        "the wait names the binding and the server's refusal: {message}"
    );
    bindings
        .patch(&binding, &PatchParams::default(), &Patch::Merge(hold(None)))
        .await
        .unwrap();
    let (state, message) = settled(&client, &name).await;
    assert_eq!(state, "Stalled", "{message}");
    assert!(message.contains(&missing), "{message}");
}
