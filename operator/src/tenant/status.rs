//! A Tenant's status from what the reconcile saw: namespaces it owns, and kstatus readiness
//! (`NamespaceConflict`, `NamespaceTerminating`, `ChildNotOwned`; the reconcile adds `Paused`, the
//! driver `ReconcileFailed`).

use idem_runtime::ObjectKey;
use idem_runtime::apply::{ApplyReport, ChildOutcome};
use idem_runtime::status::Readiness;

/// What the namespace pass found.
#[derive(Debug, Default, PartialEq)]
pub struct NamespacePass {
    /// Namespaces the tenant owns and that are usable, sorted.
    pub owned: Vec<String>,
    /// Namespaces whose name is taken by an object the tenant does not own, with why.
    pub conflicts: Vec<(String, String)>,
    /// Namespaces being deleted (e.g. removed and re-added); their contents wait.
    pub terminating: Vec<String>,
}

impl NamespacePass {
    /// Sorts the namespace pass's report into owned, conflicting and terminating namespaces.
    pub fn from_report(report: &ApplyReport) -> Self {
        let mut pass = Self::default();
        for (key, outcome) in &report.children {
            let name = key.name.to_string();
            match outcome {
                ChildOutcome::NotOwned { reason } => pass.conflicts.push((name, reason.clone())),
                ChildOutcome::Terminating => pass.terminating.push(name),
                _ => pass.owned.push(name),
            }
        }
        pass.owned.sort();
        pass
    }
}

/// The readiness of a reconciled tenant.
///
/// A namespace conflict wins (it needs a human and the other tenant keeps the namespace), then
/// a terminating namespace (wait), then the readiness of the namespace contents.
pub fn readiness(pass: &NamespacePass, contents: &ApplyReport) -> Readiness {
    if !pass.conflicts.is_empty() {
        let list: Vec<String> = pass
            .conflicts
            .iter()
            .map(|(ns, why)| format!("namespace {ns} exists and is {why}"))
            .collect();
        return Readiness::Stalled {
            reason: "NamespaceConflict".into(),
            message: format!(
                "{}; {} left alone",
                list.join("; "),
                if list.len() == 1 { "it is" } else { "they are" }
            ),
        };
    }
    if !pass.terminating.is_empty() {
        return Readiness::Reconciling {
            reason: "NamespaceTerminating".into(),
            message: format!(
                "waiting for namespaces being deleted: {}",
                pass.terminating.join(", ")
            ),
        };
    }
    match contents.readiness() {
        Readiness::Ready { .. } => Readiness::Ready {
            reason: "Reconciled".into(),
            message: format!(
                "{} namespaces and {} objects in them are up to date",
                pass.owned.len(),
                contents.children.len()
            ),
        },
        other => other,
    }
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
                (key("a-old"), ChildOutcome::Terminating),
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
                assert!(message.ends_with("; it is left alone"), "{message}");
            }
            other => panic!("{other:?}"),
        }
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
