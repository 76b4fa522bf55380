//! A child kind's cached entries by name, indexed by the owner uids their labels carry, so an
//! owner's children are found without a scan of the kind's whole cache.

use std::collections::HashMap;
use std::sync::Arc;

use hashbrown::HashTable;

use serde_json::Value;

use super::{Entry, Interner, Name};

/// The label-key ending of every owner kind's owner-uid label ([`crate::labels::Labels::owner_uid`]
/// is `<prefix>/owner-uid`, whatever the prefix).
const OWNER_UID_SUFFIX: &str = "/owner-uid";

/// The distinct values of the owner-uid labels (of any prefix) of `obj`.
pub(super) fn owner_uids(obj: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
    for (k, v) in labels.into_iter().flatten() {
        if let (true, Some(v)) = (k.ends_with(OWNER_UID_SUFFIX), v.as_str())
            && !out.iter().any(|o| o == v)
        {
            out.push(v.to_owned());
        }
    }
    out
}

/// A 32-bit hash of `s`, with a seed drawn once per process: the index keeps these for the
/// process's life only, and a seed nobody outside knows keeps tenants from crafting names or
/// uids that collide (one long probe sequence per watch event).
fn h32(s: &str) -> u32 {
    use std::hash::BuildHasher;
    static SEED: std::sync::LazyLock<u64> = std::sync::LazyLock::new(rand::random);
    let h = foldhash::fast::FixedState::with_seed(*SEED).hash_one(s);
    (h ^ (h >> 32)) as u32
}

