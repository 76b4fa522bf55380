//! `cargo xtask manifests [--check]`: `deploy/operator/` — Namespace, ServiceAccount,
//! least-privilege ClusterRole, ClusterRoleBinding and the Deployment with probes.

use std::path::Path;

use serde_json::{Value, json};

use crate::generated::{self, File};

/// The directory the manifests go to, relative to the repository root.
pub const DIR: &str = "deploy/operator";
/// The namespace the operator runs in.
pub const NAMESPACE: &str = "idem-system";
/// The operator's name (ServiceAccount, ClusterRole, Deployment).
pub const NAME: &str = "idem-operator";

/// The manifests, one file per object kind, in apply order.
pub fn files() -> anyhow::Result<Vec<File>> {
    let labels = json!({"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "idem"});
    let rules = serde_json::to_value(idem_operator::rbac::policy_rules())?;
    let image = format!("{NAME}:{}", env!("CARGO_PKG_VERSION"));
    let objects: Vec<(&str, Value)> = vec![
        (
            "00-namespace",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}}),
        ),
        (
            "01-serviceaccount",
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels}}),
        ),
        (
            "02-clusterrole",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": NAME, "labels": labels}, "rules": rules}),
        ),
        (
            "03-clusterrolebinding",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}),
        ),
        (
            "04-deployment",
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": NAME,
                        "terminationGracePeriodSeconds": 30,
                        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "operator",
                            "image": image,
                            "args": ["run", "--leader-elect", "--metrics-addr=0.0.0.0:8080", "--health-addr=0.0.0.0:8081"],
                            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
                            "ports": [{"name": "metrics", "containerPort": 8080}, {"name": "health", "containerPort": 8081}],
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 10},
                            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "health"}, "periodSeconds": 5},
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                            "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                                "capabilities": {"drop": ["ALL"]}},
                        }],
                    },
                },
            }}),
        ),
    ];
    objects
        .into_iter()
        .map(|(name, obj)| generated::yaml_file(&format!("{DIR}/{name}.yaml"), "manifests", &[obj]))
        .collect()
}

/// Writes the manifests, or checks them.
pub fn run(root: &Path, check: bool) -> anyhow::Result<()> {
    generated::write_or_check(root, DIR, &files()?, check, "manifests")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_crds_and_manifests_are_current() {
        let root = generated::repo_root();
        crate::crds::run(&root, true).unwrap();
        run(&root, true).unwrap();
    }

    #[test]
    fn the_check_fails_on_a_stale_file() {
        let root = tempfile::tempdir().unwrap();
        run(root.path(), false).unwrap();
        run(root.path(), true).unwrap();
        let file = root.path().join(DIR).join("02-clusterrole.yaml");
        std::fs::write(&file, "# edited by hand\n").unwrap();
        let err = run(root.path(), true).unwrap_err().to_string();
        assert!(err.contains("02-clusterrole.yaml"), "{err}");
    }
}
