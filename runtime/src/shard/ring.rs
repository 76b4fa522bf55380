//! The ring: live members split the 64-bit hash space by rendezvous hashing over [`BUCKETS`]
//! equal buckets, and each member's share as hash ranges and as the API server's `shardSelector`.
//!
//! Algorithm: rendezvous (highest random weight) hashing, Thaler & Ravishankar, "Using
//! name-based mappings to increase hit rates", IEEE/ACM ToN 1998, with bounded loads
//! (Mirrokni, Thorup & Zadimoghaddam, "Consistent hashing with bounded loads", SODA 2018).
//! Each member ranks bucket `b` (the top 8 bits of an object's hash) by the score
//! `mix(fnv1a64(member) ⊕ mix(b))`; buckets are taken in order 0‥255 and each goes to the
//! highest-ranked member that holds fewer than ⌈256/N⌉ buckets. Shares are therefore equal to
//! within one bucket, and adding or removing a member moves about 1/N of the buckets (a little
//! more than plain rendezvous hashing, whose shares with 256 buckets differ by up to ±20%; the
//! unit tests bound both). Fixed buckets keep a member's share a short list of contiguous
//! ranges, so a `shardSelector` stays a few kB at most.

use std::fmt::Write as _;

use super::hash::{ShardField, fnv1a64};

/// Number of equal hash buckets the ring assigns (the top 8 bits of a hash); with N members
/// each owns ⌊256/N⌋ or ⌈256/N⌉ of them.
pub const BUCKETS: usize = 256;

/// The splitmix64 finaliser (Steele, Lea & Flood, OOPSLA 2014): spreads a member's FNV hash
/// and the bucket number over all 64 bits of a rendezvous score.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The bucket of hash `h`: its top 8 bits, `0..BUCKETS`.
pub fn bucket_of(h: u64) -> usize {
    (h >> 56) as usize
}

/// A set of live members (by identity); cheap to build, deterministic for the same set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ring {
    members: Vec<String>,
    /// The owner (index into `members`) of every bucket; empty when there are no members.
    owners: Vec<usize>,
}

impl Ring {
    /// The ring of `members` (duplicates are ignored, order does not matter).
    pub fn new<S: AsRef<str>>(members: impl IntoIterator<Item = S>) -> Self {
        let mut members: Vec<String> = members
            .into_iter()
            .map(|m| m.as_ref().to_string())
            .collect();
        members.sort();
        members.dedup();
        let seeds: Vec<u64> = members.iter().map(|m| fnv1a64(m.as_bytes())).collect();
        let owners = if members.is_empty() {
            Vec::new()
        } else {
            let cap = BUCKETS.div_ceil(members.len());
            let mut load = vec![0usize; members.len()];
            let mut ranked: Vec<usize> = (0..members.len()).collect();
            (0..BUCKETS as u64)
                .map(|b| {
                    // Highest score first; ties (astronomically rare) by name.
                    ranked.sort_by_key(|i| (std::cmp::Reverse(mix(seeds[*i] ^ mix(b))), *i));
                    let owner = ranked
                        .iter()
                        .copied()
                        .find(|i| load[*i] < cap)
                        .unwrap_or(ranked[0]);
                    load[owner] += 1;
                    owner
                })
                .collect()
        };
        Self { members, owners }
    }

    /// The members, sorted by identity.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// A short fingerprint of the member set (16 hex digits): equal sets, equal versions.
    pub fn version(&self) -> String {
        format!("{:016x}", fnv1a64(self.members.join("\n").as_bytes()))
    }

    /// The member that owns hash `h`, or `None` on an empty ring.
    pub fn owner_of(&self, h: u64) -> Option<&str> {
        let i = *self.owners.get(bucket_of(h))?;
        Some(&self.members[i])
    }

    /// The hash ranges `member` owns (empty when it is not a member).
    pub fn ranges_of(&self, member: &str) -> Ranges {
        let mut owned = [false; BUCKETS];
        if let Ok(me) = self.members.binary_search_by(|m| m.as_str().cmp(member)) {
            for (b, owner) in self.owners.iter().enumerate() {
                owned[b] = *owner == me;
            }
        }
        Ranges { owned }
    }
}

/// The hash ranges one member owns: a set of [`BUCKETS`] buckets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ranges {
    owned: [bool; BUCKETS],
}