/// The table hash of a 32-bit hash: its bits spread over the 64 the table reads (the bucket
/// from the low ones, the tag from the top seven).
fn spread(h: u32) -> u64 {
    u64::from(h).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The entries of one kind by name, and by the owner uids their labels carry.
///
/// The entries lie side by side in `slots`, and the name table holds only their positions
/// (4 bytes a bucket): a hash table keeps between an eighth and over half of its buckets free,
/// and an entry inline in each (about 100 bytes) would cost that much again per child. The
/// slots grow by an eighth at a time (`grow`) and give back room once half of it is free.
///
/// The owner index holds one pair of 32-bit hashes, the owner uid's and the name's, per owner
/// uid of an entry (8 bytes, not a copy of the name): [`Objects::owned`] goes from a uid to
/// the pairs hashed alike, and from each name hash to the entries whose names hash alike, so
/// it finds every entry that carries an owner-uid label with `uid` (and, rarely, an entry
/// whose hashes collide with one, which its callers drop: they check the label), at the cost
/// of that owner's children, not of the kind's whole cache.
///
/// An entry's owner uids are found again, to take its pairs out, among its template's values
/// (where an owner kind's owner-uid label value is, see [`crate::cache::template`]); an entry
/// with an owner uid that is not (one JSON escapes, or the label of an owner kind not known
/// when the entry was made) keeps those uids in `apart`.
#[derive(Default)]
pub(super) struct Objects {
    /// Positions in `slots`, hashed by the entry's name.
    by_name: HashTable<u32>,
    slots: Vec<(Name, Entry)>,
    /// `(h32(owner uid), h32(name))`, hashed by the first.
    by_owner: HashTable<(u32, u32)>,
    /// The owner uids of the entries that have some not among their template's values.
    apart: HashMap<Name, Box<[Arc<str>]>>,
}

/// The table hash of the entry at `at`.
fn hash_at(slots: &[(Name, Entry)], at: u32) -> u64 {
    spread(h32(&slots[at as usize].0))
}

impl Objects {
    /// The position of the entry named `name`.
    fn position(&self, name: &str) -> Option<u32> {
        let slots = &self.slots;
        self.by_name
            .find(spread(h32(name)), |&at| &*slots[at as usize].0 == name)
            .copied()
    }

    /// The entry named `name`.
    pub(super) fn get(&self, name: &str) -> Option<&Entry> {
        self.position(name).map(|at| &self.slots[at as usize].1)
    }

    /// Entries held.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Room for one more slot: an eighth more at a time (at least 4), not twice as many.
    fn grow(&mut self) {
        if self.slots.len() == self.slots.capacity() {
            self.slots.reserve_exact((self.slots.len() / 8).max(4));
        }
    }

    /// Stores `entry` at `name`, in place of the one there (returned); `owners` are its owner
    /// uids ([`owner_uids`] of the object it was made from), interned in `interner` when they
    /// are not among its template's values.
    ///
    /// # Panics
    /// With 2^32 entries (positions are 32-bit).
    pub(super) fn insert(
        &mut self,
        name: Name,
        entry: Entry,
        owners: &[String],
        interner: &Interner,
    ) -> Option<Entry> {
        let old = self.remove(&name);
        let nh = h32(&name);
        let mut apart = Vec::new();
        for uid in owners {
            if !entry.text.values.iter().any(|v| **v == **uid) {
                apart.push(interner.intern(uid));
            }
            let oh = h32(uid);
            self.by_owner
                .insert_unique(spread(oh), (oh, nh), |(o, _)| spread(*o));
        }
        if !apart.is_empty() {
            self.apart.insert(name.clone(), apart.into_boxed_slice());
        }
        self.grow();
        let at = u32::try_from(self.slots.len()).expect("fewer than 2^32 entries of a kind");
        self.slots.push((name, entry));
        let slots = &self.slots;
        self.by_name
            .insert_unique(spread(nh), at, |&i| hash_at(slots, i));
        old
    }

    /// Removes the entry at `name` and returns it.
    pub(super) fn remove(&mut self, name: &str) -> Option<Entry> {
        let nh = h32(name);
        let slots = &self.slots;
        let Ok(found) = self
            .by_name
            .find_entry(spread(nh), |&at| &*slots[at as usize].0 == name)
        else {
            return None;
        };
        let (at, _) = found.remove();
        // The last slot moves into the freed one: its position in the table follows.
        let last = u32::try_from(self.slots.len() - 1).expect("positions are 32-bit");
        if at != last {
            let moved = hash_at(&self.slots, last);
            if let Some(p) = self.by_name.find_mut(moved, |&i| i == last) {
                *p = at;
            }
        }
        let (_, old) = self.slots.swap_remove(at as usize);
        if self.slots.capacity() > 8 && self.slots.len() < self.slots.capacity() / 2 {
            let keep = self.slots.len() + self.slots.len() / 8;
            self.slots.shrink_to(keep);
        }
        let apart = self.apart.remove(name);
        // Its pairs: one per owner uid, each among its template's values or kept apart.
        let mut owners: Vec<&str> = old.text.values.iter().map(|v| &**v).collect();
        owners.extend(apart.iter().flatten().map(|v| &**v));
        for uid in owners {
            let oh = h32(uid);
            if let Ok(pair) = self.by_owner.find_entry(spread(oh), |p| *p == (oh, nh)) {
                pair.remove();
            }
        }
        Some(old)
    }

    /// Every entry, with its name.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&Name, &Entry)> {
        self.slots.iter().map(|(n, e)| (n, e))
    }

    /// The entries that may carry an owner-uid label (of any owner kind) with value `uid`:
    /// every one that does, each once.
    pub(super) fn owned(&self, uid: &str) -> impl Iterator<Item = (&Name, &Entry)> {
        let oh = h32(uid);
        let mut names: Vec<u32> = self
            .by_owner
            .iter_hash(spread(oh))
            .filter(|(o, _)| *o == oh)
            .map(|(_, n)| *n)
            .collect();
        names.sort_unstable();
        names.dedup();
        names.into_iter().flat_map(move |nh| {
            self.by_name
                .iter_hash(spread(nh))
                .map(|&at| &self.slots[at as usize])
                .filter(move |(n, _)| h32(n) == nh)
                .map(|(n, e)| (n, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::labels::{Labels, OWNER_UID_LABEL};

    fn obj(uids: &[(&str, &str)]) -> Value {
        let labels: serde_json::Map<String, Value> = uids
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        json!({"metadata": {"labels": labels}})
    }

    /// An entry made from `o` as the store makes it, and its owner uids.
    fn entry(o: &Value, interner: &Interner) -> (Entry, Vec<String>) {
        let owners = owner_uids(o);
        (
            Entry::new(o.clone(), "n", false, interner, Default::default()),
            owners,
        )
    }

    fn owned(objects: &Objects, uid: &str) -> Vec<String> {
        let mut v: Vec<String> = objects.owned(uid).map(|(n, _)| n.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn owner_uids_are_the_distinct_owner_uid_labels_of_any_prefix() {
        let o = obj(&[
            ("a.example/owner-uid", "u1"),
            ("b.example/owner-uid", "u1"),
            ("c.example/owner-uid", "u2"),
            ("a.example/tenant", "u3"),
        ]);
        let mut got = owner_uids(&o);
        got.sort();
        assert_eq!(got, ["u1", "u2"]);
        assert!(owner_uids(&json!({"metadata": {}})).is_empty());
    }

    #[test]
    fn an_owner_finds_exactly_its_entries_through_replaces_and_removes() {
        let interner = Interner::default();
        let mut objects = Objects::default();
        let put = |objects: &mut Objects, name: &str, uids: &[(&str, &str)]| {
            let (e, owners) = entry(&obj(uids), &interner);
            objects.insert(name.into(), e, &owners, &interner);
        };
        let (x, y) = (
            OWNER_UID_LABEL,
            Labels::with_prefix("y.example").owner_uid(),
        );
        put(&mut objects, "a", &[(x, "u1")]);
        put(&mut objects, "b", &[(x, "u1"), (y, "u2")]);
        put(&mut objects, "c", &[(x, "u2")]);
        put(&mut objects, "d", &[]);
        // Known owner kinds' uids are their templates' values: nothing is kept apart.
        assert!(objects.apart.is_empty());
        assert_eq!(owned(&objects, "u1"), ["a", "b"]);
        assert_eq!(owned(&objects, "u2"), ["b", "c"]);
        // A replace that changes the owner moves the entry; one that keeps it keeps it once.
        put(&mut objects, "a", &[(x, "u2")]);
        put(&mut objects, "c", &[(x, "u2")]);
        assert_eq!(owned(&objects, "u1"), ["b"]);
        assert_eq!(owned(&objects, "u2"), ["a", "b", "c"]);
        objects.remove("b");
        objects.remove("zz");
        assert_eq!(owned(&objects, "u1"), Vec::<String>::new());
        assert_eq!(owned(&objects, "u2"), ["a", "c"]);
        assert_eq!(objects.len(), 3);
        // One pair per owner uid of each entry left: a's and c's.
        assert_eq!(objects.by_owner.len(), 2);
    }

    #[test]
    fn an_owner_uid_the_template_does_not_replace_is_indexed_all_the_same() {
        let interner = Interner::default();
        let mut objects = Objects::default();
        // A value JSON escapes is never a template value; neither is the uid in a label of a
        // prefix no owner kind has yet (a child listed before its owner kind's first use).
        let odd = "u\"1";
        let (e, owners) = entry(&obj(&[(OWNER_UID_LABEL, odd)]), &interner);
        objects.insert("odd".into(), e, &owners, &interner);
        let unknown = "unknown.example/owner-uid";
        let (e, owners) = entry(&obj(&[(unknown, "u2"), (OWNER_UID_LABEL, "u3")]), &interner);
        objects.insert("plain".into(), e, &owners, &interner);
        assert_eq!(objects.apart.len(), 2);
        assert_eq!(owned(&objects, odd), ["odd"]);
        assert_eq!(owned(&objects, "u2"), ["plain"]);
        assert_eq!(owned(&objects, "u3"), ["plain"]);
        let (e, owners) = entry(&obj(&[(unknown, "u4")]), &interner);
        objects.insert("plain".into(), e, &owners, &interner);
        assert_eq!(owned(&objects, "u2"), Vec::<String>::new());
        assert_eq!(owned(&objects, "u3"), Vec::<String>::new());
        assert_eq!(owned(&objects, "u4"), ["plain"]);
        objects.remove("odd");
        objects.remove("plain");
        assert!(objects.apart.is_empty() && objects.by_owner.is_empty());
    }

    #[test]
    fn entries_stay_found_as_others_move_into_freed_slots() {
        let interner = Interner::default();
        let mut objects = Objects::default();
        let names: Vec<String> = (0..200).map(|i| format!("ns-{i}/child")).collect();
        for (i, name) in names.iter().enumerate() {
            let uid = format!("u{}", i % 7);
            let (e, owners) = entry(&obj(&[(OWNER_UID_LABEL, &uid)]), &interner);
            objects.insert(name.as_str().into(), e, &owners, &interner);
        }
        // Room grows by an eighth, not by doubling.
        assert!(objects.slots.capacity() < 200 + 200 / 8 + 4);
        // Removing from the front, the middle and the end moves the last entry each time.
        for name in names.iter().step_by(3) {
            assert!(objects.remove(name).is_some());
        }
        assert_eq!(objects.len(), 200 - 67);
        for (i, name) in names.iter().enumerate() {
            assert_eq!(objects.get(name).is_some(), i % 3 != 0, "{name}");
        }
        let listed: std::collections::BTreeSet<String> =
            objects.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(listed.len(), objects.len());
        let u3: Vec<String> = owned(&objects, "u3");
        let expected: Vec<String> = {
            let mut v: Vec<String> = (0..200)
                .filter(|i| i % 7 == 3 && i % 3 != 0)
                .map(|i| names[i].clone())
                .collect();
            v.sort();
            v
        };
        assert_eq!(u3, expected);
        // Once most are gone, the room left goes back.
        for name in names
            .iter()
            .skip(1)
            .step_by(3)
            .chain(names.iter().skip(2).step_by(3))
        {
            objects.remove(name);
        }
        assert_eq!(objects.len(), 0);
        assert!(
            objects.slots.capacity() <= 8,
            "{}",
            objects.slots.capacity()
        );
        assert!(objects.by_owner.is_empty());
    }
}
