//! An administrator's admission rule for a test: a ValidatingAdmissionPolicy (and its binding)
//! that refuses the updates of one resource in one namespace for which a CEL expression is
//! false, in effect once the API server refuses a dry-run of such an update.

use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::eventually;

/// A policy and binding named alike; [`RefusingPolicy::remove`] deletes both.
pub struct RefusingPolicy {
    client: kube::Client,
    name: String,
}

/// The admission API of `kind` (`ValidatingAdmissionPolicy` or its binding).
fn api(client: &kube::Client, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

impl RefusingPolicy {
    /// Creates `name`: UPDATEs of `resource` (`group`, plural) in namespace `namespace` for
    /// which `expression` (CEL over `object` and `oldObject`) is false are refused with 403
    /// Forbidden and `message`. Returns once `probe` (a dry-run update the rule refuses) is
    /// answered 403.
    ///
    /// # Panics
    /// When the API server refuses the policy or the binding, or `probe` is not refused in
    /// [`crate::WAIT`].
    pub async fn create<T, F>(
        client: &kube::Client,
        name: &str,
        (group, resource): (&str, &str),
        namespace: &str,
        (expression, message): (&str, &str),
        probe: impl Fn() -> F,
    ) -> Self
    where
        F: Future<Output = kube::Result<T>>,
    {
        let object = |kind: &str, spec: Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                "metadata": {"name": name}, "spec": spec,
            }))
            .expect("an admission object")
        };
        let policy = object(
            "ValidatingAdmissionPolicy",
            json!({"failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["*"],
                    "operations": ["UPDATE"], "resources": [resource]}]},
                "validations": [{"expression": expression, "reason": "Forbidden",
                    "message": message}]}),
        );
        let binding = object(
            "ValidatingAdmissionPolicyBinding",
            json!({"policyName": name, "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": namespace}}}}),
        );
        api(client, "ValidatingAdmissionPolicy")
            .create(&PostParams::default(), &policy)
            .await
            .expect("the policy");
        api(client, "ValidatingAdmissionPolicyBinding")
            .create(&PostParams::default(), &binding)
            .await
            .expect("its binding");
        eventually(&format!("policy {name} in effect"), || async {
            match probe().await {
                Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
                Err(e) => Err(e.to_string()),
                Ok(_) => Err("admitted".to_owned()),
            }
        })
        .await;
        Self {
            client: client.clone(),
            name: name.to_owned(),
        }
    }

    /// Deletes the binding and the policy.
    ///
    /// # Panics
    /// When the API server refuses a deletion.
    pub async fn remove(self) {
        for kind in [
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
        ] {
            api(&self.client, kind)
                .delete(&self.name, &DeleteParams::default())
                .await
                .expect("delete the policy");
        }
    }
}
