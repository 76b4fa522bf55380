//! Sharding the operator across replicas (`--shards auto`): membership of a ring of replicas
//! on Leases ([`membership`]), and this replica's share of the lists and watches
//! ([`selector`]). The assignment itself (hash and ring) is [`idem_runtime::shard`].
//!
//! Which field each controller shards on, so that a primary and its children land on the same
//! replica:
//! - **Tenant**: its `metadata.uid`. Its children (Namespaces, ResourceQuotas, LimitRanges,
//!   RoleBindings, NetworkPolicies) have uids of their own, so KEP-5866's `shardRange` cannot
//!   select them; instead the apply engine labels each with the bucket of its owner's uid
//!   ([`idem_runtime::apply::SHARD_BUCKET_LABEL`]) and the child watches select this
//!   replica's buckets by label (`tenancy.idem.dev/shard-bucket in (…)`,
//!   [`crate::tenant::source::sharded_children_config`]) — filtered by the server with or
//!   without the gate. The child maps to its Tenant by ownerReference as before.
//! - **TenantApp**: its `metadata.namespace`; its ConfigMap, Deployment and Service live in the
//!   same namespace, so the server selects them with the same ranges. The operator's cache of
//!   its namespaces (a TenantApp's tenant is looked up there) selects by
//!   [`NAMESPACE_BUCKET_LABEL`], the bucket of the namespace's own name, which a Tenant puts on
//!   its Namespaces.
//!
//! The labels only narrow watches. Which replica reconciles an object is decided by the hash
//! of the object's own uid or namespace, which no one can forge; a forged or removed label can
//! hide a child from its owner's replica until the owner's reconcile applies the label back
//! (the watch's DELETE event of the child enqueues the owner), and makes another replica
//! receive it, which ignores it.
//!
//! Server-side selection (KEP-5866 `shardSelector`, gate `ShardedListAndWatch`) is used when
//! [`probe_server_side`] finds the server echoing `metadata.shardInfo`; the controllers filter
//! by the same hash on their side in every case, because custom resources come back filtered
//! but without `shardInfo` and an older server ignores the parameter.

pub mod guard;
pub mod membership;
pub mod selector;

use idem_runtime::shard::{Ranges, ShardField, bucket_of, fnv1a64};
use kube::Client;

/// Label of a tenant Namespace: the shard bucket (decimal `0..=255`) of its own name, i.e. of
/// the `metadata.namespace` of every object in it, by which TenantApps are sharded. Set by
/// the Tenant that owns the namespace; the operator's namespace cache selects on it.
pub const NAMESPACE_BUCKET_LABEL: &str = "tenancy.idem.dev/namespace-bucket";

/// The value of [`NAMESPACE_BUCKET_LABEL`] for namespace `name`.
pub fn namespace_bucket(name: &str) -> String {
    bucket_of(fnv1a64(name.as_bytes())).to_string()
}

/// Whether the API server filters lists by `shardSelector`: lists one Namespace with a selector
/// of the whole hash space and looks for the echoed `metadata.shardInfo.selector`.
///
/// # Errors
/// When the list request fails.
pub async fn probe_server_side(client: &Client) -> Result<bool, kube::Error> {
    let selector = Ranges::all().selector(ShardField::Uid).unwrap_or_default();
    let uri = selector::with_selector(
        &"/api/v1/namespaces?limit=1".parse().expect("a valid URI"),
        &selector,
    );
    let request = http::Request::get(uri.to_string())
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let list: serde_json::Value = client.request(request).await?;
    Ok(list["metadata"]["shardInfo"]["selector"].is_string())
}
