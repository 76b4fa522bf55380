//! A complete small resource on idem: a cluster-scoped `BaseTenant` gets a namespace of its
//! name with a ResourceQuota, a LimitRange and a RoleBinding granting its owners `edit`.
//!
//! ```sh
//! cargo run -p idem-runtime --example base_tenant   # the cluster of your kubeconfig
//! # or, one active replica of several (a Lease in the kubeconfig's namespace):
//! cargo run -p idem-runtime --example base_tenant -- --leader-elect
//! kubectl apply -f - <<'YAML'
//! apiVersion: example.idem.dev/v1alpha1
//! kind: BaseTenant
//! metadata: {name: acme}
//! spec: {owners: [alice], cpu: "2", memory: 4Gi}
//! YAML
//! kubectl wait basetenant/acme --for=condition=Ready
//! ```
//!
//! It installs (server-side applies) its CRD, then reconciles until SIGTERM or Ctrl-C.
//! Everything but the resource, its desired children and the few lines of `Reconciler` and
//! `main` comes from idem-runtime: apply with the convergence check and prune, status with
//! observedGeneration and kstatus conditions, Events, `Stalled` after repeated failures, the
//! tracing span, and with `--leader-elect` leader election with a write fence. `runtime/tests/kit_base_tenant.rs` proves it idempotent with idem-tests' kit.

use idem_runtime::leader::{LeaderElection, default_identity};
use idem_runtime::prelude::*;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Api, Client, CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A tenant: one namespace with a quota, default limits and its owners as editors.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "example.idem.dev",
    version = "v1alpha1",
    kind = "BaseTenant",
    status = "BaseTenantStatus"
)]
#[idempotent(tenant = name)]
pub struct BaseTenantSpec {
    /// Users granted `edit` in the namespace.
    pub owners: Vec<String>,
    /// The namespace's CPU quota, e.g. `"2"`.
    pub cpu: String,
    /// The namespace's memory quota, e.g. `"4Gi"`.
    pub memory: String,
}

/// Status: observedGeneration, the kstatus conditions and the record of the children created.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BaseTenantStatus {
    /// The generation the conditions describe.
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling, Stalled.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The uids of the children created: only these are ever pruned.
    #[serde(default)]
    pub created_children: Vec<CreatedChild>,
}

/// The desired state: the namespace and the three objects in it.
///
/// # Errors
/// Terminal `NoOwners` when `spec.owners` is empty (a namespace nobody may use).
pub fn desired(t: &BaseTenant) -> Result<DesiredChildren, ReconcileError> {
    if t.spec.owners.is_empty() {
        let message = "spec.owners is empty: name at least one user";
        return Err(ReconcileError::terminal("NoOwners", message));
    }
    let ns = t.name_any();
    let meta = |name: &str| json!({"name": name, "namespace": ns});
    let subjects: Vec<_> = (t.spec.owners.iter())
        .map(|u| json!({"kind": "User", "name": u, "apiGroup": "rbac.authorization.k8s.io"}))
        .collect();
    let namespace: Namespace = object(json!({"metadata": {"name": ns}}))?;
    let quota: ResourceQuota = object(json!({"metadata": meta("quota"),
        "spec": {"hard": {"requests.cpu": t.spec.cpu, "requests.memory": t.spec.memory}}}))?;
    let limits: LimitRange = object(json!({"metadata": meta("limits"), "spec": {"limits": [
        {"type": "Container", "defaultRequest": {"cpu": "100m", "memory": "128Mi"}}]}}))?;
    let owners: RoleBinding = object(json!({"metadata": meta("owners"), "subjects": subjects,
        "roleRef": {"kind": "ClusterRole", "name": "edit", "apiGroup": "rbac.authorization.k8s.io"}}))?;
    let mut children = DesiredChildren::new();
    children
        .add(&namespace)?
        .add(&quota)?
        .add(&limits)?
        .add(&owners)?;
    Ok(children)
}

/// A typed object from JSON; a value that does not fit is a terminal `InvalidSpec`.
fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, ReconcileError> {
    serde_json::from_value(value)
        .map_err(|e| ReconcileError::terminal("InvalidSpec", e.to_string()))
}

// ---- The reconcile code: everything beyond the desired state. ----

/// The BaseTenant reconciler: its children are [`desired`]; ready once they are applied.
pub struct BaseTenants;

impl Reconciler for BaseTenants {
    type Resource = BaseTenant;
    /// The child kinds, declared once: the controller's watches, its caches, the prune and
    /// idem-tests' kit follow from it.
    fn children() -> ChildKinds<BaseTenant> {
        ChildKinds::new()
            .owns::<Namespace>()
            .owns::<ResourceQuota>()
            .owns::<LimitRange>()
            .owns::<RoleBinding>()
    }
    fn desired(&self, tenant: &BaseTenant) -> Result<DesiredChildren, ReconcileError> {
        desired(tenant)
    }
}

/// The controller of BaseTenants and the child kinds [`BaseTenants`] declares.
pub fn controller(client: &Client) -> Controller<BaseTenant> {
    Controller::for_reconciler::<BaseTenants>(client)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    install_crd(&client).await?;
    let shutdown = idem_runtime::http::shutdown_signal(); // SIGTERM or Ctrl-C: graceful
    if !std::env::args().any(|a| a == "--leader-elect") {
        return run(client, shutdown).await;
    }
    // Several replicas: only the holder of Lease `base-tenant` reconciles.
    let (ns, me) = (client.default_namespace().to_owned(), default_identity());
    let leader = LeaderElection::new("base-tenant", ns, me).start(client.clone())?;
    let mut shutdown = std::pin::pin!(shutdown);
    let stopped = tokio::select! {
        acquired = leader.acquired() => { acquired?; false }
        () = &mut shutdown => true, // while still a standby
    };
    if !stopped {
        // Writes refused once the lease is not valid; the controllers dropped if it is lost.
        leader
            .while_leading(run(leader.fenced(&client), shutdown))
            .await??;
    }
    leader.release().await;
    Ok(())
}

/// Runs the controller until `shutdown`, then lets in-flight reconciles finish.
async fn run(client: Client, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
    let report = Driver::new(client.clone(), BaseTenants)
        .run(controller(&client), shutdown)
        .await?;
    eprintln!("stopped: {report:?}");
    Ok(())
}

// ---- Setup: not reconcile code. ----

/// Server-side applies the BaseTenant CRD and waits until it is Established.
///
/// # Errors
/// When the apply or the wait fails.
pub async fn install_crd(client: &Client) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use kube::api::{Patch, PatchParams};
    use kube::runtime::{conditions, wait::await_condition};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = BaseTenant::crd_name();
    let apply = PatchParams::apply(BaseTenant::FIELD_MANAGER).force();
    crds.patch(name, &apply, &Patch::Apply(BaseTenant::crd()))
        .await?;
    let established = await_condition(crds, name, conditions::is_crd_established());
    tokio::time::timeout(std::time::Duration::from_secs(60), established).await??;
    Ok(())
}
