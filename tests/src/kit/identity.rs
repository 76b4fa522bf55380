//! A user of the kit's own for the reconciles under test, so that the API server counts their
//! requests apart from everyone else's: an impersonated user bound to `cluster-admin`, matched
//! by a FlowSchema of its own (API Priority and Fairness), whose
//! `apiserver_flowcontrol_dispatched_requests_total{flow_schema=…}` counts exactly its requests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::client::ClientBuilder;

use super::Error;
use super::probe::{Probe, ProbeLayer};
use crate::ControlPlane;
use crate::faults::Faults;

/// kube's default client stack (`kube::client::GenericService`, not exported by kube).
type KubeStack = ClientBuilder<
    tower::util::BoxService<
        http::Request<kube::client::Body>,
        http::Response<Box<kube::client::DynBody>>,
        tower::BoxError,
    >,
>;

/// Field manager of the kit's own set-up writes.
const MANAGER: &str = "idem-test-kit";
/// How long the API server may take to start matching a new FlowSchema and RoleBinding.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The impersonated user of one kit run, with its FlowSchema and ClusterRoleBinding.
pub(crate) struct Identity {
    /// User name, FlowSchema name and ClusterRoleBinding name (all the same).
    pub(crate) user: String,
    base: kube::Config,
    admin: Client,
}

impl Identity {
    /// Creates the user's FlowSchema (priority level `exempt`, so that the kit's requests are
    /// never queued) and `cluster-admin` binding, and waits until a request made as the user
    /// is both allowed and counted under its FlowSchema.
    ///
    /// # Errors
    /// [`Error::Setup`] when a write fails or the API server
    /// does not count the user's requests within 30 s.
    pub(crate) async fn create(cp: &ControlPlane, admin: &Client) -> Result<Self, Error> {
        let base = cp.config();
        let user = crate::unique_name("idem-kit");
        let schema: FlowSchema = serde_json::from_value(serde_json::json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": user},
            "spec": {
                "matchingPrecedence": 50,
                "priorityLevelConfiguration": {"name": "exempt"},
                "rules": [{
                    "subjects": [{"kind": "User", "user": {"name": user}}],
                    "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                       "namespaces": ["*"], "clusterScope": true}],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }],
            },
        }))
        .map_err(|e| Error::Setup(e.to_string()))?;
        let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "cluster-admin"},
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        }))
        .map_err(|e| Error::Setup(e.to_string()))?;
        let pp = PatchParams::apply(MANAGER).force();
        Api::<FlowSchema>::all(admin.clone())
            .patch(&user, &pp, &Patch::Apply(&schema))
            .await
            .map_err(|e| Error::Setup(format!("creating FlowSchema {user}: {e}")))?;
        Api::<ClusterRoleBinding>::all(admin.clone())
            .patch(&user, &pp, &Patch::Apply(&binding))
            .await
            .map_err(|e| Error::Setup(format!("creating ClusterRoleBinding {user}: {e}")))?;
        let identity = Self {
            user,
            base,
            admin: admin.clone(),
        };
        identity.wait_counted(cp).await?;
        Ok(identity)
    }

    async fn wait_counted(&self, cp: &ControlPlane) -> Result<(), Error> {
        let client = self.client(Probe::new())?;
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < READY_TIMEOUT {
            match Api::<Namespace>::all(client.clone()).get("default").await {
                Ok(_) if self.server_count(cp).await? > 0 => return Ok(()),
                Ok(_) => last = "not yet counted under its FlowSchema".into(),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(Error::Setup(format!(
            "requests as {} were not allowed and counted within {} s: {last}",
            self.user,
            READY_TIMEOUT.as_secs()
        )))
    }

    /// A new client acting as the kit's user, with `probe` in front of kube's stack (kube's
    /// default retry of 429/503/504 included, as a user's client has it).
    ///
    /// # Errors
    /// [`Error::Setup`] when kube cannot build the client.
    pub(crate) fn client(&self, probe: Arc<Probe>) -> Result<Client, Error> {
        Ok(self.builder()?.with_layer(&ProbeLayer(probe)).build())
    }

    /// [`Identity::client`] with `faults` injected between the probe and kube's stack (the
    /// probe sees every request the reconcile makes, the faulted ones included).
    ///
    /// # Errors
    /// [`Error::Setup`] when kube cannot build the client.
    pub(crate) fn faulty_client(
        &self,
        probe: Arc<Probe>,
        faults: &Faults,
    ) -> Result<Client, Error> {
        Ok(self
            .builder()?
            .with_layer(&faults.layer())
            .with_layer(&ProbeLayer(probe))
            .build())
    }

    /// kube's default stack for the kit's user (kube's retry of 429/503/504 included).
    fn builder(&self) -> Result<KubeStack, Error> {
        let mut config = self.base.clone();
        config.auth_info.impersonate = Some(self.user.clone());
        ClientBuilder::try_from(config).map_err(|e| Error::Setup(format!("client: {e}")))
    }

    /// Requests the API server has carried out for this user so far
    /// (`apiserver_flowcontrol_dispatched_requests_total` of its FlowSchema).
    ///
    /// # Errors
    /// [`Error::Setup`] when `/metrics` cannot be read.
    pub(crate) async fn server_count(&self, cp: &ControlPlane) -> Result<u64, Error> {
        let text = cp
            .metrics()
            .await
            .map_err(|e| Error::Setup(format!("reading /metrics: {e}")))?;
        Ok(dispatched(&text, &self.user))
    }

    /// Deletes the FlowSchema and the binding (best effort).
    pub(crate) async fn remove(&self) {
        let dp = DeleteParams::default();
        let _ = Api::<FlowSchema>::all(self.admin.clone())
            .delete(&self.user, &dp)
            .await;
        let _ = Api::<ClusterRoleBinding>::all(self.admin.clone())
            .delete(&self.user, &dp)
            .await;
    }
}

/// Sum of `apiserver_flowcontrol_dispatched_requests_total` samples of one FlowSchema.
fn dispatched(metrics_text: &str, flow_schema: &str) -> u64 {
    let label = format!("flow_schema=\"{flow_schema}\"");
    metrics_text
        .lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_dispatched_requests_total{"))
        .filter(|l| l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn dispatched_sums_one_flow_schema() {
        let text = "\
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"exempt\",priority_level=\"exempt\"} 629
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"kit-1\",priority_level=\"exempt\"} 2
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"kit-10\",priority_level=\"exempt\"} 7
";
        assert_eq!(super::dispatched(text, "kit-1"), 2);
        assert_eq!(super::dispatched(text, "kit-2"), 0);
    }
}
