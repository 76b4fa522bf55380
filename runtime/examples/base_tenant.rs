//! A complete small resource on idem: a cluster-scoped `BaseTenant` gets a namespace of its
//! name with a ResourceQuota, a LimitRange and a RoleBinding granting its owners `edit`.
//!
//! ```sh
//! cargo run -p idem-runtime --example base_tenant   # the cluster of your kubeconfig
//! # or N replicas, each reconciling its share (member Leases `base-tenant-shard-<identity>`;
//! # give each its own `--identity` and `--metrics-addr`/`--health-addr` on one host):
//! cargo run -p idem-runtime --example base_tenant -- run --shards auto
//! # or one active replica of several (Lease `base-tenant`): `-- run --leader-elect`
//! cargo run -p idem-runtime --example base_tenant -- crds   # its CRD as YAML
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
//! retention of the namespaces when the CRD is deleted (its finalizer's cleanup), the
//! tracing span, and from its [`Manager`] the command line, `/metrics`, `/healthz`, `/readyz`,
//! leader election or sharding with write fences, and graceful shutdown.
//! `runtime/tests/kit_base_tenant.rs` proves it idempotent with idem-tests' kit.

use idem_runtime::manager::{Manager, ManagerError, Reconciles};
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
#[derive(Clone)]
pub struct BaseTenants;

impl Reconciler for BaseTenants {
    type Resource = BaseTenant;
    /// Deleting a BaseTenant deletes its namespace (garbage collection); an uninstall (the
    /// CRD being deleted) deletes nothing: [`BaseTenants::cleanup`] releases the children.
    const FINALIZER: Option<&'static str> = Some("example.idem.dev/retain");
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
    /// While the CRD is being deleted (an uninstall), the namespace and what idem made in it
    /// are released, so the garbage collector deletes none of the users' data.
    async fn cleanup(
        &self,
        tenant: &BaseTenant,
        pass: &mut Pass<BaseTenant>,
    ) -> Result<Cleanup<BaseTenant>, ReconcileError> {
        retain_children::<Self>(tenant, pass).await
    }
}

/// `run` (the default; `--shards auto` or `--leader-elect` for N replicas) or `crds`.
fn main() -> Result<(), ManagerError> {
    Manager::from_args("base-tenant")
        .add(Reconciles::new(BaseTenants))
        .installing_crds()
        .run()
}

// ---- For the tests that include this file: the controller and CRD without a manager. ----

/// The controller of BaseTenants and the child kinds [`BaseTenants`] declares.
#[allow(dead_code)]
pub fn controller(client: &Client) -> Controller<BaseTenant> {
    Controller::for_reconciler::<BaseTenants>(client)
}

/// Server-side applies the BaseTenant CRD and waits until it is Established.
///
/// # Errors
/// When the apply or the wait fails.
#[allow(dead_code)]
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
