//! What a reconcile of an owner's children did: per child outcome, drift repaired, pruned.

use crate::compare::Drift;
use crate::key::ObjectKey;
use crate::status::Readiness;

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
    /// left alone; a later reconcile creates it anew once it is gone.
    Terminating,
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
    pub created: Vec<super::CreatedChild>,
    /// Uids of the children in [`ApplyReport::pruned`].
    pub pruned_uids: Vec<String>,
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

    /// The kstatus readiness this report implies: `Stalled` with reason `ChildNotOwned` when a
    /// desired child's name is taken by an object we do not own (it needs a human: delete or
    /// rename one of them); `Reconciling` with reason `ChildTerminating` while a desired child
    /// is still being deleted (requeue: it resolves by itself); otherwise `Ready` with reason
    /// `Reconciled` (the message names children recreated by this reconcile). Messages are
    /// stable for an unchanged outcome, so an unchanged reconcile leaves the status unchanged.
    pub fn readiness(&self) -> Readiness {
        let clashes: Vec<String> = self
            .not_owned()
            .map(|(k, why)| format!("{k} exists and is {why}"))
            .collect();
        let terminating: Vec<String> = self
            .children
            .iter()
            .filter(|(_, o)| *o == ChildOutcome::Terminating)
            .map(|(k, _)| k.to_string())
            .collect();
        if clashes.is_empty() && !terminating.is_empty() {
            return Readiness::Reconciling {
                reason: "ChildTerminating".to_owned(),
                message: format!(
                    "waiting for the deletion of {} to finish before creating it again",
                    terminating.join(", ")
                ),
            };
        }
        if clashes.is_empty() {
            let recreated: Vec<String> = self
                .children
                .iter()
                .filter(|(_, o)| matches!(o, ChildOutcome::Recreated { .. }))
                .map(|(k, _)| k.to_string())
                .collect();
            let mut message = format!("{} children up to date", self.children.len());
            if !recreated.is_empty() {
                message.push_str(&format!(
                    "; recreated {} (an immutable field changed)",
                    recreated.join(", ")
                ));
            }
            Readiness::Ready {
                reason: "Reconciled".to_owned(),
                message,
            }
        } else {
            Readiness::Stalled {
                reason: "ChildNotOwned".to_owned(),
                message: format!(
                    "not modifying objects this resource does not own: {}",
                    clashes.join("; ")
                ),
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_from_report() {
        let ok = ApplyReport {
            children: vec![(
                ObjectKey::namespaced("ConfigMap", "ns", "a"),
                ChildOutcome::Created,
            )],
            ..ApplyReport::default()
        };
        assert!(
            matches!(ok.readiness(), Readiness::Ready { ref reason, .. } if reason == "Reconciled")
        );
        assert!(ok.wrote());
        let clash = ApplyReport {
            children: vec![(
                ObjectKey::namespaced("ConfigMap", "ns", "a"),
                ChildOutcome::NotOwned {
                    reason: "not controlled by any owner".into(),
                },
            )],
            ..ApplyReport::default()
        };
        match clash.readiness() {
            Readiness::Stalled { reason, message } => {
                assert_eq!(reason, "ChildNotOwned");
                assert!(
                    message.contains("ConfigMap/ns/a exists and is not controlled"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(!clash.wrote());
        let terminating = ApplyReport {
            children: vec![(
                ObjectKey::namespaced("Service", "ns", "s"),
                ChildOutcome::Terminating,
            )],
            ..ApplyReport::default()
        };
        assert!(matches!(
            terminating.readiness(),
            Readiness::Reconciling { ref reason, .. } if reason == "ChildTerminating"
        ));
    }
}
