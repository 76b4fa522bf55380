//! A Tenant's status from what the reconcile saw: namespaces it owns, and kstatus readiness
//! (`NamespaceConflict`, `NamespaceTerminating`, `ChildNotOwned`; the reconcile adds `Paused`, the
//! driver `ReconcileFailed`).

use idem_runtime::prelude::*;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};

/// What the namespace pass found.
#[derive(Debug, Default, PartialEq)]
pub struct NamespacePass {
    /// Namespaces the tenant owns and that are usable, sorted.
    pub owned: Vec<String>,
    /// Namespaces whose name is taken by an object the tenant does not own, with why.
    pub conflicts: Vec<(String, String)>,
    /// Namespaces being deleted (e.g. removed and re-added); their contents wait.
    pub terminating: Vec<String>,
    /// Those of [`NamespacePass::terminating`] whose repair in place the API server refused
    /// (an admission policy on their labels), with its words.
    pub unrepaired: Vec<(String, String)>,
    /// Namespaces of the tenant's record released in this pass: an administrator removed
    /// their ownerReference, or they left the spec under `deletionPolicy: Retain`
    /// ([`NamespacePass::retained`]). They and their contents are kept, no longer managed.
    pub released: Vec<String>,
    /// Those of [`NamespacePass::released`] that left the spec (kept by `deletionPolicy:
    /// Retain`), sorted.
    pub retained: Vec<String>,
    /// Namespaces no longer desired, deleted and still there (waiting for their contents, or
    /// held by finalizers), with those finalizers: what is in them is still in effect until
    /// they are gone.
    pub held: Vec<(String, Vec<String>)>,
}

impl NamespacePass {
    /// Sorts the namespace pass's report into owned, conflicting and terminating namespaces.
    pub fn from_report(report: &ApplyReport) -> Self {
        let mut pass = Self::default();
        for (key, outcome) in &report.children {
            let name = key.name.to_string();
            match outcome {
                ChildOutcome::NotOwned { reason } => pass.conflicts.push((name, reason.clone())),
                ChildOutcome::Terminating { unrepaired, .. } => {
                    if let Some(why) = unrepaired {
                        pass.unrepaired.push((name.clone(), why.clone()));
                    }
                    pass.terminating.push(name);
                }
                _ => pass.owned.push(name),
            }
        }
        pass.released = report.released.iter().map(|k| k.name.to_string()).collect();
        pass.retained = (report.released.iter())
            .filter(|k| !report.children.iter().any(|(desired, _)| desired == *k))
            .map(|k| k.name.to_string())
            .collect();
        pass.retained.sort();
        pass.held = (report.pruning.iter())
            .map(|(k, finalizers)| (k.name.to_string(), finalizers.clone()))
            .collect();
        pass.owned.sort();
        pass.released.sort();
        pass
    }

    /// Namespaces leaving the tenant and still there, sorted: being deleted while desired
    /// ([`NamespacePass::terminating`]) or no longer desired ([`NamespacePass::held`]). What
    /// is in them still counts against its quotas until they are gone.
    pub fn leaving(&self) -> Vec<String> {
        let mut names: Vec<String> = (self.terminating.iter().cloned())
            .chain(self.held.iter().map(|(ns, _)| ns.clone()))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// As [`NamespacePass::not_ours`], and the namespaces of `recorded` (where the tenant's
    /// record holds children) that it neither owns nor is deleting (`leaving`): one released
    /// or retained by an earlier pass whose contents were not all released yet (that pass
    /// failed) still has them released, never pruned.
    pub fn not_ours_of<'a>(
        &self,
        recorded: impl Iterator<Item = &'a str>,
        leaving: &[String],
    ) -> Vec<String> {
        let mut names = self.not_ours();
        for ns in recorded {
            let ours = self.owned.iter().chain(leaving).any(|o| o == ns);
            if !ours && !names.iter().any(|n| n == ns) {
                names.push(ns.to_owned());
            }
        }
        names.sort();
        names
    }

