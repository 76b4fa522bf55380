//! The traits `#[derive(IdempotentResource)]` implements: spec comparison, status access, tenant.

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::apply::CreatedChild;
use crate::compare::Fingerprint;
use crate::key::TenantKey;

/// Errors while finding the tenant of an object.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    /// The object has no `metadata.name` (rule `tenant = name`).
    #[error("object has no metadata.name, so it has no tenant")]
    MissingName,
    /// The object has no `metadata.namespace` (rules `namespace` and `namespace_label`).
    #[error("object has no metadata.namespace, so it has no tenant")]
    MissingNamespace,
    /// The object's namespace does not carry the tenant label.
    #[error("namespace {namespace:?} has no label {label:?} naming its tenant")]
    MissingLabel {
        /// The namespace that was looked at.
        namespace: String,
        /// The label that was expected on it.
        label: &'static str,
    },
    /// The object's namespace carries the tenant label but may not name a tenant: the
    /// controller does not trust it, or its controller ownerReference is not the tenant
    /// object's (see `Controller::namespace_tenants_with` and
    /// `Controller::namespace_tenant_owner`).
    #[error(
        "namespace {namespace:?} is labelled {label:?} but may not name a tenant (not trusted, or its controller ownerReference is not the tenant's)"
    )]
    Untrusted {
        /// The namespace that was looked at.
        namespace: String,
        /// The label it carries.
        label: &'static str,
    },
    /// The spec field named by `tenant = field(...)` is empty or unset.
    #[error("spec field {field:?} that names the tenant is empty")]
    EmptyField {
        /// The field path as written in the attribute.
        field: &'static str,
    },
    /// Reading the namespace from the API server failed.
    #[error("reading namespace {namespace:?}: {source}")]
    Api {
        /// The namespace that was read.
        namespace: String,
        /// The client error.
        #[source]
        source: Box<kube::Error>,
    },
}

/// How a resource kind finds its tenant; chosen with `#[idempotent(tenant = ...)]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TenantRule {
    /// `tenant = name`: the object's own `metadata.name` (a cluster-scoped root like `Tenant`).
    Name,
    /// `tenant = namespace`: the name of the object's namespace.
    Namespace,
    /// `tenant = namespace_label("key")`: the value of label `key` on the object's namespace.
    NamespaceLabel(&'static str),
    /// `tenant = field(path)`: a string field of the spec; the path as written.
    Field(&'static str),
}

/// A tenant that is either known, or still needs the object's namespace labels to be known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TenantRef {
    /// The tenant is known from the object alone.
    Known(TenantKey),
    /// The tenant is the value of `label` on namespace `namespace`.
    NamespaceLabel {
        /// The namespace whose label names the tenant.
        namespace: String,
        /// The label key.
        label: &'static str,
    },
}

impl TenantRef {
    /// Resolves the tenant given the labels of the object's namespace (e.g. from a reflector
    /// store of namespaces).
    ///
    /// # Errors
    /// [`TenantError::MissingLabel`] when the namespace lacks the label or its value is empty.
    pub fn resolve_with_labels(
        self,
        labels: &BTreeMap<String, String>,
    ) -> Result<TenantKey, TenantError> {
        match self {
            TenantRef::Known(key) => Ok(key),
            TenantRef::NamespaceLabel { namespace, label } => match labels.get(label) {
                Some(v) if !v.is_empty() => Ok(TenantKey::new(v)),
                _ => Err(TenantError::MissingLabel { namespace, label }),
            },
        }
    }

    /// Resolves the tenant, reading the namespace from the API server when needed (one GET).
    ///
    /// # Errors
    /// [`TenantError::Api`] when the read fails, [`TenantError::MissingLabel`] as in
    /// [`TenantRef::resolve_with_labels`].
    pub async fn resolve(self, client: &Client) -> Result<TenantKey, TenantError> {
        match self {
            TenantRef::Known(key) => Ok(key),
            TenantRef::NamespaceLabel { namespace, label } => {
                let api: Api<Namespace> = Api::all(client.clone());
                let ns = api
                    .get(&namespace)
                    .await
                    .map_err(|source| TenantError::Api {
                        namespace: namespace.clone(),
                        source: Box::new(source),
                    })?;
                let labels = ns.metadata.labels.unwrap_or_default();
                TenantRef::NamespaceLabel { namespace, label }.resolve_with_labels(&labels)
            }
        }
    }
}

