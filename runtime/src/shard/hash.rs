//! The 64-bit FNV-1a hash that the API server's sharded lists and watches (`ShardedListAndWatch`) apply to the sharded field.

use kube::api::ObjectMeta;

/// The field a controller shards on; the same field must be used for a primary kind and the
/// children it reconciles so that they land on one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShardField {
    /// `metadata.uid` (`object.metadata.uid` in a `shardSelector`).
    Uid,
    /// `metadata.namespace` (`object.metadata.namespace` in a `shardSelector`).
    Namespace,
}

impl ShardField {
    /// The field path as a `shardRange` argument.
    pub fn path(self) -> &'static str {
        match self {
            Self::Uid => "object.metadata.uid",
            Self::Namespace => "object.metadata.namespace",
        }
    }
}

/// FNV-1a 64-bit offset basis (Fowler/Noll/Vo, IETF draft-eastlake-fnv, §2).
const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV 64-bit prime, 2^40 + 2^8 + 0xb3.
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// The 64-bit FNV-1a hash of `bytes`: for each byte, xor it into the state, then multiply by
/// the FNV prime (mod 2^64). This is Go's `hash/fnv.New64a`, which the apiserver applies to
/// the UTF-8 bytes of the field named in a `shardRange(...)` selector.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(OFFSET_BASIS, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

/// The shard hash of an object: [`fnv1a64`] of its `metadata.uid` or `metadata.namespace` (an
/// absent field hashes as the empty string, as a cluster-scoped object's namespace).
pub fn shard_hash(meta: &ObjectMeta, field: ShardField) -> u64 {
    let value = match field {
        ShardField::Uid => meta.uid.as_deref(),
        ShardField::Namespace => meta.namespace.as_deref(),
    };
    fnv1a64(value.unwrap_or_default().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_fnv1a_64_vectors() {
        // Test vectors of the FNV reference (draft-eastlake-fnv, appendix C).
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn hashes_the_chosen_field() {
        let meta = ObjectMeta {
            uid: Some("a".into()),
            namespace: Some("foobar".into()),
            ..ObjectMeta::default()
        };
        assert_eq!(shard_hash(&meta, ShardField::Uid), fnv1a64(b"a"));
        assert_eq!(shard_hash(&meta, ShardField::Namespace), fnv1a64(b"foobar"));
        assert_eq!(
            shard_hash(&ObjectMeta::default(), ShardField::Namespace),
            fnv1a64(b"")
        );
    }
}
