//! `TenantApp`: a namespaced application in a tenant namespace, realised as a ConfigMap, a
//! Deployment and a Service.

use std::collections::BTreeMap;

use idem_runtime::IdempotentResource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Desired state of an application. Its name is a DNS-1035 label (at most 63 lower case
/// letters, digits and `-`, starting with a letter): it names the Service.
///
/// ```yaml
/// apiVersion: tenancy.idem.dev/v1alpha1
/// kind: TenantApp
/// metadata: {name: web, namespace: acme-dev}
/// spec:
///   image: nginx:1.27
///   replicas: 2
///   port: 8080
///   env: {LOG_LEVEL: info}
///   config: {app.toml: "greeting = 'hi'"}
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
    kind = "TenantApp",
    namespaced,
    status = "TenantAppStatus",
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".spec.image"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.availableReplicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("oldSelf.hasValue() || (size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$'))").optional_old_self(true).message("a TenantApp name must be a DNS-1035 label (at most 63 lower case letters, digits and '-', starting with a letter), because it names the app's Service and labels its pods"),
)]
#[idempotent(
    tenant = namespace_label("tenancy.idem.dev/tenant"),
    field_manager = "idem-operator",
    conditions(Ready, Reconciling, Stalled)
)]
#[serde(rename_all = "camelCase")]
pub struct TenantAppSpec {
    /// Container image, e.g. `nginx:1.27`: a valid image reference
    /// (`[registry[:port]/]path[:tag][@digest]`, no spaces; see
    /// [`super::schema::IMAGE_REFERENCE`]).
    #[schemars(length(min = 1, max = 512), regex(pattern = super::schema::IMAGE_REFERENCE))]
    pub image: String,
    /// Desired pod replicas, 0 to 1000. Omitted, the count is left to whoever scales the
    /// Deployment (a HorizontalPodAutoscaler, `kubectl scale`): it starts at 1 and the
    /// operator never sets it, so an autoscaler and the operator do not fight over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: Option<i32>,
    /// The container port, also the Service's port, 1 to 65535 (default 8080).
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Environment variables of the container: at most 64; names are C identifiers with `-`
    /// and `.` allowed (`[-._a-zA-Z][-._a-zA-Z0-9]*`, at most 256 characters, not `.` and not
    /// starting with `..`), values at most 4096 characters.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::env")]
    pub env: BTreeMap<String, String>,
    /// Files of the ConfigMap `<app>-config`, mounted at `/etc/<app>`; a change rolls the pods
    /// (the pod template carries a hash of it). Keys are ConfigMap keys: letters, digits, `-`,
    /// `_` and `.`, at most 253 characters, not `.` and not starting with `..`; at most 64 files of at most 16000 characters each
    /// (so the ConfigMap stays under its 1 MiB limit).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::config")]
    pub config: BTreeMap<String, String>,
}

fn default_port() -> i32 {
    8080
}

/// Observed state of an application.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantAppStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Available replicas of the Deployment.
    #[serde(default)]
    pub available_replicas: i32,
    /// `Ready` (available == desired), `Reconciling` and `Stalled`, in `metav1.Condition` shape.
    #[serde(default)]
    #[schemars(length(max = 8), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The children the operator created for this TenantApp (kind, namespace, name, uid): the
    /// only objects it ever prunes. Status is written only by the operator, so a user cannot
    /// make it delete an object by giving it this TenantApp's ownerReference and labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
}
