//! Sharding the operator across replicas (`--shards auto`): membership of a ring of replicas
//! on Leases ([`membership`]), and this replica's share of the lists and watches
//! ([`selector`]). The assignment itself (hash and ring) is [`idem_runtime::shard`].
//!
//! Which field each controller shards on, so that a primary and its children land on the same
//! replica:
//! - **Tenant**: its `metadata.uid`. Its children (Namespaces, ResourceQuotas, LimitRanges,
//!   RoleBindings, NetworkPolicies) carry an ownerReference with that uid, by which the child
//!   watches map them to the Tenant; they are watched in full and filtered on this side (their
//!   own uids differ, so the server cannot select them).
//! - **TenantApp**: its `metadata.namespace`; its ConfigMap, Deployment and Service live in the
//!   same namespace, so the server selects them with the same ranges.
//!
//! Server-side selection (KEP-5866 `shardSelector`, gate `ShardedListAndWatch`) is used when
//! [`probe_server_side`] finds the server echoing `metadata.shardInfo`; the controllers filter
//! by the same hash on their side in every case, because custom resources come back filtered
//! but without `shardInfo` and an older server ignores the parameter.

pub mod membership;
pub mod selector;

use idem_runtime::shard::{Ranges, ShardField};
use kube::Client;

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
