//! `TenantPolicy`: the per-namespace parameter object of the tenant admission policy, a copy
//! of a Tenant's `allowed` and `cordoned` that only the operator writes.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The rules the tenant admission policy enforces in one tenant namespace (the operator's
/// child `idem-tenant-policy` there, [`crate::tenant::policy::PARAMS`]).
///
/// Tenant owners get the built-in `admin` role in their namespaces; this kind is aggregated
/// into `view` only, so they may read their rules but neither change nor delete them.
#[derive(CustomResource, JsonSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "tenancy.idem.dev",
    version = "v1alpha1",
    kind = "TenantPolicy",
    namespaced,
    printcolumn = r#"{"name":"Tenant","type":"string","jsonPath":".spec.tenant"}"#,
    printcolumn = r#"{"name":"Cordoned","type":"boolean","jsonPath":".spec.cordoned"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TenantPolicySpec {
    /// The Tenant whose rules these are (named in every refusal).
    #[schemars(length(min = 1, max = 63))]
    pub tenant: String,
    /// The Tenant's `spec.cordoned`: creates and updates in the namespace are refused.
    #[serde(default)]
    pub cordoned: bool,
    /// The Tenant's `spec.allowed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Allowed>,
    /// Set while the namespace's ResourceQuota `idem-quota` enforces none of its limits (it
    /// was created again, e.g. after someone deleted it, and the quota controller has not
    /// counted it yet): creates and updates are refused as by a cordon, since quota admission
    /// limits nothing until then.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quota_not_enforced: bool,
}

/// What a tenant's workloads may use; an absent list is no restriction, an empty one allows
/// nothing. A Pod or PersistentVolumeClaim that names no class (absent or `""`) is not
/// restricted; an Ingress must name an allowed class.
#[derive(JsonSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allowed {
    /// StorageClasses a PersistentVolumeClaim may name (`spec.storageClassName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "set"))]
    pub storage_classes: Option<Vec<ClassName>>,
    /// IngressClasses an Ingress may name (`spec.ingressClassName` and the older
    /// `kubernetes.io/ingress.class` annotation); an Ingress must name one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "set"))]
    pub ingress_classes: Option<Vec<ClassName>>,
    /// PriorityClasses a Pod may name (`spec.priorityClassName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "set"))]
    pub priority_classes: Option<Vec<ClassName>>,
    /// RuntimeClasses a Pod may name (`spec.runtimeClassName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "set"))]
    pub runtime_classes: Option<Vec<ClassName>>,
    /// Registries (a host, optionally with a path) every container image of a Pod must come
    /// from, e.g. `docker.io/library`, `ghcr.io/acme`, `registry.example.com:5000`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "set"))]
    pub registries: Option<Vec<Registry>>,
}

/// The name of a cluster-scoped class object (a DNS subdomain).
#[derive(JsonSchema, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClassName(
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub String,
);

impl From<&str> for ClassName {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

/// A registry prefix: a host (`localhost`, or a name with a dot, or either with a `:port`)
/// and optionally a path of repository components, lower case, no tag or digest.
#[derive(JsonSchema, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Registry(
    #[schemars(
        length(min = 1, max = 255),
        regex(
            pattern = r"^(localhost(:[0-9]+)?|[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+(:[0-9]+)?|[a-z0-9]([-a-z0-9]*[a-z0-9])?:[0-9]+)(/[a-z0-9]+([._-]+[a-z0-9]+)*)*$"
        )
    )]
    pub String,
);

impl From<&str> for Registry {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}
