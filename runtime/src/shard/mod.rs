//! Sharding: which replica of a controller owns an object, by the 64-bit FNV-1a hash of its
//! `metadata.uid` or `metadata.namespace` (the hash of KEP-5866's `shardRange`), split among
//! the live members of a ring by rendezvous hashing over fixed hash buckets.
//!
//! ```
//! use idem_runtime::shard::{Ring, ShardField, fnv1a64};
//! let ring = Ring::new(["replica-a", "replica-b", "replica-c"]);
//! let mine = ring.ranges_of("replica-b");
//! let h = fnv1a64(b"0f0c9a6e-0000-4000-8000-000000000001");
//! assert_eq!(mine.contains(h), ring.owner_of(h) == Some("replica-b"));
//! // The server-side selector of those ranges (KEP-5866 `shardSelector`):
//! let _selector = mine.selector(ShardField::Uid);
//! ```

mod hash;
mod ring;

pub use self::hash::{ShardField, fnv1a64, shard_hash};
pub use self::ring::{BUCKETS, Ranges, Ring, bucket_of};