/// A spec field that can name a tenant (`tenant = field(path)`): strings, optional strings and
/// [`TenantKey`]s.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot name a tenant",
    label = "the field named by `tenant = field(...)` must be a String, &str, Option<String> or TenantKey"
)]
pub trait TenantField {
    /// The tenant name held by the field, `None` when unset or empty.
    fn tenant_name(&self) -> Option<&str>;
}

impl TenantField for String {
    fn tenant_name(&self) -> Option<&str> {
        Some(self.as_str()).filter(|s| !s.is_empty())
    }
}

impl TenantField for &str {
    fn tenant_name(&self) -> Option<&str> {
        Some(*self).filter(|s| !s.is_empty())
    }
}

impl TenantField for Option<String> {
    fn tenant_name(&self) -> Option<&str> {
        self.as_deref().filter(|s| !s.is_empty())
    }
}

impl TenantField for TenantKey {
    fn tenant_name(&self) -> Option<&str> {
        Some(self.as_str()).filter(|s| !s.is_empty())
    }
}

/// Field-wise comparison and fingerprint of a spec; generated by the derive.
pub trait SpecDiff {
    /// The paths where `self` and `other` differ, comparing their JSON forms exactly; empty
    /// when equal. Paths use the JSON names of the fields (serde `rename`/`rename_all`
    /// honoured), in field declaration order: `replicas` for a changed value,
    /// `config.greeting` inside a map, `ports[0]` inside lists. Fields marked `#[idempotent(skip)]` never
    /// count.
    fn diff(&self, other: &Self) -> Vec<String>;

    /// A stable fingerprint of the compared fields (skipped fields excluded): equal specs give
    /// equal fingerprints across processes and versions of idem.
    fn fingerprint(&self) -> Fingerprint;
}

/// The field of a status type that holds its conditions; used by the derive's generated code.
#[diagnostic::on_unimplemented(
    message = "the status field `conditions` has type `{Self}`, not `Vec<Condition>`",
    label = "idem keeps metav1.Condition-shaped conditions in `conditions: Vec<Condition>`"
)]
pub trait ConditionsField {
    /// The conditions.
    fn get(&self) -> &[Condition];
    /// The conditions, to change.
    fn get_mut(&mut self) -> &mut Vec<Condition>;
}

impl ConditionsField for Vec<Condition> {
    fn get(&self) -> &[Condition] {
        self
    }
    fn get_mut(&mut self) -> &mut Vec<Condition> {
        self
    }
}

/// The field of a status type that records the children created (`created_children`); used by
/// generated code.
#[diagnostic::on_unimplemented(
    message = "the status field `created_children` has type `{Self}`, not `Vec<CreatedChild>`",
    label = "the record of created children is `created_children: Vec<idem_runtime::apply::CreatedChild>` (`#[serde(default)]`)"
)]
pub trait CreatedChildrenField {
    /// The record, to change.
    fn get_mut(&mut self) -> &mut Vec<CreatedChild>;
}

impl CreatedChildrenField for Vec<CreatedChild> {
    fn get_mut(&mut self) -> &mut Vec<CreatedChild> {
        self
    }
}

/// The field of a status type that holds `observedGeneration`; used by generated code.
#[diagnostic::on_unimplemented(
    message = "the status field `observed_generation` has type `{Self}`, not `Option<i64>` or `i64`",
    label = "metadata.generation is an int64, so observedGeneration is `Option<i64>` or `i64`"
)]
pub trait ObservedGenerationField {
    /// The observed generation, `None` when never set.
    fn get(&self) -> Option<i64>;
    /// Sets it.
    fn set(&mut self, generation: i64);
}

impl ObservedGenerationField for Option<i64> {
    fn get(&self) -> Option<i64> {
        *self
    }
    fn set(&mut self, generation: i64) {
        *self = Some(generation);
    }
}

impl ObservedGenerationField for i64 {
    fn get(&self) -> Option<i64> {
        Some(*self).filter(|g| *g != 0)
    }
    fn set(&mut self, generation: i64) {
        *self = generation;
    }
}

