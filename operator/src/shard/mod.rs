//! What the operator adds to idem-runtime's sharding ([`idem_runtime::shard`], run by
//! [`idem_runtime::manager`] with `--shards auto`): TenantApps are sharded by namespace, so a
//! Tenant labels each of its Namespaces with the bucket of the namespace's name.
//!
//! Which field each controller shards on, so that a primary and its children land on the same
//! replica ([`crate::controllers::Operator`]):
//! - **Tenant**: its `metadata.uid`. Its children (Namespaces, ResourceQuotas, LimitRanges,
//!   RoleBindings, NetworkPolicies) have uids of their own, so the server's `shardRange` cannot
//!   select them; instead the apply engine labels each with the bucket of its owner's uid
//!   ([`idem_runtime::apply::SHARD_BUCKET_LABEL`]) and the child watches select this
//!   replica's buckets by label ([`crate::tenant::source::sharded_children_config`]).
//! - **TenantApp**: its `metadata.namespace`. Its ConfigMap, Deployment and Service live in the
//!   same namespace and each carries that namespace's bucket in [`NAMESPACE_BUCKET_LABEL`]
//!   (put there by the app with its children's other labels), so the child watches select them
//!   by label as a Tenant's are, with or without the server's sharded lists
//!   ([`crate::tenant::source::sharded_children_config`]). The operator's cache of its
//!   namespaces (a TenantApp's tenant is looked up there) selects by the same label, which a
//!   Tenant puts on its Namespaces.

use idem_runtime::shard::{bucket_of, fnv1a64};

/// Label of a tenant Namespace and of a TenantApp's children: the shard bucket (decimal
/// `0..=255`) of the namespace's name, i.e. of the `metadata.namespace` of every object in it,
/// by which TenantApps are sharded. Set by the Tenant that owns the namespace and by the app
/// on its children; the TenantApp controller's namespace-to-tenant watch and its child watches select on it.
pub const NAMESPACE_BUCKET_LABEL: &str = "tenancy.idem.dev/namespace-bucket";

/// The value of [`NAMESPACE_BUCKET_LABEL`] for namespace `name`.
pub fn namespace_bucket(name: &str) -> String {
    bucket_of(fnv1a64(name.as_bytes())).to_string()
}
