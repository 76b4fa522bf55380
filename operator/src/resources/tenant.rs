//! `Tenant`: a cluster-scoped resource that owns a set of namespaces with quota, limits,
//! owner RoleBindings and optional network isolation.

use std::collections::BTreeMap;

use idem_runtime::IdempotentResource;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The longest tenant name: a namespace is `<tenant>-<short name>` and must stay a DNS label
/// (at most 63 characters, RFC 1123), which leaves room for a short name of up to 32.
pub const MAX_TENANT_NAME: usize = 30;
/// The longest namespace short name (see [`MAX_TENANT_NAME`]).
pub const MAX_SHORT_NAME: usize = 32;

/// Desired state of a tenant.
///
/// ```yaml
/// apiVersion: tenancy.idem.dev/v1alpha1
/// kind: Tenant
/// metadata: {name: acme}
/// spec:
///   owners: [{kind: User, name: alice}, {kind: Group, name: acme-admins}]
///   namespaces: [dev, prod]        # → namespaces acme-dev, acme-prod
///   quota: {hard: {cpu: "4", memory: 8Gi, pods: "20"}}
///   limits: {defaultRequest: {cpu: 100m, memory: 128Mi}}
///   isolation: true
///   weight: 1
///   deletionPolicy: Retain         # or Delete: deleting the Tenant deletes its namespaces
///   roleBindings: [{name: readers, clusterRole: view, subjects: [{kind: Group, name: auditors}]}]
///   namespaceMetadata: {labels: {team: payments}, annotations: {example.com/cost-center: "42"}}
///   allowed: {storageClasses: [standard], registries: [docker.io/library, ghcr.io/acme]}
///   cordoned: false                # true: creates and updates in its namespaces are refused
/// ```
#[derive(
    CustomResource,
    IdempotentResource,
    KubeSchema,
    Clone,
    Debug,
    Default,
    PartialEq,
    Serialize,
    Deserialize,
)]
#[kube(
    group = "tenancy.idem.dev",
    version = "v1alpha1",
    kind = "Tenant",
    shortname = "tnt",
    status = "TenantStatus",
    printcolumn = r#"{"name":"Namespaces","type":"integer","jsonPath":".status.namespaceCount"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","priority":1}"#,
    printcolumn = r#"{"name":"Cordoned","type":"boolean","jsonPath":".status.cordoned"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("size(self.metadata.name) <= 30").message("a tenant name has at most 30 characters, so that <tenant>-<namespace> stays a valid namespace name"),
    validation = Rule::new("self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("a tenant name must be a DNS label (lower case letters, digits and '-'), because it prefixes namespace names"),
    validation = Rule::new("self.metadata.name != 'kube' && !self.metadata.name.startsWith('kube-')").message("a tenant name is never 'kube' nor starts with 'kube-': its namespaces <tenant>-<namespace> would have the 'kube-' prefix Kubernetes keeps for its own namespaces (kube-system, kube-public, kube-node-lease)"),
    validation = Rule::new("self.metadata.name != 'idem' || !has(self.spec.namespaces) || !('system' in self.spec.namespaces)").message("tenant 'idem' cannot have namespace 'system': idem-system is the operator's own namespace"),
)]
#[idempotent(tenant = name, field_manager = "idem-operator", conditions(Ready, Reconciling, Stalled))]
#[serde(rename_all = "camelCase")]
pub struct TenantSpec {
    /// Users, groups and service accounts that get the `admin` ClusterRole in every namespace
    /// of the tenant (RoleBinding `idem-owners`).
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub owners: Vec<Owner>,
    /// Short names of the tenant's namespaces; namespace `<short>` is created as
    /// `<tenant>-<short>`. Each is a DNS label of at most 32 characters; no duplicates.
    /// Required: a manifest that leaves it out is refused rather than read as "no namespaces"
    /// (which deletes those the Tenant has, with everything in them); `[]` says so explicitly.
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "set"))]
    pub namespaces: Vec<ShortName>,
    /// A ResourceQuota `idem-quota` in each namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<Quota>,
    /// A LimitRange `idem-limits` (container defaults) in each namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// With `true`, a NetworkPolicy `idem-isolation` in each namespace admits ingress only from
    /// the tenant's own namespaces: those it controls, selected by their
    /// `kubernetes.io/metadata.name` label (set by the API server, so it cannot be forged).
    #[serde(default)]
    pub isolation: bool,
    /// Fair-share weight of this tenant in the operator's work queue, 1 to 100 (default 1).
    #[serde(default = "default_weight")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: i32,
    /// With `true`, the operator leaves the tenant's children alone (no apply, no prune) and
    /// reports `Stalled=True` (and `Ready=False`) with reason `Paused`; deleting a paused
    /// Tenant keeps its namespaces whatever `deletionPolicy` says.
    #[serde(default)]
    pub paused: bool,
    /// What deleting the Tenant does to its namespaces: `Retain` (the default) keeps them and
    /// everything in them, only removing their ownerReferences to the Tenant; `Delete` deletes
    /// them (and so everything in them) before the Tenant goes. Whatever this says, nothing is
    /// deleted when the Tenant CRD itself is being deleted, when the Tenant is deleted with
    /// `propagationPolicy: Orphan` (`kubectl delete --cascade=orphan`) or while it is paused.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// The storage, ingress, priority and runtime classes and the image registries the
    /// tenant's workloads may use; an absent list is no restriction. Enforced by the API
    /// server (ValidatingAdmissionPolicy `idem-tenant-policy`), also while the operator is
    /// down (see [`crate::tenant::policy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed: Option<super::tenant_policy::Allowed>,
    /// With `true`, the API server refuses creates and updates in the tenant's namespaces
    /// (deletes are allowed) to everyone but Kubernetes' own components and the operator.
    #[serde(default)]
    pub cordoned: bool,
    /// More RoleBindings in every namespace of the tenant, each binding a ClusterRole to
    /// subjects (RoleBinding `idem-rb-<name>`). The operator binds only ClusterRoles it may
    /// bind (`admin`, `edit` and `view` with the shipped RBAC and admission policy): binding
    /// another is refused by the API server and the Tenant reports `Stalled` with its reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub role_bindings: Vec<TenantRoleBinding>,
    /// Labels and annotations set on every namespace of the tenant. Keys in the domains
    /// Kubernetes and idem reserve (`kubernetes.io`, `k8s.io`, `x-k8s.io`, `idem.dev` and their subdomains,
    /// e.g. `pod-security.kubernetes.io/enforce`) are refused at admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_metadata: Option<NamespaceMetadata>,
}

