//! Which objects the child caches keep whole: those idem made, known from what only idem
//! writes.
//!
//! A child watch selects by label, and labels, ownerReferences and `managedFields` can be
//! written by anyone allowed to create the kind where the children live (a tenant owner in the
//! tenant's namespaces; the owner's uid is visible on every child). What only idem writes is
//! the record of the children each owner's reconciles created, in the owner's status
//! ([`crate::apply::record`]), and the answers the API server gives to the engine's own
//! writes. So an object is trusted when its uid is in the record of an owner in the
//! controller's primary cache, or when the engine created it (or judged it its own at a
//! desired name, where it applies to it and records it) in this process.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use crate::key::ObjectKey;

/// Most process-local entries (children created or judged ours by this process and not yet
/// seen in a record); past it all are dropped (a child that loses its entry is read once from
/// the API server and trusted again).
const OWN_CAP: usize = 10_000;

/// The uids of idem's children; shared by a controller's primary watch (the records), the
/// apply engine (its writes) and the child stores (which ask).
#[derive(Debug, Default)]
pub(crate) struct Trust {
    inner: Mutex<Inner>,
    /// The field managers the engine writes children as: what their entries own is idem's
    /// (see [`super::foreign`]).
    managers: RwLock<BTreeSet<String>>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Per owner, the uids in its record.
    records: HashMap<ObjectKey, Vec<Arc<str>>>,
    /// The uids of every record, with the number of records holding each. Its keys are the
    /// one copy of each uid that `records` hold.
    recorded: HashMap<Arc<str>, usize>,
    /// Children this process created or judged its own and no record holds yet, by uid, with
    /// their key: a record that comes to hold a uid takes its place.
    own: HashMap<Arc<str>, ObjectKey>,
}

impl Inner {
    /// The copy of `uid` the records hold, or a new one.
    fn uid(&self, uid: &str) -> Arc<str> {
        self.recorded
            .get_key_value(uid)
            .map_or_else(|| Arc::from(uid), |(shared, _)| Arc::clone(shared))
    }

    fn unrecord(&mut self, uids: Vec<Arc<str>>) {
        for uid in uids {
            if let Some(n) = self.recorded.get_mut(&uid) {
                *n -= 1;
                if *n == 0 {
                    self.recorded.remove(&uid);
                }
            }
        }
    }
}

