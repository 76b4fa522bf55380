//! The record of the children an owner's reconciles created: the prune's only evidence that an
//! object is ours to delete.
//!
//! Rule: a child is pruned only when its `metadata.uid` is in the record. The record holds the
//! uids the API server returned to the engine's own `POST`s (and of desired children of ours it
//! lacks, see below), and lives in the owner's status,
//! which only the operator can write (`status` is a subresource; API conventions, "spec and
//! status"). Everything on the child itself — its controller ownerReference, the owner-uid and
//! managed-by labels, even our field manager's `managedFields` entries (a client names its own
//! `fieldManager`) — can be written by anyone allowed to create that kind in that namespace,
//! such as a tenant owner holding `admin` there; the owner's uid is visible on every child.
//! So an object that merely claims the owner is never deleted: it is reported
//! ([`ApplyReport::unrecorded`](super::ApplyReport::unrecorded), Event `NotPruned`) and left
//! alone. A record entry lost to a crash (between the `POST` and its answer, or before the
//! status write) is made good by the next pass: a *desired* child that carries the owner's
//! controller ownerReference but is missing from the record is recorded when the engine judges
//! or applies it (it holds our desired state at a name we chose). An object at a name that is
//! not desired is never applied to, so never recorded.
//!
//! The record grows only by creates and shrinks only by prunes (deleted, released, or found
//! gone by the API server), each applied to the record as stored when the status is written
//! (a conflict re-reads it and applies them again), never by writing back a copy: a pass
//! that read an older record, or whose caches do not show a child yet, cannot drop the entry
//! another pass added. An entry is never dropped for being unseen.

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::key::ObjectKey;

/// One child the engine created: its kind, namespace, name and the uid the API server gave it.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct CreatedChild {
    /// The child's kind, e.g. `RoleBinding`.
    pub kind: String,
    /// The child's namespace; absent for cluster-scoped kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The child's name.
    pub name: String,
    /// The child's `metadata.uid`, as returned by the create.
    pub uid: String,
}

impl CreatedChild {
    /// The record entry of `key` created with `uid`.
    pub fn new(key: &ObjectKey, uid: &str) -> Self {
        Self {
            kind: key.kind.to_string(),
            namespace: key.namespace.as_ref().map(ToString::to_string),
            name: key.name.to_string(),
            uid: uid.to_owned(),
        }
    }

    /// The child's key.
    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            kind: self.kind.as_str().into(),
            namespace: self.namespace.as_deref().map(Into::into),
            name: self.name.as_str().into(),
        }
    }
}

/// What the passes of one reconcile change in the record: children created, children pruned
/// (or found gone) and children released.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordDelta {
    /// Children created (their uids from the create's answer).
    pub created: Vec<CreatedChild>,
    /// Uids of children deleted by the prune (or found gone by the API server).
    pub pruned: BTreeSet<String>,
    /// Uids of children released ([`super::ApplyReport::released`]); they leave the record
    /// only when every apply of the reconcile succeeded, so that a released namespace stays
    /// recorded (and released again) until the release of its contents has completed.
    pub released: BTreeSet<String>,
    /// An apply of this reconcile failed: released entries stay.
    pub(super) failed: bool,
}

impl RecordDelta {
    /// Whether applying this delta to any record changes nothing but the leaving of released
    /// entries (dropped only by a successful reconcile's status write).
    pub fn is_empty(&self) -> bool {
        self.created.is_empty() && self.pruned.is_empty()
    }

    /// Applies the delta to `record` (the record as stored now): pruned uids go, released ones
    /// too unless an apply failed; a created child replaces any entry of the same key (the
    /// server accepted its create, so the old object is gone: a key holds one object). No
    /// other entry goes, whatever the pass saw. The result is sorted.
    pub fn apply_to(&self, record: &mut Vec<CreatedChild>) {
        record.retain(|c| !self.pruned.contains(&c.uid));
        if !self.failed {
            record.retain(|c| !self.released.contains(&c.uid));
        }
        for new in &self.created {
            record.retain(|c| c.key() != new.key());
            record.push(new.clone());
        }
        record.sort();
        record.dedup();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(name: &str, uid: &str) -> CreatedChild {
        CreatedChild::new(&ObjectKey::namespaced("RoleBinding", "ns", name), uid)
    }

    #[test]
    fn a_created_child_replaces_the_entry_of_its_key_and_pruned_uids_go() {
        let mut record = vec![child("a", "1"), child("b", "2")];
        let delta = RecordDelta {
            created: vec![child("a", "3")],
            pruned: ["2".to_owned()].into(),
            ..RecordDelta::default()
        };
        delta.apply_to(&mut record);
        assert_eq!(record, vec![child("a", "3")]);
    }

    #[test]
    fn an_entry_is_never_dropped_for_being_unseen() {
        // A pass whose caches do not show a child yet (or that read an older record) reports
        // neither it nor a prune of it: its entry, added by another pass, stays.
        let ns = CreatedChild::new(&ObjectKey::cluster("Namespace", "t-y"), "9");
        let mut record = vec![child("a", "1"), ns.clone()];
        let mut delta = RecordDelta::default();
        delta.add(&crate::apply::ApplyReport::default(), true);
        delta.apply_to(&mut record);
        assert_eq!(record, vec![ns, child("a", "1")]);
    }

    #[test]
    fn released_entries_leave_the_record_only_after_a_reconcile_without_failure() {
        let report = crate::apply::ApplyReport {
            released_uids: vec!["1".to_owned()],
            ..crate::apply::ApplyReport::default()
        };
        let mut ok = RecordDelta::default();
        ok.add(&report, true);
        let mut record = vec![child("a", "1"), child("b", "2")];
        ok.apply_to(&mut record);
        assert_eq!(record, vec![child("b", "2")]);

        // An apply after the release failed: the released entry stays, so the next
        // reconcile releases again (e.g. a released namespace's contents).
        let mut failed = RecordDelta::default();
        failed.add(&report, true);
        failed.add(&crate::apply::ApplyReport::default(), false);
        let mut record = vec![child("a", "1")];
        failed.apply_to(&mut record);
        assert_eq!(record, vec![child("a", "1")]);
    }

    #[test]
    fn after_a_failed_apply_nothing_is_dropped_for_being_unseen() {
        let report = crate::apply::ApplyReport::default();
        let mut delta = RecordDelta::default();
        delta.add(&report, false);
        delta.add(&report, true);
        let mut record = vec![child("a", "1")];
        delta.apply_to(&mut record);
        assert_eq!(record, vec![child("a", "1")]);
    }
}
