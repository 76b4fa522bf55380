//! A user of a test's own whose requests the API server counts apart from everyone else's:
//! impersonated, bound to `cluster-admin`, matched by a FlowSchema of its own, whose
//! `apiserver_flowcontrol_dispatched_requests_total{flow_schema=…}` counts exactly its
//! requests (as the idempotence kit counts its reconciles').

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Config};

/// An impersonated user with a FlowSchema of its own.
pub struct CountedUser {
    /// User name, FlowSchema name and ClusterRoleBinding name (all the same).
    pub name: String,
    config: Config,
}

impl CountedUser {
    /// Creates the user's FlowSchema (priority level `exempt`) and `cluster-admin` binding,
    /// and waits until a request made as the user is allowed and counted.
    ///
    /// # Panics
    /// When a write fails or the user's requests are not counted within 30 s.
    pub async fn create(admin: &Client, prefix: &str) -> Self {
        let name = idem_tests::unique_name(prefix);
        let schema: FlowSchema = serde_json::from_value(serde_json::json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": name},
            "spec": {
                "matchingPrecedence": 50,
                "priorityLevelConfiguration": {"name": "exempt"},
                "rules": [{
                    "subjects": [{"kind": "User", "user": {"name": name}}],
                    "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                       "namespaces": ["*"], "clusterScope": true}],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }],
            },
        }))
        .unwrap();
        let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "cluster-admin"},
            "subjects": [{"kind": "User", "name": name, "apiGroup": "rbac.authorization.k8s.io"}],
        }))
        .unwrap();
        let pp = PatchParams::apply(super::MANAGER).force();
        Api::<FlowSchema>::all(admin.clone())
            .patch(&name, &pp, &Patch::Apply(&schema))
            .await
            .expect("create the FlowSchema");
        Api::<ClusterRoleBinding>::all(admin.clone())
            .patch(&name, &pp, &Patch::Apply(&binding))
            .await
            .expect("create the ClusterRoleBinding");
        let user = Self {
            name,
            config: idem_tests::shared().config(),
        };
        let client = user.client();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let allowed = Api::<Namespace>::all(client.clone())
                .get("default")
                .await
                .is_ok();
            if allowed && user.requests().await > 0 {
                return user;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "requests as {} were not allowed and counted within 30 s",
                user.name
            );
            // Waiting for the API server to pick the new FlowSchema and binding up.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A new client acting as the user.
    pub fn client(&self) -> Client {
        let mut config = self.config.clone();
        config.auth_info.impersonate = Some(self.name.clone());
        Client::try_from(config).expect("client")
    }

    /// Requests the API server has dispatched for this user so far.
    pub async fn requests(&self) -> u64 {
        let text = idem_tests::shared().metrics().await.expect("metrics");
        let label = format!("flow_schema=\"{}\"", self.name);
        text.lines()
            .filter(|l| l.starts_with("apiserver_flowcontrol_dispatched_requests_total{"))
            .filter(|l| l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    }
}
