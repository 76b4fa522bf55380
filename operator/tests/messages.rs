//! Status messages on the real control plane say the real reason and survive any content: a
//! failure message holding multi-byte characters is cut at a character boundary (never
//! panicking), a failing tenant still counts the namespaces it has, and an app in a namespace
//! with a forged tenant label is told that no Tenant controls it. In a binary of its own,
//! because the fault it guards against panicked reconciles.

mod common;

use common::{TIMEOUT, apps, eventually, shared_operator, tenants};
use idem_operator::resources::TENANT_LABEL;
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

fn admission_api(kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    Api::all_with(
        shared().client(),
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

/// A ValidatingAdmissionPolicy (a real API server feature, standing in for any webhook or
/// policy that rejects with a long message) that denies creating ConfigMaps and
/// ResourceQuotas in namespaces labelled for `tenant`, with `message`.
async fn deny_policy(tenant: &str, message: &str) {
    let name = format!("deny-{tenant}");
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["configmaps", "resourcequotas"]}]},
            "validations": [{"expression": "false", "message": message}]}
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {TENANT_LABEL: tenant}}}}
    });
    let pp = PostParams::default();
    admission_api("ValidatingAdmissionPolicy", "validatingadmissionpolicies")
        .create(&pp, &serde_json::from_value(policy).unwrap())
        .await
        .unwrap();
    admission_api(
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    )
    .create(&pp, &serde_json::from_value(binding).unwrap())
    .await
    .unwrap();
    // The policy is in force once a probe namespace with the label rejects a ConfigMap.
    let probe = unique_name("probe");
    let namespaces: Api<Namespace> = Api::all(shared().client());
    namespaces
        .create(
            &pp,
            &serde_json::from_value(
                json!({"metadata": {"name": probe, "labels": {TENANT_LABEL: tenant}}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(shared().client(), &probe);
    eventually("the deny policy in force", TIMEOUT, || async {
        let cm = serde_json::from_value(json!({"metadata": {"generateName": "p-"}})).unwrap();
        match cms.create(&pp, &cm).await {
            Err(kube::Error::Api(s)) if s.message.contains("ValidatingAdmissionPolicy") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    namespaces
        .delete(&probe, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_failure_message_with_multi_byte_characters_is_written_and_the_namespace_count_is_true() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("utf");
    // 'é' is two bytes: cut at byte 1024, one of the two apps below (their names differ in
    // length by one) has a character straddling the cut.
    deny_policy(&name, &format!("rejected: {}", "é".repeat(700))).await;
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;

    let failed = tenants::wait_condition(&client, &name, "Stalled", "ReconcileFailed").await;
    let message = &tenants::condition(&failed, "Stalled").unwrap().message;
    assert!(message.len() <= 1024, "{} bytes", message.len());
    assert!(message.contains("rejected: éé"), "{message}");
    // The namespace exists (only its contents fail): the status counts it.
    let status = failed.status.clone().unwrap();
    assert_eq!(status.namespaces, [format!("{name}-a")]);
    assert_eq!(status.namespace_count, 1);

    let ns = format!("{name}-a");
    for app in ["x", "xy"] {
        apps::create(&client, &ns, app, apps::spec(1, "c")).await;
    }
    for app in ["x", "xy"] {
        let failed = apps::wait_condition(&client, &ns, app, "Stalled", "ReconcileFailed").await;
        let status = failed.status.unwrap();
        let message = &status
            .conditions
            .iter()
            .find(|c| c.type_ == "Stalled")
            .unwrap()
            .message;
        assert!(message.len() <= 1024, "{} bytes", message.len());
        // Cut (the server's message keeps its first and last 200 characters).
        assert!(message.contains('…'), "{message}");
        assert!(message.contains("rejected: éé"), "{message}");
    }
}

#[tokio::test]
async fn an_app_in_a_namespace_with_a_forged_tenant_label_is_told_no_tenant_controls_it() {
    shared_operator().await;
    let client = shared().client();
    let ns = unique_name("forged");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": ns, "labels": {TENANT_LABEL: "acme"}}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    apps::create(&client, &ns, "web", apps::spec(1, "c")).await;
    let app = apps::wait_condition(&client, &ns, "web", "Stalled", "NotInTenantNamespace").await;
    let conditions = app.status.unwrap().conditions;
    let message = &conditions
        .iter()
        .find(|c| c.type_ == "Stalled")
        .unwrap()
        .message;
    assert!(message.contains("no Tenant controls it"), "{message}");
    assert!(
        !message.contains("has no tenancy.idem.dev/tenant label"),
        "{message}"
    );
}

#[tokio::test]
async fn a_child_not_owned_message_quoting_a_48_kib_owner_name_is_cut_to_1024_bytes() {
    shared_operator().await;
    let client = shared().client();
    let tenant = unique_name("long");
    tenants::create(&client, &tenant, tenants::full_spec(&["a"])).await;
    tenants::wait_ready(&client, &tenant).await;
    let ns = format!("{tenant}-a");
    // The app's ConfigMap name, taken by an object whose controller is of a kind the garbage
    // collector cannot resolve (so it stays) with a 48,000-byte name: the ChildNotOwned
    // message quotes it, over the API server's 32 KiB limit for a condition message.
    let owner_name = "😀".repeat(12000);
    let body = json!({"metadata": {"name": "web-config", "ownerReferences": [{
        "apiVersion": "example.com/v1", "kind": "Widget", "name": owner_name,
        "uid": "00000000-0000-0000-0000-000000000002", "controller": true,
    }]}});
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
    apps::create(&client, &ns, "web", apps::spec(1, "c")).await;
    let app = apps::wait_condition(&client, &ns, "web", "Stalled", "ChildNotOwned").await;
    let status = app.status.unwrap();
    let message = &status
        .conditions
        .iter()
        .find(|c| c.type_ == "Stalled")
        .unwrap()
        .message;
    assert!(message.len() <= 1024, "{} bytes", message.len());
    assert!(
        message.len() > 1000,
        "cut too short: {} bytes",
        message.len()
    );
    assert!(message.ends_with('…'), "{message}");
    assert!(message.contains("ConfigMap"), "{message}");
}

/// `crds` and `rbac` piped into a reader that goes away early (`| head -1`, here one that
/// closes the pipe before reading) end quietly, without the panic of a failed print.
#[test]
fn the_crds_and_rbac_commands_end_quietly_when_their_reader_goes_away() {
    use std::process::{Command, Stdio};
    for args in [&["crds"][..], &["rbac", "-n", "ops"][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idem-operator"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the operator binary starts");
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !stderr.contains("panicked"),
            "{args:?}: {:?}, stderr: {stderr}",
            out.status
        );
    }
}