/// A RoleBinding the operator keeps in every namespace of the tenant.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.clusterRole != '.' && self.clusterRole != '..'").message("a ClusterRole is never named '.' or '..'"))]
pub struct TenantRoleBinding {
    /// Names the binding: RoleBinding `idem-rb-<name>` in each namespace; a DNS label of at
    /// most 32 characters, unique in the list.
    #[schemars(
        length(min = 1, max = 32),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// The ClusterRole bound in each namespace, e.g. `edit` or `view`.
    #[schemars(length(min = 1, max = 253), regex(pattern = super::schema::CLUSTER_ROLE_NAME))]
    pub cluster_role: String,
    /// Who gets the role: users, groups and service accounts, as in `owners` (1 to 64).
    #[schemars(length(min = 1, max = 64))]
    pub subjects: Vec<Owner>,
}

/// Labels and annotations of every tenant namespace.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceMetadata {
    /// Labels, e.g. `{team: payments}` (see [`super::schema::namespace_labels`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::namespace_labels")]
    pub labels: BTreeMap<String, String>,
    /// Annotations (see [`super::schema::namespace_annotations`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::namespace_annotations")]
    pub annotations: BTreeMap<String, String>,
}

/// What deleting a Tenant does to its namespaces (as a PersistentVolume's reclaim policy).
#[derive(JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeletionPolicy {
    /// Keep the namespaces and their contents; remove their ownerReferences to the Tenant
    /// (the safe default: deleting a Tenant never deletes user data unless asked to).
    #[default]
    Retain,
    /// Delete the namespaces, and so everything in them, before the Tenant is gone.
    Delete,
}