    /// Namespaces the tenant does not control whose contents of ours, if any, are released
    /// rather than pruned: the ones released in this pass, and the desired ones someone else
    /// controls (never delete what we made in a namespace that is not ours any more).
    pub fn not_ours(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .released
            .iter()
            .chain(self.conflicts.iter().map(|(ns, _)| ns))
            .cloned()
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// The readiness of a reconciled tenant.
///
/// A namespace conflict wins (it needs a human and the other tenant keeps the namespace), then
/// a terminating namespace (wait), then the readiness of the namespace contents, then a
/// namespace no longer desired still being deleted (wait: what is in it is still in effect).
/// Such a namespace is named whatever comes first, so that an administrator sees every hold at
/// once.
pub fn readiness(pass: &NamespacePass, contents: &ApplyReport) -> Readiness {
    let held = (!pass.held.is_empty()).then(|| {
        (pass.held.iter())
            .map(|(ns, finalizers)| {
                if finalizers.is_empty() {
                    format!(
                        "{ns} (being deleted with everything in it: its status.conditions, or \
                         else its spec.finalizers, name what holds it)"
                    )
                } else {
                    format!("{ns} (finalizers: {})", finalizers.join(", "))
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    });
    // After a wait's message, and after a stall's.
    let and_held = |message: String| match &held {
        Some(held) => {
            format!("{message}; and for namespaces no longer desired to be deleted: {held}")
        }
        None => message,
    };
    let meanwhile = |message: String| match &held {
        Some(held) => format!(
            "{message}; waiting meanwhile for namespaces no longer desired to be deleted: {held}"
        ),
        None => message,
    };
    if !pass.conflicts.is_empty() {
        let list: Vec<String> = pass
            .conflicts
            .iter()
            .map(|(ns, why)| format!("namespace {ns} exists and is {why}"))
            .collect();
        let message = format!(
            "{}; {} left alone (to hand one to this Tenant, give it the Tenant's controller ownerReference: docs/operator.md)",
            list.join("; "),
            if list.len() == 1 { "it is" } else { "they are" }
        );
        return Readiness::Stalled {
            reason: "NamespaceConflict".into(),
            message: meanwhile(message),
        };
    }
    if !pass.terminating.is_empty() {
        return Readiness::Reconciling {
            reason: "NamespaceTerminating".into(),
            message: and_held(format!(
                "waiting for namespaces being deleted, to create them again (empty) once they \
                 are gone: {}{}",
                pass.terminating.join(", "),
                (pass.unrepaired.iter())
                    .map(|(ns, why)| format!("; {ns} not repaired meanwhile: {why}"))
                    .collect::<String>()
            )),
        };
    }
    match (contents.readiness(), &held) {
        (Readiness::Ready { .. }, Some(held)) => Readiness::Reconciling {
            reason: "NamespaceTerminating".into(),
            message: format!("waiting for namespaces no longer desired to be deleted: {held}"),
        },
        (Readiness::Ready { .. }, None) => Readiness::Ready {
            reason: "Reconciled".into(),
            message: format!(
                "{} and {} in them are up to date",
                counted(pass.owned.len(), "namespace"),
                counted(contents.children.len(), "object")
            ),
        },
        (Readiness::Reconciling { reason, message }, Some(_)) => Readiness::Reconciling {
            reason,
            message: and_held(message),
        },
        (Readiness::Stalled { reason, message }, Some(_)) => Readiness::Stalled {
            reason,
            message: meanwhile(message),
        },
        (other, _) => other,
    }
}

/// `n` and `noun`, plural unless `n` is 1.
fn counted(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// One `Normal` Event `Released` (action `Release`) per namespace the tenant released in
/// this reconcile (an administrator removed its ownerReference) or whose contents it released
/// (it no longer controls the namespace), naming the namespace and the objects kept. The
/// Event's related object is the namespace, so each namespace's Event is one of its own.
pub fn released_events(pass: &NamespacePass, contents: &ApplyReport) -> Vec<Event> {
    let mut namespaces: Vec<&str> = pass.released.iter().map(String::as_str).collect();
    namespaces.extend(
        contents
            .released
            .iter()
            .filter_map(|k| k.namespace.as_deref()),
    );
    namespaces.sort_unstable();
    namespaces.dedup();
    namespaces
        .into_iter()
        .map(|ns| {
            let objects: Vec<String> = contents
                .released
                .iter()
                .filter(|k| k.namespace.as_deref() == Some(ns))
                .map(|k| format!("{} {}", k.kind, k.name))
                .collect();
            let inside = if objects.is_empty() {
                String::new()
            } else {
                format!(" and, in it, {}", objects.join(", "))
            };
            let note = if pass.retained.iter().any(|r| r == ns) {
                format!(
                    "namespace {ns} is no longer in spec.namespaces and deletionPolicy is Retain: kept it with everything in it{inside}; ownerReferences to the Tenant and the owner-uid label removed, no longer managed (its quota no longer counts toward the Tenant's; delete it yourself if it should go)"
                )
            } else if pass.released.iter().any(|r| r == ns) {
                format!(
                    "namespace {ns} was released (its ownerReference to the Tenant was removed): kept it{inside}; ownerReferences to the Tenant and the owner-uid label removed, no longer managed"
                )
            } else {
                format!(
                    "namespace {ns} is not controlled by the Tenant: kept {}; ownerReferences to the Tenant and the owner-uid label removed, no longer managed",
                    objects.join(", ")
                )
            };
            Event {
                type_: EventType::Normal,
                reason: "Released".into(),
                note: Some(note),
                action: "Release".into(),
                secondary: Some(ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Namespace".into()),
                    name: Some(ns.to_owned()),
                    ..ObjectReference::default()
                }),
            }
        })
        .collect()
}

/// The names in a list of keys.
pub fn names(keys: &[ObjectKey]) -> Vec<String> {
    keys.iter().map(|k| k.name.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::cluster("Namespace", name)
    }

    #[test]
    fn a_held_namespace_no_longer_desired_keeps_the_tenant_reconciling() {
        let report = ApplyReport {
            children: vec![(key("a-dev"), ChildOutcome::Unchanged)],
            pruning: vec![(key("a-old"), vec!["example.com/keep".into()])],
            ..ApplyReport::default()
        };
        let pass = NamespacePass::from_report(&report);
        match readiness(&pass, &ApplyReport::default()) {
            Readiness::Reconciling { reason, message } => {
                assert_eq!(reason, "NamespaceTerminating");
                assert!(
                    message.contains("a-old (finalizers: example.com/keep)"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        let gone = NamespacePass::from_report(&ApplyReport {
            pruning: vec![],
            ..report
        });
        assert!(matches!(
            readiness(&gone, &ApplyReport::default()),
            Readiness::Ready { .. }
        ));
    }

    #[test]
    fn a_held_namespace_is_named_whatever_the_status_names_first() {
        let held = vec![(key("a-old"), vec![])];
        let conflict = ApplyReport {
            children: vec![(
                key("a-c"),
                ChildOutcome::NotOwned {
                    reason: "not controlled by any owner".into(),
                },
            )],
            pruning: held.clone(),
            ..ApplyReport::default()
        };
        let pass = NamespacePass::from_report(&conflict);
        let Readiness::Stalled { reason, message } = readiness(&pass, &ApplyReport::default())
        else {
            panic!("a conflict stalls");
        };
        assert_eq!(reason, "NamespaceConflict");
        assert!(
            message.ends_with(
                "waiting meanwhile for namespaces no longer desired to be deleted: a-old (being \
                 deleted with everything in it: its status.conditions, or else its \
                 spec.finalizers, name what holds it)"
            ),
            "{message}"
        );
        // Contents still waiting for a child of theirs: both waits are named.
        let pass = NamespacePass::from_report(&ApplyReport {
            pruning: held,
            ..ApplyReport::default()
        });
        let contents = ApplyReport {
            pruning: vec![(key("a-dev-binding"), vec!["example.com/keep".into()])],
            ..ApplyReport::default()
        };
        let Readiness::Reconciling { reason, message } = readiness(&pass, &contents) else {
            panic!("contents waiting");
        };
        assert_eq!(reason, "ChildTerminating");
        assert!(
            message.contains("a-dev-binding") && message.contains("a-old (being deleted"),
            "{message}"
        );
    }

    #[test]
    fn a_terminating_namespace_whose_repair_was_refused_names_the_servers_words() {
        let report = ApplyReport {
            children: vec![(
                key("a-old"),
                ChildOutcome::Terminating {
                    finalizers: vec![],
                    unrepaired: Some("403 Forbidden: labels are frozen".into()),
                },
            )],
            ..ApplyReport::default()
        };
        let pass = NamespacePass::from_report(&report);
        match readiness(&pass, &ApplyReport::default()) {
            Readiness::Reconciling { reason, message } => {
                assert_eq!(reason, "NamespaceTerminating");
                assert_eq!(
                    message,
                    "waiting for namespaces being deleted, to create them again (empty) once \
                     they are gone: a-old; a-old not repaired meanwhile: 403 Forbidden: labels \
                     are frozen"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn conflict_beats_everything_and_names_the_namespace() {
        let report = ApplyReport {
            children: vec![
                (
                    key("a-b-c"),
                    ChildOutcome::NotOwned {
                        reason: "controlled by Tenant a-b".into(),
                    },
                ),
                (key("a-dev"), ChildOutcome::Created),
                (
                    key("a-old"),
                    ChildOutcome::Terminating {
                        finalizers: vec![],
                        unrepaired: None,
                    },
                ),
            ],
            ..ApplyReport::default()
        };
        let pass = NamespacePass::from_report(&report);
        assert_eq!(pass.owned, ["a-dev"]);
        assert_eq!(pass.terminating, ["a-old"]);
        match readiness(&pass, &ApplyReport::default()) {
            Readiness::Stalled { reason, message } => {
                assert_eq!(reason, "NamespaceConflict");
                assert!(message.contains("a-b-c"), "{message}");
                assert!(
                    message.contains("; it is left alone (to hand one"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn one_released_event_per_namespace_names_what_was_kept() {
        let pass = NamespacePass {
            released: vec!["a-dev".into()],
            conflicts: vec![("a-dev".into(), "not controlled by any owner".into())],
            ..NamespacePass::default()
        };
        let contents = ApplyReport {
            released: vec![
                ObjectKey::namespaced("ResourceQuota", "a-dev", "idem-quota"),
                ObjectKey::namespaced("RoleBinding", "a-dev", "idem-owners"),
                ObjectKey::namespaced("RoleBinding", "a-old", "idem-owners"),
            ],
            ..ApplyReport::default()
        };
        assert_eq!(pass.not_ours(), ["a-dev"]);
        let events = released_events(&pass, &contents);
        let notes: Vec<&str> = events.iter().filter_map(|e| e.note.as_deref()).collect();
        assert_eq!(events.len(), 2, "{notes:?}");
        let dev = events[0].note.as_deref().unwrap();
        assert!(dev.starts_with("namespace a-dev was released"), "{dev}");
        assert!(
            dev.contains("ResourceQuota idem-quota, RoleBinding idem-owners"),
            "{dev}"
        );
        let old = events[1].note.as_deref().unwrap();
        assert!(
            old.contains("a-old") && old.contains("RoleBinding idem-owners"),
            "{old}"
        );
        assert_eq!(
            events[1].secondary.as_ref().and_then(|r| r.name.as_deref()),
            Some("a-old")
        );
        assert!(released_events(&NamespacePass::default(), &ApplyReport::default()).is_empty());
    }

    #[test]
    fn a_namespace_that_left_the_spec_under_retain_is_said_kept_and_stays_released() {
        let report = ApplyReport {
            children: vec![(
                ObjectKey::cluster("Namespace", "a-dev"),
                ChildOutcome::Unchanged,
            )],
            released: vec![ObjectKey::cluster("Namespace", "a-old")],
            ..ApplyReport::default()
        };
        let pass = NamespacePass::from_report(&report);
        assert_eq!(pass.retained, ["a-old"]);
        let events = released_events(&pass, &ApplyReport::default());
        let note = events[0].note.as_deref().unwrap();
        assert!(
            note.starts_with(
                "namespace a-old is no longer in spec.namespaces and deletionPolicy is Retain"
            ),
            "{note}"
        );
        // A later pass: a namespace the record still holds children in, neither owned nor
        // being deleted, has them released; one being deleted has them pruned with it.
        let later = NamespacePass {
            owned: vec!["a-dev".into()],
            ..NamespacePass::default()
        };
        let recorded = ["a-dev", "a-old", "a-gone", "a-old"].into_iter();
        assert_eq!(later.not_ours_of(recorded, &["a-gone".into()]), ["a-old"]);
    }

    #[test]
    fn terminating_namespaces_mean_reconciling() {
        let pass = NamespacePass {
            terminating: vec!["a-old".into()],
            ..NamespacePass::default()
        };
        assert!(matches!(
            readiness(&pass, &ApplyReport::default()),
            Readiness::Reconciling { reason, .. } if reason == "NamespaceTerminating"
        ));
    }

    #[test]
    fn all_owned_means_ready() {
        let pass = NamespacePass {
            owned: vec!["a-dev".into()],
            ..NamespacePass::default()
        };
        assert!(matches!(
            readiness(&pass, &ApplyReport::default()),
            Readiness::Ready { reason, .. } if reason == "Reconciled"
        ));
    }
}