/// A root resource that idem reconciles idempotently; generated by
/// `#[derive(IdempotentResource)]` on the spec struct of a kube `CustomResource`.
pub trait IdempotentResource:
    Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The spec struct the derive is on.
    type Spec: SpecDiff;
    /// The status type named in `#[kube(status = "...")]`; it has the fields
    /// `conditions: Vec<Condition>` and `observed_generation: Option<i64>` (or `i64`), read
    /// through the `*_of` functions below (so kinds may share one status type).
    type Status: Clone + Default + Debug + Serialize + DeserializeOwned + Send + Sync + 'static;
    /// The field manager for server-side apply and status writes
    /// (`#[idempotent(field_manager = "...")]`, default the deriving crate's package name).
    const FIELD_MANAGER: &'static str;
    /// The prefix of the labels and the annotation idem stamps on this kind's children
    /// (`<prefix>/tenant`, `<prefix>/owner-uid`, `<prefix>/shard-bucket`,
    /// `<prefix>/applied-fingerprint`, see [`crate::apply::Labels`]):
    /// `#[idempotent(label_prefix = "...")]`, default the kind's API group
    /// (`#[kube(group = ...)]`). A DNS subdomain, checked at compile time.
    const LABEL_PREFIX: &'static str;
    /// The condition types this resource reports (`#[idempotent(conditions(...))]`, default
    /// `Ready, Reconciling, Stalled` — the kstatus set).
    const CONDITION_TYPES: &'static [&'static str];
    /// How the tenant is found (`#[idempotent(tenant = ...)]`).
    const TENANT_RULE: TenantRule;
    /// Whether the root is namespaced (from `#[kube(namespaced)]`).
    const NAMESPACED: bool;

    /// The spec.
    fn spec(&self) -> &Self::Spec;
    /// The status, `None` before the first status write.
    fn status(&self) -> Option<&Self::Status>;
    /// The status, to change.
    fn status_mut(&mut self) -> &mut Option<Self::Status>;
    /// `status.conditions` (metav1.Condition shape).
    fn conditions_of(status: &Self::Status) -> &[Condition];
    /// `status.conditions`, to change.
    fn conditions_of_mut(status: &mut Self::Status) -> &mut Vec<Condition>;
    /// `status.observedGeneration`: the `metadata.generation` the status describes.
    fn observed_generation_of(status: &Self::Status) -> Option<i64>;
    /// Sets `status.observedGeneration`.
    fn set_observed_generation_of(status: &mut Self::Status, generation: i64);
    /// Whether the kind keeps a record of the children its reconciles created (the default;
    /// `false` with `#[idempotent(prune = owner_references)]`).
    const PRUNE_BY_RECORD: bool;
    /// `status.createdChildren`: the record of the children this object's reconciles created
    /// (see [`crate::apply::record`]); `None` for a kind with
    /// `#[idempotent(prune = owner_references)]`.
    fn child_record_of(status: &mut Self::Status) -> Option<&mut Vec<CreatedChild>>;
    /// The tenant of this object, as [`Self::TENANT_RULE`] says.
    ///
    /// # Errors
    /// A [`TenantError`] when the object lacks what the rule reads (name, namespace, field).
    fn tenant(&self) -> Result<TenantRef, TenantError>;
}

/// Helpers the generated `tenant()` calls; not for direct use.
#[doc(hidden)]
pub mod __tenant {
    use super::*;

    /// `tenant = name`.
    pub fn by_name<K: Resource>(obj: &K) -> Result<TenantRef, TenantError> {
        obj.meta()
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .map(|n| TenantRef::Known(TenantKey::new(n)))
            .ok_or(TenantError::MissingName)
    }

    /// `tenant = namespace`.
    pub fn by_namespace<K: Resource>(obj: &K) -> Result<TenantRef, TenantError> {
        obj.meta()
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .map(|n| TenantRef::Known(TenantKey::new(n)))
            .ok_or(TenantError::MissingNamespace)
    }

    /// `tenant = namespace_label("...")`.
    pub fn by_namespace_label<K: Resource>(
        obj: &K,
        label: &'static str,
    ) -> Result<TenantRef, TenantError> {
        obj.meta()
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .map(|n| TenantRef::NamespaceLabel {
                namespace: n.to_owned(),
                label,
            })
            .ok_or(TenantError::MissingNamespace)
    }

    /// `tenant = field(...)`.
    pub fn by_field<F: TenantField + ?Sized>(
        value: &F,
        field: &'static str,
    ) -> Result<TenantRef, TenantError> {
        value
            .tenant_name()
            .map(|n| TenantRef::Known(TenantKey::new(n)))
            .ok_or(TenantError::EmptyField { field })
    }
}

/// The status type of a stub impl emitted next to derive errors; never used at run time.
#[doc(hidden)]
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct __NoStatus {
    conditions: Vec<Condition>,
    observed_generation: Option<i64>,
}
