//! Sharding: which replica of a controller owns an object, by the 64-bit FNV-1a hash of its
//! `metadata.uid` or `metadata.namespace` (the hash of the API server's `shardRange`), split
//! among the live members of a ring by rendezvous hashing over fixed hash buckets; the ring's
//! membership on Leases ([`membership`]), the guard of a replica outside the ring ([`guard`])
//! and the client layer that asks the server for this replica's share ([`selector`]).
//!
//! ```
//! use idem_runtime::shard::{Ring, ShardField, fnv1a64};
//! let ring = Ring::new(["replica-a", "replica-b", "replica-c"]);
//! let mine = ring.ranges_of("replica-b");
//! let h = fnv1a64(b"0f0c9a6e-0000-4000-8000-000000000001");
//! assert_eq!(mine.contains(h), ring.owner_of(h) == Some("replica-b"));
//! // The server-side selector of those ranges (the API server's `shardSelector`):
//! let _selector = mine.selector(ShardField::Uid);
//! ```
//!
//! A primary sharded by its uid has children with uids of their own: the apply engine labels
//! each with the bucket of its owner's uid ([`crate::apply::Labels::shard_bucket`] of the owner's kind) and the child
//! watches select this replica's buckets by label. The labels only narrow watches: which
//! replica reconciles an object is decided by the hash of the primary's own uid (or
//! namespace), which no one can forge.
//!
//! Server-side selection (`shardSelector`, gate `ShardedListAndWatch`) is used when
//! [`probe_server_side`] finds the server echoing `metadata.shardInfo`; the controllers filter
//! by the same hash on their side in every case, because custom resources come back filtered
//! but without `shardInfo` and an older server ignores the parameter.

pub mod guard;
mod hash;
pub mod membership;
mod ring;
pub mod selector;

use kube::Client;

pub use self::hash::{ShardField, fnv1a64, shard_hash};
pub use self::ring::{BUCKETS, Ranges, Ring, bucket_of};

/// Whether the API server filters lists by `shardSelector`: lists one Lease of `namespace` (the
/// ring's, which a member may list) with a selector of the whole hash space and looks for the
/// echoed `metadata.shardInfo.selector`.
///
/// # Errors
/// When the list request fails.
pub async fn probe_server_side(client: &Client, namespace: &str) -> Result<bool, kube::Error> {
    let selector = Ranges::all().selector(ShardField::Uid).unwrap_or_default();
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases?limit=1");
    let path = path
        .parse()
        .map_err(|e: http::uri::InvalidUri| kube::Error::HttpError(e.into()))?;
    let uri = selector::with_selector(&path, &selector);
    let request = http::Request::get(uri.to_string())
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let list: serde_json::Value = client.request(request).await?;
    Ok(list["metadata"]["shardInfo"]["selector"].is_string())
}
