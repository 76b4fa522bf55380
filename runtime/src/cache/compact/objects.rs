//! A child kind's cached entries by name, indexed by the owner uids their labels carry, so an
//! owner's children are found without a scan of the kind's whole cache.

use std::collections::HashMap;
use std::sync::Arc;

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

/// The entries of one kind by name, and by the owner uids their labels carry.
///
/// An entry is indexed under each of its owner uids, as the text its template's values share
/// when it is one of them (as a uid of an owner kind known when the entry was made is, see
/// [`crate::cache::template`]), else as its own interned copy, which is then also kept beside the
/// entry (in `apart`) for its removal. [`Objects::owned`] therefore finds every entry that
/// carries an owner-uid label with `uid`, at the cost of that owner's children, not of the
/// kind's whole cache.
#[derive(Default)]
pub(super) struct Objects {
    by_name: HashMap<Name, Entry>,
    /// Names of the entries indexed under each uid.
    by_owner: HashMap<Arc<str>, Vec<Name>>,
    /// The owner uids of the entries that have some not among their template's values (where
    /// [`Objects::unindex`] looks for the others).
    apart: HashMap<Name, Box<[Arc<str>]>>,
}

impl Objects {
    /// The entry named `name`.
    pub(super) fn get(&self, name: &str) -> Option<&Entry> {
        self.by_name.get(name)
    }

    /// Entries held.
    pub(super) fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Stores `entry` at `name`, in place of the one there; `owners` are its owner uids
    /// ([`owner_uids`] of the object it was made from), interned in `interner` when they are
    /// not among its template's values.
    pub(super) fn insert(
        &mut self,
        name: Name,
        entry: Entry,
        owners: &[String],
        interner: &Interner,
    ) {
        self.unindex(&name);
        let mut apart = Vec::new();
        for uid in owners {
            let shared = match entry.text.values.iter().find(|v| ***v == **uid) {
                Some(shared) => Arc::clone(shared),
                None => {
                    let own = interner.intern(uid);
                    apart.push(Arc::clone(&own));
                    own
                }
            };
            self.by_owner.entry(shared).or_default().push(name.clone());
        }
        if !apart.is_empty() {
            self.apart.insert(name.clone(), apart.into_boxed_slice());
        }
        self.by_name.insert(name, entry);
    }

    /// Removes the entry at `name`.
    pub(super) fn remove(&mut self, name: &str) {
        self.unindex(name);
        self.by_name.remove(name);
    }

    /// Takes the entry at `name` out of the owner index (it stays stored).
    fn unindex(&mut self, name: &str) {
        let Some(old) = self.by_name.get(name) else {
            return;
        };
        let apart = self.apart.remove(name);
        // Indexed under values of its template, or under the uids kept apart.
        for v in old.text.values.iter().chain(apart.iter().flatten()) {
            if let Some(names) = self.by_owner.get_mut(v)
                && let Some(i) = names.iter().position(|n| &**n == name)
            {
                names.swap_remove(i);
                if names.is_empty() {
                    self.by_owner.remove(v);
                } else if names.capacity() > 2 * names.len() + 4 {
                    names.shrink_to_fit();
                }
            }
        }
    }

    /// The entries that carry an owner-uid label (of any owner kind) with value `uid`.
    pub(super) fn owned(&self, uid: &str) -> impl Iterator<Item = (&Name, &Entry)> {
        self.by_owner
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|n| self.by_name.get_key_value(n))
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
        (Entry::new(o.clone(), "n", false, interner), owners)
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
        let mut put = |objects: &mut Objects, name: &str, uids: &[(&str, &str)]| {
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
        // Nothing is left indexed under an owner without entries.
        assert!(!objects.by_owner.contains_key("u1"));
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
}
