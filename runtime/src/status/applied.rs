//! The readiness an apply implies for its owner: the status layer's reading of an
//! [`ApplyReport`].

use super::Readiness;
use crate::apply::{ApplyReport, ChildOutcome};

impl ApplyReport {
    /// The kstatus readiness this report implies: `Stalled` with reason `ChildNotOwned` when a
    /// desired child's name is taken by an object we do not own (it needs a human: delete or
    /// rename one of them); `Reconciling` with reason `ChildTerminating` while a desired child
    /// is still being deleted, or an undesired one is still there being deleted (held by
    /// finalizers, or a Namespace waiting for its contents: still in effect) (requeue: it
    /// resolves by itself); otherwise `Ready` with reason
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
            .filter_map(|(k, o)| match o {
                ChildOutcome::Terminating {
                    finalizers,
                    unrepaired,
                } => {
                    let mut s = with_finalizers(k, finalizers);
                    if let Some(why) = unrepaired {
                        s.push_str(&format!(", not repaired meanwhile: {why}"));
                    }
                    Some(s)
                }
                _ => None,
            })
            .collect();
        let held: Vec<String> = (self.pruning.iter())
            .map(|(k, finalizers)| with_finalizers(k, finalizers))
            .collect();
        if clashes.is_empty() && (!terminating.is_empty() || !held.is_empty()) {
            let mut waits = Vec::new();
            if !terminating.is_empty() {
                waits.push(format!(
                    "the deletion of {} to finish before creating it again",
                    terminating.join(", ")
                ));
            }
            if !held.is_empty() {
                waits.push(format!(
                    "the deletion of {}, no longer desired, to finish",
                    held.join(", ")
                ));
            }
            return Readiness::Reconciling {
                reason: "ChildTerminating".to_owned(),
                message: format!("waiting for {}", waits.join("; and for ")),
            };
        }
        if clashes.is_empty() {
            let recreated: Vec<String> = self
                .children
                .iter()
                .filter(|(_, o)| matches!(o, ChildOutcome::Recreated { .. }))
                .map(|(k, _)| k.to_string())
                .collect();
            let mut message = match self.children.len() {
                1 => "1 child up to date".to_owned(),
                n => format!("{n} children up to date"),
            };
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
                    "not modifying objects this resource does not own (to hand one over, give it this object's controller ownerReference; deleted, it is made anew): {}",
                    clashes.join("; ")
                ),
            }
        }
    }
}

/// `key`, with the finalizers that hold its deletion when it has any.
fn with_finalizers(key: &crate::key::ObjectKey, finalizers: &[String]) -> String {
    if finalizers.is_empty() {
        key.to_string()
    } else {
        format!("{key} (finalizers: {})", finalizers.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::ObjectKey;

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
                ChildOutcome::Terminating {
                    finalizers: vec!["example.com/hold".into()],
                    unrepaired: None,
                },
            )],
            ..ApplyReport::default()
        };
        assert_eq!(
            terminating.readiness(),
            Readiness::Reconciling {
                reason: "ChildTerminating".into(),
                message: "waiting for the deletion of Service/ns/s (finalizers: example.com/hold) \
                          to finish before creating it again"
                    .into()
            }
        );
    }
}