impl Trust {
    /// `owner`'s record now holds `uids`.
    pub(crate) fn set_record(&self, owner: &ObjectKey, uids: Vec<String>) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let mut uids: Vec<Arc<str>> = uids.iter().map(|u| inner.uid(u)).collect();
        uids.sort();
        uids.dedup();
        if inner.records.get(owner) == Some(&uids) {
            return;
        }
        for uid in &uids {
            *inner.recorded.entry(uid.clone()).or_default() += 1;
            inner.own.remove(uid);
        }
        if let Some(old) = inner.records.insert(owner.clone(), uids) {
            inner.unrecord(old);
        }
    }

    /// `owner` is gone (its record with it).
    pub(crate) fn drop_record(&self, owner: &ObjectKey) {
        if let Ok(mut inner) = self.inner.lock()
            && let Some(old) = inner.records.remove(owner)
        {
            inner.unrecord(old);
        }
    }

    /// Keeps the records of the owners for which `listed` holds (after a relist of the owners).
    pub(crate) fn retain_records(&self, listed: impl Fn(&ObjectKey) -> bool) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let gone: Vec<ObjectKey> = inner
            .records
            .keys()
            .filter(|k| !listed(k))
            .cloned()
            .collect();
        for owner in gone {
            if let Some(old) = inner.records.remove(&owner) {
                inner.unrecord(old);
            }
        }
    }

    /// The engine created `child` with `uid`, or judged the object `uid` at `child` its own.
    pub(crate) fn own(&self, child: &ObjectKey, uid: &str) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if inner.recorded.contains_key(uid) {
            return;
        }
        if inner.own.len() >= OWN_CAP && !inner.own.contains_key(uid) {
            inner.own.clear();
        }
        inner.own.insert(Arc::from(uid), child.clone());
    }

    /// The object `uid` at `child` was deleted.
    pub(crate) fn deleted(&self, child: &ObjectKey, uid: &str) {
        if let Ok(mut inner) = self.inner.lock()
            && inner.own.get(uid) == Some(child)
        {
            inner.own.remove(uid);
        }
    }

    /// The engine writes children as field manager `manager`.
    pub(crate) fn note_manager(&self, manager: &str) {
        let known = self.managers.read().is_ok_and(|m| m.contains(manager));
        if !known && let Ok(mut m) = self.managers.write() {
            m.insert(manager.to_owned());
        }
    }

    /// The field managers the engine writes children as, so far.
    pub(crate) fn managers(&self) -> BTreeSet<String> {
        self.managers.read().map(|m| m.clone()).unwrap_or_default()
    }

    /// Whether `obj`, one of idem's children, holds few enough bytes that none of idem's field
    /// managers owns to be cached whole ([`super::foreign::within_bound`]).
    pub(crate) fn within_bound(&self, obj: &serde_json::Value) -> bool {
        let Ok(managers) = self.managers.read() else {
            return false;
        };
        super::foreign::within_bound(obj, |m| managers.contains(m))
    }

    /// Whether the object `uid` at `child` is one of idem's children.
    pub(crate) fn is_ours(&self, child: &ObjectKey, uid: &str) -> bool {
        self.inner.lock().is_ok_and(|inner| {
            inner.recorded.contains_key(uid) || inner.own.get(uid) == Some(child)
        })
    }

    /// Uids held (in records and process-local entries), for tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner
            .lock()
            .map(|i| i.recorded.len() + i.own.len())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::namespaced("ConfigMap", "ns", name)
    }

    #[test]
    fn a_uid_is_trusted_while_a_record_holds_it() {
        let trust = Trust::default();
        let (a, b) = (
            ObjectKey::cluster("Tenant", "a"),
            ObjectKey::cluster("Tenant", "b"),
        );
        trust.set_record(&a, vec!["u1".into(), "u2".into()]);
        trust.set_record(&b, vec!["u2".into()]);
        assert!(trust.is_ours(&key("x"), "u1") && trust.is_ours(&key("y"), "u2"));
        trust.set_record(&a, vec!["u2".into()]);
        assert!(!trust.is_ours(&key("x"), "u1"), "dropped from a's record");
        trust.drop_record(&b);
        assert!(trust.is_ours(&key("y"), "u2"), "a's record still holds it");
        trust.retain_records(|k| k != &a);
        assert!(!trust.is_ours(&key("y"), "u2"));
        assert_eq!(trust.len(), 0);
    }

    #[test]
    fn an_own_uid_is_trusted_at_its_key_until_that_object_is_deleted() {
        let trust = Trust::default();
        trust.own(&key("x"), "u1");
        assert!(trust.is_ours(&key("x"), "u1"));
        assert!(
            !trust.is_ours(&key("x"), "u2"),
            "another object at that name"
        );
        trust.deleted(&key("x"), "u2"); // an older object's delete event
        assert!(trust.is_ours(&key("x"), "u1"));
        trust.deleted(&key("x"), "u1");
        assert!(!trust.is_ours(&key("x"), "u1"));
    }

    #[test]
    fn a_uid_is_held_once_however_many_places_name_it() {
        let trust = Trust::default();
        let (a, b) = (
            ObjectKey::cluster("Tenant", "a"),
            ObjectKey::cluster("Tenant", "b"),
        );
        trust.set_record(&a, vec!["u1".into()]);
        trust.set_record(&b, vec!["u1".into()]);
        let inner = trust.inner.lock().unwrap();
        let held = |owner: &ObjectKey| Arc::clone(&inner.records[owner][0]);
        assert!(Arc::ptr_eq(&held(&a), &held(&b)));
    }

    #[test]
    fn a_record_takes_the_place_of_the_process_local_entry() {
        let trust = Trust::default();
        trust.own(&key("x"), "u1");
        trust.own(&key("y"), "u2");
        assert_eq!(trust.len(), 2);
        // The status write that records the child: held once, by the record.
        trust.set_record(&ObjectKey::cluster("Tenant", "a"), vec!["u1".into()]);
        assert_eq!(trust.len(), 2);
        assert!(trust.inner.lock().unwrap().own.len() == 1);
        // Judged its own again while recorded: nothing more is kept.
        trust.own(&key("x"), "u1");
        assert!(trust.inner.lock().unwrap().own.len() == 1);
        assert!(trust.is_ours(&key("x"), "u1") && trust.is_ours(&key("y"), "u2"));
        // Released from the record (pruned or let go): no longer trusted.
        trust.set_record(&ObjectKey::cluster("Tenant", "a"), vec![]);
        assert!(!trust.is_ours(&key("x"), "u1"));
    }

    #[test]
    fn own_entries_are_bounded() {
        let trust = Trust::default();
        trust.set_record(&ObjectKey::cluster("Tenant", "a"), vec!["u0".into()]);
        for i in 0..OWN_CAP + 10 {
            trust.own(&key(&format!("c{i}")), &format!("u{i}"));
        }
        assert!(trust.len() <= OWN_CAP + 1, "{}", trust.len());
        assert!(trust.is_ours(&key("other"), "u0"), "records are kept");
    }
}
