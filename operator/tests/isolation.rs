//! Isolation and owners' rights on the real control plane: the `idem-isolation` NetworkPolicy
//! admits exactly the namespaces the Tenant controls (by the API server's own
//! `kubernetes.io/metadata.name` label, not a forgeable label), and what a tenant owner may
//! change of what idem made (`kubectl auth can-i --as=<owner>`).

mod common;

use common::{TIMEOUT, eventually, shared_operator, tenants};
use idem_operator::resources::TENANT_LABEL;
use idem_operator::tenant::desired::{ISOLATION, LIMITS, NAMESPACE_NAME_LABEL, OWNERS, QUOTA};
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// A label selector in the query syntax the API server understands.
fn selector_string(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.clone().unwrap_or_default().join(",");
        parts.push(match req.operator.as_str() {
            "In" => format!("{} in ({values})", req.key),
            "NotIn" => format!("{} notin ({values})", req.key),
            "Exists" => req.key.clone(),
            "DoesNotExist" => format!("!{}", req.key),
            other => panic!("unknown operator {other}"),
        });
    }
    assert!(
        !parts.is_empty(),
        "an empty selector selects every namespace"
    );
    parts.join(",")
}

#[tokio::test]
async fn the_isolation_policy_admits_only_namespaces_the_tenant_controls_not_a_forged_label() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("iso");
    tenants::create(&client, &name, tenants::full_spec(&["a", "b"])).await;
    tenants::wait_ready(&client, &name).await;
    // A hand-made namespace claiming to be the tenant's.
    let intruder = unique_name("intruder");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": intruder, "labels": {TENANT_LABEL: name}}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();

    let mine = vec![format!("{name}-a"), format!("{name}-b")];
    for ns in &mine {
        let policy = Api::<NetworkPolicy>::namespaced(client.clone(), ns)
            .get(ISOLATION)
            .await
            .unwrap();
        let spec = policy.spec.unwrap();
        assert_eq!(
            spec.pod_selector,
            Some(LabelSelector::default()),
            "every pod"
        );
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        let ingress = spec.ingress.unwrap();
        assert_eq!(ingress.len(), 1);
        let from = ingress[0].from.clone().unwrap();
        assert_eq!(from.len(), 1, "{from:?}");
        assert!(from[0].pod_selector.is_none() && from[0].ip_block.is_none());
        assert!(ingress[0].ports.is_none(), "every port");
        let selector = from[0].namespace_selector.clone().unwrap();
        // Only the API server's name label, which no one can set to another value.
        let keys: Vec<&str> = selector
            .match_expressions
            .iter()
            .flatten()
            .map(|r| r.key.as_str())
            .chain(
                selector
                    .match_labels
                    .iter()
                    .flatten()
                    .map(|(k, _)| k.as_str()),
            )
            .collect();
        assert_eq!(keys, [NAMESPACE_NAME_LABEL], "{selector:?}");
        // Ask the API server which namespaces the selector selects.
        let selected: Vec<String> = Api::<Namespace>::all(client.clone())
            .list(&ListParams::default().labels(&selector_string(&selector)))
            .await
            .unwrap()
            .items
            .iter()
            .map(|n| n.name_any())
            .collect();
        assert_eq!(selected, mine, "the intruder {intruder} is not admitted");
    }
}

