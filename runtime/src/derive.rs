//! Reference of `#[derive(IdempotentResource)]`: every attribute, what is generated, and the
//! errors it reports.
//!
//! Put the derive on the spec struct of a kube `CustomResource`, next to kube's derive. It
//! reads kube's `#[kube(...)]` attribute on the same struct, so nothing is said twice:
//!
//! | from `#[kube(...)]` | used for |
//! |---|---|
//! | `kind = "..."` (or `root = "..."`) | the root type the traits are implemented for |
//! | `namespaced` | [`IdempotentResource::NAMESPACED`](crate::resource::IdempotentResource::NAMESPACED) and which `tenant` forms are allowed |
//! | `status = "..."` | the status type; **required**, with `conditions`, `observed_generation` and (unless `prune = owner_references`) `created_children` |
//!
//! # Example
//!
//! ```
//! use idem_runtime::IdempotentResource;
//! use idem_runtime::resource::{IdempotentResource as _, SpecDiff, TenantRef};
//! use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
//! use kube::CustomResource;
//! use schemars::JsonSchema;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
//! #[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "TenantApp",
//!        namespaced, status = "TenantAppStatus")]
//! #[idempotent(tenant = namespace_label("tenancy.idem.dev/tenant"),
//!              field_manager = "idem-operator", conditions(Ready, Reconciling, Stalled))]
//! #[serde(rename_all = "camelCase")]
//! pub struct TenantAppSpec {
//!     pub image: String,
//!     pub replicas: i32,
//!     #[idempotent(skip)] // not part of the desired-state comparison
//!     pub note: Option<String>,
//! }
//!
//! /// The status type needs `conditions`, `observed_generation` and the record of the
//! /// children created, `created_children` (`status.createdChildren`).
//! #[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
//! #[serde(rename_all = "camelCase")]
//! pub struct TenantAppStatus {
//!     pub observed_generation: Option<i64>,
//!     #[serde(default)]
//!     pub conditions: Vec<Condition>,
//!     #[serde(default)]
//!     pub created_children: Vec<idem_runtime::apply::CreatedChild>,
//! }
//!
//! let mut app = TenantApp::new("web", TenantAppSpec {
//!     image: "nginx:1.27".into(), replicas: 2, note: None,
//! });
//! app.metadata.namespace = Some("acme-dev".into());
//! let changed = TenantAppSpec { replicas: 3, note: Some("ignored".into()), ..app.spec.clone() };
//! assert_eq!(app.spec.diff(&changed), vec!["replicas"]);
//! assert_ne!(app.spec.fingerprint(), changed.fingerprint());
//! assert_eq!(TenantApp::FIELD_MANAGER, "idem-operator");
//! assert_eq!(
//!     app.tenant().unwrap(),
//!     TenantRef::NamespaceLabel { namespace: "acme-dev".into(), label: "tenancy.idem.dev/tenant" },
//! );
//! ```
//!
//! # `#[idempotent(...)]` on the struct
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `tenant = name` | cluster-scoped roots | the tenant is the object's own `metadata.name` (a root like `Tenant`); only for cluster-scoped kinds |
//! | `tenant = namespace` | — | the tenant is the name of the object's namespace; only for namespaced kinds |
//! | `tenant = namespace_label("key")` | namespaced roots, with `"<label_prefix>/tenant"` (`"tenancy.idem.dev/tenant"` for the operator's kinds) | the tenant is the value of label `key` on the object's namespace, resolved with [`TenantRef::resolve`](crate::resource::TenantRef::resolve) (one GET) or [`TenantRef::resolve_with_labels`](crate::resource::TenantRef::resolve_with_labels) (from a cache) |
//! | `tenant = field(a.b)` | — | the tenant is spec field `a.b`: `String`, `Option<String>`, `&str` or [`TenantKey`](crate::TenantKey) |
//! | `label_prefix = "..."` | the `#[kube(group = ...)]` group | the prefix of the labels and the annotation idem stamps on children (`<prefix>/owner-uid`, `<prefix>/tenant`, `<prefix>/shard-bucket`, `<prefix>/applied-fingerprint`; [`Labels`](crate::apply::Labels)); a DNS subdomain, checked at compile time; `app.kubernetes.io/managed-by` is the same for every kind |
//! | `field_manager = "..."` | the deriving crate's package name (`CARGO_PKG_NAME`) | the server-side apply field manager, also the value of the `app.kubernetes.io/managed-by` label on every child and of the child watches' selector, so a label value (1–63 letters, digits, `-`, `_`, `.`, beginning and ending with a letter or digit); also an inherent `Kind::FIELD_MANAGER`, reachable without importing the trait |
//! | `conditions(A, B, "prefix.example/C")` | `Ready, Reconciling, Stalled` | condition types the status engine may set: CamelCase identifiers or qualified-name strings |
//! | `prune = owner_references` | `prune = record` | what the prune trusts. By default (`record`) the status field `created_children: Vec<CreatedChild>` (`status.createdChildren`, a subresource users who may edit the object cannot write) records the uid of every child the reconciles created, and only those are pruned, and a deleted create-once child is told from one never created; a status without the field is a compile error at `status = "..."`. `owner_references` opts out: no record, the prune deletes whatever carries the owner's controller ownerReference — which anyone who may create the child kind where the children live can forge, making the owner delete it — and create-once children are refused (terminal `CreateOnceWithoutRecord`) |
//! | `crate = "path"` | `"::idem_runtime"` | where idem-runtime is, when it is renamed or re-exported |
//!
//! The other forms, one example each (every one compiles):
//!
//! ```
//! # use idem_runtime::IdempotentResource;
//! # use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
//! # use kube::CustomResource;
//! # use schemars::JsonSchema;
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
//! # pub struct S { pub observed_generation: Option<i64>, pub conditions: Vec<Condition>,
//! #     pub created_children: Vec<idem_runtime::apply::CreatedChild> }
//! // Cluster-scoped root: the tenant is its own name; field manager and conditions default.
//! #[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
//! #[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "Tenant", status = "S")]
//! #[idempotent(tenant = name)]
//! pub struct TenantSpec { pub namespaces: Vec<String> }
//!
//! // The namespace itself names the tenant.
//! #[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
//! #[kube(group = "example.com", version = "v1", kind = "Queue", namespaced, status = "S")]
//! #[idempotent(tenant = namespace)]
//! pub struct QueueSpec { pub size: u32 }
//!
//! // A spec field names the tenant; custom conditions; runtime reached under another name.
//! extern crate idem_runtime as idem;
//! #[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
//! pub struct Owner { pub team: String }
//! #[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
//! #[kube(group = "example.com", version = "v1", kind = "Bucket", namespaced, status = "S")]
//! #[idempotent(tenant = field(owner.team), field_manager = "bucket-controller",
//!              conditions(Ready, "example.com/Replicated"), crate = "idem")]
//! pub struct BucketSpec { pub owner: Owner }
//! # fn main() {}
//! ```
//!
//! The runtime uses the rule: [`Controller::for_derived`](crate::controller::Controller::for_derived)
//! puts each object in its tenant's fair queue by [`IdempotentResource::tenant`](crate::resource::IdempotentResource::tenant)
//! (a `namespace_label` rule reads the label on the object's namespace from a metadata-only
//! watch of Namespaces the controller runs by itself, see
//! [`NamespaceTenants`](crate::controller::NamespaceTenants); a namespace that gains, loses or
//! changes its tenant queues its objects at once, past their backoff).
//!
//! # `#[idempotent(skip)]` on a field
//!
//! Leaves the field out of [`SpecDiff::diff`](crate::resource::SpecDiff::diff) and
//! [`SpecDiff::fingerprint`](crate::resource::SpecDiff::fingerprint), and so out of the change
//! predicate of [`Controller::for_derived`](crate::controller::Controller::for_derived): editing
//! only skipped fields does not reconcile (`status.observedGeneration` then stays behind
//! `metadata.generation` until the next reconcile). Use it for fields that do not change the
//! desired children (notes, hints).
//!
//! # Generating the CRD
//!
//! [`crate::schema::crd`] instead of kube's `crd()`: a spec or status field whose type has no
//! Kubernetes structural schema (an internally or adjacently tagged enum,
//! `#[serde(tag = "...")]`) is an error naming the field, its type and what to write instead,
//! where kube's `crd()` panics without naming either; so is a status struct that puts
//! `observed_generation` or `created_children` on the wire under those names (without
//! `#[serde(rename_all = "camelCase")]`: kstatus readers look for `observedGeneration`).
//! `cargo xtask crds` and a manager's `crds` use it.
//!
//! # What is generated
//!
//! - [`SpecDiff`](crate::resource::SpecDiff) for the spec: field-wise comparison by meaning
//!   (quantities by value, int-or-string, empty = absent; see [`crate::compare`]) returning
//!   the wire names (serde `rename`/`rename_all` honoured) of differing fields, and a stable
//!   fingerprint ([`crate::compare::Fingerprint`]).
//! - [`IdempotentResource`](crate::resource::IdempotentResource) for the root type: field
//!   manager, condition types, tenant rule, scope, spec/status access, `tenant()`, and
//!   access to the status type's `conditions: Vec<Condition>` and
//!   `observed_generation: Option<i64>` (or `i64`) fields. Nothing is implemented on the
//!   status type itself, so several kinds may share one status type.
//!
//! # Compile-time errors
//!
//! Every misuse is reported at the offending tokens, all at once, and the derive still emits
//! placeholder impls so no follow-on error appears elsewhere: unknown keys (with a "did you
//! mean"), duplicate keys, a missing `#[kube]` attribute or `status`, a status type without
//! `conditions` / `observed_generation` / `created_children` (the record, unless
//! `prune = owner_references`) or with the wrong types, a `prune` form that does not exist, `skip` on the struct, a
//! condition type that is not CamelCase or not a qualified name, a condition listed twice,
//! an empty `conditions()`, enums, tuple and unit structs, generic specs, a `tenant` form that
//! does not exist or does not fit the scope, a bad label key, a `field(...)` that is not in
//! the spec or not a string, a field manager that is no label value. The cases are in
//! `macros/tests/ui/`.