impl Ranges {
    /// Every hash (an unsharded controller).
    pub fn all() -> Self {
        Self {
            owned: [true; BUCKETS],
        }
    }

    /// Whether hash `h` is in these ranges.
    pub fn contains(&self, h: u64) -> bool {
        self.owned[bucket_of(h)]
    }

    /// Whether bucket `b` (as [`bucket_of`] gives) is in these ranges.
    pub fn holds(&self, b: usize) -> bool {
        self.owned.get(b).copied().unwrap_or(false)
    }

    /// The fraction of the hash space these ranges cover, in `[0, 1]`.
    pub fn share(&self) -> f64 {
        self.owned.iter().filter(|o| **o).count() as f64 / BUCKETS as f64
    }

    /// Whether these ranges are the whole hash space (nothing to select).
    pub fn is_all(&self) -> bool {
        self.owned.iter().all(|o| *o)
    }

    /// The owned buckets, ascending.
    pub fn buckets(&self) -> impl Iterator<Item = usize> + '_ {
        (0..BUCKETS).filter(|b| self.owned[*b])
    }

    /// A label selector requirement that matches objects whose `label` holds one of these
    /// buckets in decimal (`label in (0,3,17)`, the set-based syntax of the Kubernetes label
    /// selector), for objects labelled with the bucket of another object's hash (a Tenant's
    /// children with the Tenant's, see `Labels::shard_bucket` of the apply engine). `None` when
    /// these ranges are the whole hash space (no restriction needed); when they are empty it
    /// selects nothing (`label in (none)`; `none` is never a bucket). At most 256 values of at
    /// most 3 digits: about 1 kB, well within the API server's URL limits.
    pub fn label_selector(&self, label: &str) -> Option<String> {
        if self.is_all() {
            return None;
        }
        let values: Vec<String> = self.buckets().map(|b| b.to_string()).collect();
        let values = if values.is_empty() {
            "none".to_owned()
        } else {
            values.join(",")
        };
        Some(format!("{label} in ({values})"))
    }

    /// The ranges as merged half-open intervals `[start, end)`; `end` is at most 2^64.
    pub fn intervals(&self) -> Vec<(u64, u128)> {
        let width = 1u128 << 56;
        let mut out: Vec<(u64, u128)> = Vec::new();
        for b in (0..BUCKETS).filter(|b| self.owned[*b]) {
            let start = b as u128 * width;
            match out.last_mut() {
                Some(last) if last.1 == start => last.1 = start + width,
                _ => out.push((start as u64, start + width)),
            }
        }
        out
    }

    /// The API server's `shardSelector` of these ranges on `field`, e.g.
    /// `shardRange(object.metadata.uid, '0x0000000000000000', '0x5500000000000000') || …`
    /// (half-open ranges, bounds as 0x-prefixed 16-digit hex as the apiserver requires);
    /// `None` when empty (a selector cannot select nothing).
    pub fn selector(&self, field: ShardField) -> Option<String> {
        let mut s = String::new();
        for (start, end) in self.intervals() {
            if !s.is_empty() {
                s.push_str(" || ");
            }
            // 16 hex digits each (the apiserver refuses shorter ones); the end of the hash
            // space is 2^64, 0x10000000000000000.
            let _ = write!(
                s,
                "shardRange({}, '0x{start:016x}', '0x{end:016x}')",
                field.path()
            );
        }
        (!s.is_empty()).then_some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("idem-operator-{i}")).collect()
    }

    /// Deterministic pseudo-uids, hashed as the server would.
    fn hashes(n: u64) -> impl Iterator<Item = u64> {
        (0..n).map(|i| fnv1a64(format!("{:08x}-7c1e-4a55-9d1b-{:012x}", i * 7919, i).as_bytes()))
    }

    #[test]
    fn every_hash_has_exactly_one_owner_and_ranges_agree() {
        let ring = Ring::new(names(3));
        let ranges: Vec<_> = ring.members().iter().map(|m| ring.ranges_of(m)).collect();
        for h in hashes(5000).chain([0, u64::MAX, 1 << 63]) {
            let owners: Vec<_> = ring
                .members()
                .iter()
                .zip(&ranges)
                .filter(|(_, r)| r.contains(h))
                .map(|(m, _)| m.as_str())
                .collect();
            assert_eq!(owners, vec![ring.owner_of(h).unwrap()]);
        }
        let total: f64 = ranges.iter().map(Ranges::share).sum();
        assert!((total - 1.0).abs() < 1e-9);
    }

    #[test]
    fn shares_are_balanced() {
        for n in 2..=6 {
            let ring = Ring::new(names(n));
            let mut counts = std::collections::HashMap::<&str, usize>::new();
            let total = 60_000;
            for h in hashes(total) {
                *counts.entry(ring.owner_of(h).unwrap()).or_default() += 1;
            }
            assert_eq!(counts.len(), n);
            let ideal = total as f64 / n as f64;
            for (m, c) in counts {
                let dev = (c as f64 - ideal).abs() / ideal;
                assert!(dev < 0.1, "{n} members: {m} owns {c}, ideal {ideal:.0}");
            }
        }
    }

    #[test]
    fn adding_or_removing_a_member_moves_about_one_nth() {
        for n in 2..=5 {
            let before = Ring::new(names(n));
            let after = Ring::new(names(n + 1));
            let new = &names(n + 1)[n];
            let (mut moved, mut gained) = (0, 0);
            let total = 40_000;
            for h in hashes(total) {
                let (a, b) = (before.owner_of(h).unwrap(), after.owner_of(h).unwrap());
                if a != b {
                    moved += 1;
                    gained += usize::from(b == new);
                }
            }
            let fraction = moved as f64 / total as f64;
            let ideal = 1.0 / (n + 1) as f64;
            // Most moves go to the new member; bounded loads shift a few more.
            assert!(gained as f64 >= 0.7 * moved as f64, "{gained} of {moved}");
            assert!(
                fraction >= 0.8 * ideal && fraction <= 1.5 * ideal,
                "{n}→{}: moved {fraction:.3}, ideal {ideal:.3}",
                n + 1
            );
        }
        // Removing a member (not the last by name) moves about its own share.
        let all = Ring::new(names(4));
        let without = Ring::new(["idem-operator-0", "idem-operator-2", "idem-operator-3"]);
        let total = 20_000;
        let moved = hashes(total)
            .filter(|h| all.owner_of(*h) != without.owner_of(*h))
            .count() as f64
            / total as f64;
        assert!((0.2..=0.375).contains(&moved), "moved {moved:.3}");
    }

    #[test]
    fn label_selectors_list_the_owned_buckets() {
        assert_eq!(Ranges::all().label_selector("b"), None);
        let ring = Ring::new(names(3));
        let mut seen = [0usize; BUCKETS];
        for m in ring.members() {
            let r = ring.ranges_of(m);
            let sel = r.label_selector("tenancy.idem.dev/shard-bucket").unwrap();
            let values = sel
                .strip_prefix("tenancy.idem.dev/shard-bucket in (")
                .and_then(|v| v.strip_suffix(')'))
                .unwrap();
            for v in values.split(',') {
                let b: usize = v.parse().unwrap();
                assert!(
                    r.contains((b as u64) << 56),
                    "{m} selects bucket {b} it does not own"
                );
                seen[b] += 1;
            }
            assert_eq!(values.split(',').count(), r.buckets().count());
            assert!(sel.len() < 1024, "{} bytes", sel.len());
        }
        assert!(
            seen.iter().all(|n| *n == 1),
            "every bucket selected by exactly one member"
        );
        let none = ring.ranges_of("not-a-member");
        assert_eq!(none.label_selector("b").unwrap(), "b in (none)");
        for h in [0, 1 << 56, u64::MAX] {
            assert_eq!(bucket_of(h), (h >> 56) as usize);
        }
    }

    #[test]
    fn selectors_cover_the_owned_ranges() {
        assert_eq!(
            Ranges::all().selector(ShardField::Uid).unwrap(),
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')"
        );
        let ring = Ring::new(names(3));
        let r = ring.ranges_of("idem-operator-1");
        let sel = r.selector(ShardField::Namespace).unwrap();
        assert_eq!(sel.matches("shardRange(").count(), r.intervals().len());
        assert!(sel.starts_with("shardRange(object.metadata.namespace, '0x"));
        assert!(sel.len() < 8 * 1024, "{} bytes", sel.len());
        assert_eq!(
            ring.ranges_of("not-a-member").selector(ShardField::Uid),
            None
        );
        assert_eq!(Ring::new(Vec::<String>::new()).owner_of(7), None);
        assert_eq!(
            Ring::new(["b", "a", "b"]).version(),
            Ring::new(["a", "b"]).version()
        );
    }
}
