//! The job `cargo xtask bench` gives its controllers: a cluster-scoped `BaseTenant` becomes
//! its namespaces, each with a ResourceQuota, a LimitRange and a RoleBinding, all written with
//! server-side apply, and a `Ready` condition with `observedGeneration` in its status.
//!
//! `bench-idem` does it on idem's runtime (derive + `Controller` + `Applier` +
//! `StatusWriter`, as the README tells a user); `bench-peer` on a plain kube-runtime 5
//! `Controller` with server-side apply patches. Both read the same [`BaseTenant`] type (one
//! CRD, the same semantics), take the same [`ControllerArgs`] and print one
//! [`RECONCILE_PREFIX`] line per reconcile on stdout, which the bench reads; so does the third,
//! `bench-cr`, the same job on controller-runtime (the Go module `controller-runtime/` beside
//! this crate's sources, its field manager [`CR_MANAGER`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::IdempotentResource;
use k8s_openapi::api::core::v1::{
    LimitRange, LimitRangeItem, LimitRangeSpec, Namespace, ResourceQuota, ResourceQuotaSpec,
};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::CustomResource;
use kube::config::{KubeConfigOptions, Kubeconfig};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Label on every BaseTenant of one bench run; each controller watches only its own run.
pub const RUN_LABEL: &str = "bench.idem.dev/run";
/// Label (idem's recommended one) naming the manager of a child; both controllers set it and
/// watch children by it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Field manager (and `managed-by` value) of `bench-idem`.
pub const IDEM_MANAGER: &str = "idem-bench";
/// Field manager (and `managed-by` value) of `bench-peer`.
pub const PEER_MANAGER: &str = "peer-bench";
/// Field manager (and `managed-by` value) of `bench-cr`, the controller-runtime peer.
pub const CR_MANAGER: &str = "cr-bench";
/// Start of the stdout line printed per reconcile: `reconcile <unix ms> <name> <tenant>`.
pub const RECONCILE_PREFIX: &str = "reconcile ";
/// Line printed once the controller's caches are synced and workers run.
pub const SYNCED_LINE: &str = "synced";
/// The quota, LimitRange and RoleBinding name in each namespace.
pub const CHILD_NAME: &str = "base";

/// Desired state of a bench tenant.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "bench.idem.dev",
    version = "v1alpha1",
    kind = "BaseTenant",
    status = "BaseTenantStatus",
    shortname = "bt"
)]
// `bench-idem` drives the Applier itself and writes no record of created children; the
// bench's fleet is its own, so the prune may trust the controller ownerReference.
#[idempotent(tenant = field(tenant), field_manager = "idem-bench", conditions(Ready, Reconciling, Stalled), prune = owner_references)]
#[serde(rename_all = "camelCase")]
pub struct BaseTenantSpec {
    /// The unit of fairness this object belongs to (several objects may share one).
    pub tenant: String,
    /// Short names; namespace `<object name>-<short>` is made for each.
    pub namespaces: Vec<String>,
    /// CPU quota of each namespace (`hard["limits.cpu"]`), a Kubernetes quantity.
    pub cpu: String,
    /// The user bound to ClusterRole `admin` in each namespace.
    pub owner: String,
}

/// Observed state of a bench tenant.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BaseTenantStatus {
    /// The generation the conditions describe.
    pub observed_generation: Option<i64>,
    /// kstatus conditions (`Ready`).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

impl BaseTenant {
    /// Whether the status says `Ready=True` for the current generation.
    pub fn is_ready(&self) -> bool {
        let Some(status) = &self.status else {
            return false;
        };
        status.observed_generation.is_some()
            && status.observed_generation == self.metadata.generation
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    }
}

/// The children one BaseTenant desires, without owner references or labels (each controller
/// adds its own): namespaces first, then a quota, a LimitRange and a RoleBinding in each.
#[derive(Clone, Debug, Default)]
pub struct Desired {
    /// One per `spec.namespaces` entry.
    pub namespaces: Vec<Namespace>,
    /// One per namespace.
    pub quotas: Vec<ResourceQuota>,
    /// One per namespace.
    pub limits: Vec<LimitRange>,
    /// One per namespace.
    pub bindings: Vec<RoleBinding>,
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        ..ObjectMeta::default()
    }
}