fn default_weight() -> i32 {
    1
}

/// A namespace short name: a DNS label (RFC 1123) of at most [`MAX_SHORT_NAME`] characters.
#[derive(
    JsonSchema, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct ShortName(
    #[schemars(
        length(min = 1, max = 32),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub String,
);

impl ShortName {
    /// The short name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for ShortName {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

/// Who owns a tenant: a subject of the `admin` RoleBinding.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.kind != 'ServiceAccount' || has(self.__namespace__)").message("a ServiceAccount owner needs a namespace"))]
#[x_kube(validation = Rule::new("self.kind != 'ServiceAccount' || self.name.matches(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("a ServiceAccount owner's name is a DNS subdomain (lower case letters, digits, '-' and '.')"))]
#[x_kube(validation = Rule::new("self.kind != 'Group' || !self.name.startsWith('system:') || (self.name.matches('^system:serviceaccounts:[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && !self.name.startsWith('system:serviceaccounts:kube-') && self.name != 'system:serviceaccounts:idem-system')").message("a Group (owner or subject) is never one of Kubernetes' system groups (system:authenticated, system:unauthenticated, system:masters, system:serviceaccounts, system:nodes, ...): every member would be admin of the tenant's namespaces; system:serviceaccounts:<namespace> may own a tenant, but not for a kube-* namespace or idem-system, the operator's"))]
#[x_kube(validation = Rule::new("self.kind != 'User' || !self.name.startsWith('system:') || (self.name.matches('^system:serviceaccount:[a-z0-9]([-a-z0-9]*[a-z0-9])?:[a-z0-9]([-a-z0-9.]*[a-z0-9])?$') && !self.name.startsWith('system:serviceaccount:kube-') && !self.name.startsWith('system:serviceaccount:idem-system:'))").message("a User (owner or subject) is never one of Kubernetes' system users (system:anonymous, system:kube-controller-manager, ...); a ServiceAccount's user name may own a tenant, but not for a kube-* namespace or idem-system, the operator's"))]
#[x_kube(validation = Rule::new("self.kind != 'ServiceAccount' || !has(self.__namespace__) || !(self.__namespace__.startsWith('kube-') || self.__namespace__ == 'idem-system')").message("a ServiceAccount (owner or subject) is never in a kube-* namespace or idem-system: those accounts are Kubernetes' own and the operator's, exempt from the tenant policies"))]
pub struct Owner {
    /// `User`, `Group` or `ServiceAccount` (RBAC subject kinds). Kubernetes' own subjects
    /// (a `system:` group or user other than a ServiceAccount's, an account of a `kube-*`
    /// namespace or of `idem-system`, the operator's) are refused: an `admin` binding to `system:authenticated` would make every
    /// user an owner.
    pub kind: OwnerKind,
    /// The subject's name, 1 to 253 characters without control characters; a ServiceAccount's
    /// is a DNS subdomain.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[^\x00-\x1f\x7f]+$"))]
    pub name: String,
    /// The ServiceAccount's namespace (a DNS label); required for `ServiceAccount`, ignored
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: Option<String>,
}

/// The kind of an RBAC subject.
#[derive(JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OwnerKind {
    /// A user, as authenticated by the API server.
    User,
    /// A group of users.
    Group,
    /// A ServiceAccount (needs `namespace`).
    ServiceAccount,
}

