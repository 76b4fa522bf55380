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
//! - **TenantApp**: its `metadata.namespace`; its ConfigMap, Deployment and Service live in the
//!   same namespace, so the server selects them with the same ranges. The operator's cache of
//!   its namespaces (a TenantApp's tenant is looked up there) selects by
//!   [`NAMESPACE_BUCKET_LABEL`], the bucket of the namespace's own name, which a Tenant puts on
//!   its Namespaces.

use idem_runtime::shard::{bucket_of, fnv1a64};

/// Label of a tenant Namespace: the shard bucket (decimal `0..=255`) of its own name, i.e. of
/// the `metadata.namespace` of every object in it, by which TenantApps are sharded. Set by
/// the Tenant that owns the namespace; the operator's namespace cache selects on it.
pub const NAMESPACE_BUCKET_LABEL: &str = "tenancy.idem.dev/namespace-bucket";

/// The value of [`NAMESPACE_BUCKET_LABEL`] for namespace `name`.
pub fn namespace_bucket(name: &str) -> String {
    bucket_of(fnv1a64(name.as_bytes())).to_string()
}
