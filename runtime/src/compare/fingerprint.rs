//! A stable fingerprint of a JSON value: FNV-1a (64 bit) over its canonical serialisation.

use std::fmt;

use serde_json::Value;

/// A stable 64-bit fingerprint, shown as 16 lowercase hex digits.
///
/// Computed with FNV-1a over a canonical form of the value (object keys sorted, no spaces), so
/// it does not depend on field order, process, platform or Rust version (unlike
/// `std::hash::DefaultHasher`). Not a cryptographic hash: use it to detect change, not to
/// authenticate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub u64);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The fingerprint of `value`.
pub fn fingerprint(value: &Value) -> Fingerprint {
    use std::hash::Hasher;
    let mut h = Fnv(FNV_OFFSET);
    write_canonical(value, &mut h);
    Fingerprint(h.finish())
}

/// A fingerprint of `value` keyed with a secret random to this process (SipHash): stable within
/// the process only, and not to be matched by a value chosen to collide with another, as
/// FNV-1a can be. For fingerprints kept in memory and compared with values others may write.
pub(crate) fn keyed_fingerprint(value: &Value) -> Fingerprint {
    use std::hash::{BuildHasher, Hasher};
    static KEY: std::sync::LazyLock<std::collections::hash_map::RandomState> =
        std::sync::LazyLock::new(std::collections::hash_map::RandomState::new);
    let mut h = KEY.build_hasher();
    write_canonical(value, &mut h);
    Fingerprint(h.finish())
}

fn write_canonical(value: &Value, h: &mut impl std::hash::Hasher) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            h.write(b"{");
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    h.write(b",");
                }
                h.write(Value::String(k.clone()).to_string().as_bytes());
                h.write(b":");
                write_canonical(&map[k], h);
            }
            h.write(b"}");
        }
        Value::Array(items) => {
            h.write(b"[");
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    h.write(b",");
                }
                write_canonical(v, h);
            }
            h.write(b"]");
        }
        other => h.write(other.to_string().as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_matter() {
        let a = json!({"a": 1, "b": {"x": [1, 2], "y": "s"}});
        let b = json!({"b": {"y": "s", "x": [1, 2]}, "a": 1});
        assert_eq!(fingerprint(&a), fingerprint(&b));
    }

    #[test]
    fn values_matter() {
        assert_ne!(fingerprint(&json!({"a": 1})), fingerprint(&json!({"a": 2})));
        assert_ne!(fingerprint(&json!([1, 2])), fingerprint(&json!([2, 1])));
        assert_ne!(fingerprint(&json!("1")), fingerprint(&json!(1)));
    }

    #[test]
    fn pinned_value_is_stable() {
        // FNV-1a of the bytes `{"a":1}`; pinned so a change of algorithm is noticed.
        assert_eq!(
            fingerprint(&json!({"a": 1})).to_string(),
            "9c3e82dd6fcae8b1"
        );
    }
}