/// The desired children of `bt` (4 objects per namespace).
pub fn desired(bt: &BaseTenant) -> Desired {
    let name = bt.metadata.name.as_deref().unwrap_or_default();
    let mut d = Desired::default();
    for short in &bt.spec.namespaces {
        let ns = format!("{name}-{short}");
        d.namespaces.push(Namespace {
            metadata: meta(&ns, None),
            ..Namespace::default()
        });
        let ns = Some(ns.as_str());
        d.quotas.push(ResourceQuota {
            metadata: meta(CHILD_NAME, ns),
            spec: Some(ResourceQuotaSpec {
                hard: Some(BTreeMap::from([
                    ("limits.cpu".to_owned(), Quantity(bt.spec.cpu.clone())),
                    ("pods".to_owned(), Quantity("20".into())),
                ])),
                ..ResourceQuotaSpec::default()
            }),
            ..ResourceQuota::default()
        });
        d.limits.push(LimitRange {
            metadata: meta(CHILD_NAME, ns),
            spec: Some(LimitRangeSpec {
                limits: vec![LimitRangeItem {
                    type_: "Container".into(),
                    default: Some(BTreeMap::from([(
                        "cpu".to_owned(),
                        Quantity("500m".into()),
                    )])),
                    default_request: Some(BTreeMap::from([(
                        "cpu".to_owned(),
                        Quantity("100m".into()),
                    )])),
                    ..LimitRangeItem::default()
                }],
            }),
        });
        d.bindings.push(RoleBinding {
            metadata: meta(CHILD_NAME, ns),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: "admin".into(),
            },
            subjects: Some(vec![Subject {
                kind: "User".into(),
                name: bt.spec.owner.clone(),
                api_group: Some("rbac.authorization.k8s.io".into()),
                namespace: None,
            }]),
        });
    }
    d
}

/// The command line both controllers take.
#[derive(Debug, Clone, clap::Parser)]
pub struct ControllerArgs {
    /// Kubeconfig of the cluster.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Reconcile only BaseTenants labelled `bench.idem.dev/run=<run>`.
    #[arg(long)]
    pub run: String,
    /// Concurrent reconciles.
    #[arg(long, default_value_t = 16)]
    pub workers: usize,
    /// Reconcile every converged object again after this many seconds (0: never).
    #[arg(long, default_value_t = 0)]
    pub resync_secs: u64,
}

impl ControllerArgs {
    /// The resync period, `None` when disabled.
    pub fn resync(&self) -> Option<Duration> {
        (self.resync_secs > 0).then(|| Duration::from_secs(self.resync_secs))
    }

    /// A client for `--kubeconfig`.
    ///
    /// # Errors
    /// When the kubeconfig cannot be read or used.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        Ok(kube::Client::try_from(self.config().await?)?)
    }

    /// The configuration of `--kubeconfig`.
    ///
    /// # Errors
    /// When the kubeconfig cannot be read or used.
    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        let kc = Kubeconfig::read_from(&self.kubeconfig)?;
        Ok(kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?)
    }

    /// The label selector of this run's BaseTenants.
    pub fn run_selector(&self) -> String {
        format!("{RUN_LABEL}={}", self.run)
    }
}

/// Prints the per-reconcile line the bench counts (`reconcile <unix ms> <name> <tenant>`).
pub fn report_reconcile(bt: &BaseTenant) {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let line = format!(
        "{RECONCILE_PREFIX}{ms} {} {}\n",
        bt.metadata.name.as_deref().unwrap_or_default(),
        bt.spec.tenant
    );
    // One write per line, so lines of concurrent reconciles never interleave.
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}

/// Logs warnings and errors (of the controller and the libraries) to stderr; `RUST_LOG`
/// overrides the level.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

/// Prints [`SYNCED_LINE`].
pub fn report_synced() {
    let _ = writeln!(std::io::stdout().lock(), "{SYNCED_LINE}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_children_per_namespace() {
        let mut bt = BaseTenant::new(
            "t1",
            BaseTenantSpec {
                tenant: "t1".into(),
                namespaces: vec!["a".into(), "b".into(), "c".into()],
                cpu: "2".into(),
                owner: "alice".into(),
            },
        );
        bt.metadata.generation = Some(1);
        let d = desired(&bt);
        assert_eq!(d.namespaces.len(), 3);
        assert_eq!(d.namespaces[2].metadata.name.as_deref(), Some("t1-c"));
        assert_eq!(d.quotas[1].metadata.namespace.as_deref(), Some("t1-b"));
        assert_eq!((d.limits.len(), d.bindings.len()), (3, 3));
        assert!(!bt.is_ready());
    }
}
