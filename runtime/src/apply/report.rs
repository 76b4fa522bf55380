//! What a reconcile of an owner's children did: per child outcome, drift repaired, pruned.

use super::record::{CreatedChild, RecordDelta};
use crate::compare::Drift;
use crate::key::ObjectKey;

/// What happened to one desired child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChildOutcome {
    /// Already converged: no request was made.
    Unchanged,
    /// Created (one `POST`, plus one `PATCH` moving the create's field ownership to our
    /// `Apply` entry so that later applies can remove fields).
    Created,
    /// Changed with one server-side apply.
    Applied,
    /// Deleted and created again because its kind opted in
    /// ([`DesiredChildren::allow_recreate`](super::DesiredChildren::allow_recreate)) and the
    /// apply was rejected as 422 Invalid (an immutable field changed).
    Recreated {
        /// The API server's reason for rejecting the apply.
        reason: String,
    },
    /// The child is being deleted (it has a `deletionTimestamp`, e.g. waiting on a finalizer):
    /// still in effect until it is gone, so what drifted in it is repaired in place (an
    /// immutable field is not: never recreated meanwhile); a later reconcile creates it anew
    /// once it is gone.
    Terminating {
        /// The finalizers it still has: what its deletion waits for (anyone who may edit the
        /// object can add one).
        finalizers: Vec<String>,
        /// Why what drifted in it was not repaired in place, in the API server's words: an
        /// immutable field, an admission webhook's, a policy's or authorization's refusal, or
        /// an object the write needs that is missing (404, e.g. a RoleBinding's ClusterRole).
        unrepaired: Option<String>,
    },
    /// An object with this name exists and is not controlled by the owner: left untouched.
    NotOwned {
        /// Who controls it instead, in words.
        reason: String,
    },
}

/// Drift of one child that another writer caused and the engine repaired: the desired body
/// was the one last applied (same fingerprint), so every difference was made by someone else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repair {
    /// The child.
    pub child: ObjectKey,
    /// The fields that had drifted, with the managers that changed them where recorded.
    pub drift: Vec<Drift>,
    /// The child's `resourceVersion` with the drift (before the repair), when known.
    pub resource_version: Option<String>,
}

impl Repair {
    /// The managers named in the drift, deduplicated, in order of appearance.
    pub fn managers(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for d in &self.drift {
            if let crate::compare::DriftKind::NotOwned { managers } = &d.kind {
                for m in managers {
                    if !out.contains(m) {
                        out.push(m.clone());
                    }
                }
            }
        }
        out
    }
}

impl Repair {
    /// The drifted fields' paths, comma-separated (e.g. `.subjects,.metadata.labels.app`).
    pub fn paths(&self) -> String {
        let paths: Vec<&str> = self.drift.iter().map(|d| d.path.as_str()).collect();
        paths.join(",")
    }
}

impl std::fmt::Display for Repair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.drift.iter().map(ToString::to_string).collect();
        write!(f, "{}: {}, restored", self.child, parts.join("; "))
    }
}

/// The result of reconciling an owner's children.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Each desired child and what happened to it, in the order they were desired.
    pub children: Vec<(ObjectKey, ChildOutcome)>,
    /// Children deleted because they were no longer desired.
    pub pruned: Vec<ObjectKey>,
    /// Children whose drift (made by another writer) was repaired.
    pub repaired: Vec<Repair>,
    /// Children this apply created, with the uids the API server gave them, and desired
    /// children of ours missing from the owner's record (for the owner's record, see
    /// [`super::record`]).
    pub created: Vec<CreatedChild>,
    /// Uids of the children in [`ApplyReport::pruned`] that are gone (and of recorded
    /// children found gone): they leave the owner's record.
    pub pruned_uids: Vec<String>,
    /// Recorded children no longer desired, deleted and still there (held by finalizers, which
    /// anyone who may edit an object can add, or by their kind's own wait: a Namespace waits
    /// for its contents), with their finalizers: still in effect until they are gone (a
    /// RoleBinding still grants), so they stay in the owner's record and the owner is not
    /// `Ready` meanwhile.
    pub pruning: Vec<(ObjectKey, Vec<String>)>,
    /// Objects of the pruned kinds that claim the owner (controller ownerReference and
    /// owner-uid label), desired or not, as listed for pruning.
    pub claiming: Vec<ObjectKey>,
    /// Children released instead of pruned or repaired: a child of a
    /// [`release_orphans`](super::DesiredChildren::release_orphans) kind in the owner's record
    /// whose ownerReference was removed, and undesired children in a namespace named by
    /// [`release_in`](super::DesiredChildren::release_in), from which the owner's
    /// ownerReferences and owner-uid label were removed. Kept, no longer the owner's: they
    /// leave its record.
    pub released: Vec<ObjectKey>,
    /// Uids of the children in [`ApplyReport::released`].
    pub released_uids: Vec<String>,
    /// Create-once children that were deleted and created anew with a new value, their kind
    /// being opted in with
    /// [`DesiredChildren::regenerate_deleted`](super::DesiredChildren::regenerate_deleted)
    /// (also in [`ApplyReport::children`] as [`ChildOutcome::Created`]).
    pub regenerated: Vec<ObjectKey>,
    /// Children the owner's record held that were found deleted (by someone else, or with
    /// their namespace) and were created again (also in [`ApplyReport::children`] as
    /// [`ChildOutcome::Created`]).
    pub remade: Vec<ObjectKey>,
    /// Objects that claim the owner, are not desired, and are not in the owner's record of
    /// children it created: left alone, never deleted (anyone who can create them can forge
    /// the claim; see [`super::record`]).
    pub unrecorded: Vec<ObjectKey>,
}

impl ApplyReport {
    /// Desired children that exist but belong to someone else.
    pub fn not_owned(&self) -> impl Iterator<Item = (&ObjectKey, &str)> {
        self.children.iter().filter_map(|(k, o)| match o {
            ChildOutcome::NotOwned { reason } => Some((k, reason.as_str())),
            _ => None,
        })
    }

    /// Whether any write was made.
    pub fn wrote(&self) -> bool {
        !self.pruned.is_empty()
            || self.children.iter().any(|(_, o)| {
                matches!(
                    o,
                    ChildOutcome::Created | ChildOutcome::Applied | ChildOutcome::Recreated { .. }
                )
            })
    }
}

impl RecordDelta {
    /// Adds what one apply found (see [`ApplyReport`]); `complete` when it succeeded.
    pub(crate) fn add(&mut self, report: &ApplyReport, complete: bool) {
        self.created.extend(report.created.iter().cloned());
        self.pruned.extend(report.pruned_uids.iter().cloned());
        self.released.extend(report.released_uids.iter().cloned());
        if !complete {
            self.failed = true;
        }
    }
}