/// `kubectl auth can-i VERB RESOURCE/NAME -n NS --as=alice`: `true` for yes.
fn can_i(verb: &str, object: &str, namespace: &str) -> bool {
    let out = shared()
        .kubectl()
        .args(["auth", "can-i", verb, object, "-n", namespace, "--as=alice"])
        .output()
        .expect("running kubectl");
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match answer.as_str() {
        "yes" => true,
        "no" => false,
        other => panic!(
            "kubectl auth can-i {verb} {object}: {other:?} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[tokio::test]
async fn what_a_tenant_owner_can_and_cannot_change_is_what_the_readme_says() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("can");
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;
    tenants::wait_ready(&client, &name).await;
    let ns = format!("{name}-a");
    // Owners get ClusterRole `admin` in the namespace (RoleBinding idem-owners). The table of
    // the README ("What tenant owners can change"): quota and limits are read-only to them;
    // the isolation policy and the owners' RoleBinding are theirs to edit (and idem puts
    // them back on its next reconcile); the namespace itself is not theirs.
    let table = [
        ("resourcequotas", QUOTA, false),
        ("limitranges", LIMITS, false),
        ("networkpolicies.networking.k8s.io", ISOLATION, true),
        ("rolebindings.rbac.authorization.k8s.io", OWNERS, true),
    ];
    let ns2 = ns.clone();
    let answers = tokio::task::spawn_blocking(move || {
        let mut answers = Vec::new();
        for (resource, object, _) in table {
            for verb in ["get", "update", "patch", "delete"] {
                answers.push((
                    format!("{verb} {resource}/{object}"),
                    can_i(verb, &format!("{resource}/{object}"), &ns2),
                ));
            }
        }
        answers.push((
            "delete namespace".into(),
            can_i("delete", &format!("namespaces/{ns2}"), &ns2),
        ));
        answers.push((
            "update namespace".into(),
            can_i("update", &format!("namespaces/{ns2}"), &ns2),
        ));
        answers.push((
            "create tenants".into(),
            can_i("create", "tenants.tenancy.idem.dev", &ns2),
        ));
        answers
    })
    .await
    .unwrap();
    let mut expected = Vec::new();
    for (resource, object, writable) in table {
        for verb in ["get", "update", "patch", "delete"] {
            expected.push((
                format!("{verb} {resource}/{object}"),
                verb == "get" || writable,
            ));
        }
    }
    expected.push(("delete namespace".into(), false));
    expected.push(("update namespace".into(), false));
    expected.push(("create tenants".into(), false));
    assert_eq!(answers, expected);
    // And a stranger can read none of it.
    let out = shared()
        .kubectl()
        .args([
            "auth",
            "can-i",
            "get",
            &format!("resourcequotas/{QUOTA}"),
            "-n",
            &ns,
            "--as=mallory",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
}

/// The keys of tenant `tenant` the operator's queues handed to workers so far.
fn dispatches_of(metrics: &str, tenant: &str) -> u64 {
    let label = format!("tenant=\"{tenant}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("idem_tenant_dispatches_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test]
async fn a_forged_tenant_label_in_one_tenants_namespace_does_not_reconcile_another_tenant() {
    let operator = shared_operator().await;
    let client = shared().client();
    let (a, b) = (unique_name("forga"), unique_name("forgb"));
    tenants::create(&client, &a, tenants::full_spec(&["x"])).await;
    tenants::create(&client, &b, tenants::full_spec(&["x"])).await;
    tenants::wait_ready(&client, &a).await;
    tenants::wait_ready(&client, &b).await;
    let ns = format!("{a}-x");
    // The quota controller fills in b's quota status on its own time, and a quota status
    // change reconciles b: waited for, so that it does not land between the two counts.
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &format!("{b}-x"));
    eventually("b's quota status to be filled in", TIMEOUT, || async {
        let quota = quotas.get(QUOTA).await.map_err(|e| e.to_string())?;
        let spec = quota.spec.and_then(|s| s.hard);
        let status = quota.status.and_then(|s| s.hard);
        if spec.is_some() && status == spec {
            Ok(())
        } else {
            Err(format!("spec {spec:?}, status {status:?}"))
        }
    })
    .await;
    // A repair of b's own policy: once it is done, b's earlier events (its children settling
    // after Ready, its quota status) have been handled, and its dispatch count holds still.
    repaired_after_tampering(&client, &format!("{b}-x")).await;
    let before = dispatches_of(&operator.metrics().await, &b);
    assert!(before > 0, "tenant {b} was reconciled at least once");
    // What an owner of tenant a may create in a's namespace: a NetworkPolicy labelled as
    // tenant b's child, without an ownerReference; then edited a few times.
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let forged = json!({"metadata": {"name": "forged", "labels": {
        TENANT_LABEL: b, "app.kubernetes.io/managed-by": "idem-operator"}},
        "spec": {"podSelector": {}}});
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(forged).unwrap(),
        )
        .await
        .unwrap();
    for i in 0..3 {
        let p = json!({"metadata": {"labels": {"edit": i.to_string()}}});
        policies
            .patch("forged", &PatchParams::default(), &Patch::Merge(&p))
            .await
            .unwrap();
    }
    // A change to a's own policy after them, on the same watch: once it is repaired, the
    // forged object's events have been handled.
    repaired_after_tampering(&client, &ns).await;
    let after = dispatches_of(&operator.metrics().await, &b);
    assert_eq!(
        after, before,
        "tenant {b} was reconciled for a's forged object"
    );
}

/// Narrows the isolation policy in `ns` to no pod and waits until idem has repaired it.
async fn repaired_after_tampering(client: &kube::Client, ns: &str) {
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let p = json!({"spec": {"podSelector": {"matchLabels": {"nope": "x"}}}});
    policies
        .patch(ISOLATION, &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    common::eventually("the isolation policy repaired", common::TIMEOUT, || async {
        let np = policies.get(ISOLATION).await.map_err(common::why)?;
        let selector = np.spec.and_then(|s| s.pod_selector).unwrap_or_default();
        (selector == LabelSelector::default())
            .then_some(())
            .ok_or_else(|| format!("{selector:?}"))
    })
    .await;
}