/// The ResourceQuota of each tenant namespace.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Quota {
    /// Hard limits by resource name, e.g. `{cpu: "4", memory: 8Gi, pods: "20"}`: at most 32
    /// entries; keys are standard ResourceQuota names or contain a `/`; values are quantities
    /// ≥ 0, whole numbers for object counts (see [`super::schema::quota_hard`]).
    #[serde(default)]
    #[schemars(schema_with = "super::schema::quota_hard")]
    pub hard: BTreeMap<String, Quantity>,
    /// Limits for the whole tenant, same keys and values as `hard`: the namespaces' quotas
    /// are split from it so that their sum never exceeds it, each namespace getting what it
    /// uses plus a share of the headroom, moved as usage changes (shrinking quotas before
    /// growing others). A namespace gets the smaller of the two where both name a key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::quota_hard")]
    pub tenant_hard: BTreeMap<String, Quantity>,
}

/// The LimitRange (container defaults) of each tenant namespace. As the API server checks a
/// LimitRange (`ValidateLimitRange`): a default request is at most the default limit of the
/// same resource, and equals it for resources that cannot be overcommitted (hugepages,
/// extended resources).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.defaultRequest) || !has(self.default) || self.defaultRequest.all(k, !(k in self.default) || !isQuantity(string(self.defaultRequest[k])) || !isQuantity(string(self.default[k])) || !quantity(string(self.default[k])).isLessThan(quantity(string(self.defaultRequest[k]))))").message("a defaultRequest must be at most the default of the same resource"))]
#[x_kube(validation = Rule::new("!has(self.defaultRequest) || !has(self.default) || self.defaultRequest.all(k, !(k in self.default) || !(k.startsWith('hugepages-') || (k.contains('/') && !k.contains('kubernetes.io/'))) || !isQuantity(string(self.defaultRequest[k])) || !isQuantity(string(self.default[k])) || quantity(string(self.default[k])).compareTo(quantity(string(self.defaultRequest[k]))) == 0)").message("hugepages and extended resources cannot be overcommitted: their defaultRequest must equal their default"))]
pub struct Limits {
    /// Default requests of containers that set none, e.g. `{cpu: 100m, memory: 128Mi}`: at
    /// most 16 container resources, quantities ≥ 0 (see [`super::schema::limit_map`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::limit_map")]
    pub default_request: BTreeMap<String, Quantity>,
    /// Default limits of containers that set none (as `defaultRequest`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::limit_map")]
    pub default: BTreeMap<String, Quantity>,
}

/// Observed state of a tenant.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The full names of the namespaces the tenant has, sorted.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub namespaces: Vec<String>,
    /// `namespaces.len()`, for the printer column.
    #[serde(default)]
    pub namespace_count: i32,
    /// `Ready`, `Reconciling` and `Stalled`, in `metav1.Condition` shape (kstatus).
    #[serde(default)]
    #[schemars(length(max = 8), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The children the operator created for this Tenant (kind, namespace, name, uid): the
    /// only objects it ever prunes. Status is written only by the operator, so a user cannot
    /// make it delete an object by giving it this Tenant's ownerReference and labels. Room
    /// for every child of the largest Tenant the spec's bounds admit, twice over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4096))]
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
    /// Whether the tenant's namespaces are cordoned: `spec.cordoned` as last written to their
    /// TenantPolicies (a paused tenant keeps what was enforced before).
    #[serde(default)]
    pub cordoned: bool,
    /// Per namespace (full name), its share of each `quota.tenantHard` key as the operator
    /// last split it: the split it keeps while usage leaves every namespace enough room, so
    /// an `idem-quota` edited or deleted by anyone else is put back to its share without
    /// moving another namespace's (see "A tenant-wide quota" in the README).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::quota_split")]
    pub quota_split: BTreeMap<String, BTreeMap<String, Quantity>>,
}

impl Tenant {
    /// The full name of the namespace with short name `short`: `<tenant>-<short>`.
    pub fn namespace_name(&self, short: &ShortName) -> String {
        format!(
            "{}-{}",
            self.metadata.name.as_deref().unwrap_or_default(),
            short.as_str()
        )
    }
}
