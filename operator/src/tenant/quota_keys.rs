//! Quota keys that count nothing, as the cluster's own quota controller shows them.
//!
//! The API server takes any qualified name as a quota key: `count/deployments` as readily as
//! `count/deployments.apps`, `nvidia.com/gpu` as readily as `requests.nvidia.com/gpu`, and the
//! Tenant's schema cannot know which resources the cluster serves. But the quota controller
//! fills `status.used` with a usage for every key it counts, and leaves out a key that none of
//! its evaluators matches: a resource of a named API group given without its group
//! (`count/deployments`), a misspelt one, a custom resource whose definition is not installed,
//! or an extended resource without its `requests.` prefix. So a key the quota's `status.hard`
//! holds (the quota controller has synced it) and its `status.used` lacks limits nothing; the
//! Tenant's `Ready` message says so, and says it no more once the key counts (a definition
//! installed, the key corrected). Nothing is asked of discovery, and no list of kinds or
//! resource names is kept here.

use std::collections::{BTreeMap, BTreeSet};

use idem_runtime::prelude::*;

use super::quota_split::Observed;
use crate::resources::tenant::Quota;

/// The keys of `quota` with a `/` (object counts, extended resources, storage classes: the
/// names the schema cannot judge; a standard name always counts), with repeats.
fn keys(quota: &Quota) -> impl Iterator<Item = &String> {
    (quota.hard.keys())
        .chain(quota.tenant_hard.keys())
        .filter(|k| k.contains('/'))
}

/// Whether `quota` has keys with a `/`.
pub fn has_keys(quota: &Quota) -> bool {
    keys(quota).next().is_some()
}

/// The keys of `quota` that some namespace's quota (in `observed`) has synced (`status.hard`
/// holds it) without counting them (`status.used` lacks it), sorted.
pub fn uncounted(quota: &Quota, observed: &BTreeMap<String, Observed>) -> Vec<String> {
    let keys: BTreeSet<&String> = keys(quota).collect();
    keys.into_iter()
        .filter(|k| {
            observed
                .values()
                .any(|o| o.enforced.contains_key(*k) && !o.used.contains_key(*k))
        })
        .cloned()
        .collect()
}

/// Words for the `Ready` message about `keys` ([`uncounted`]), `None` when there are none.
pub fn note(keys: &[String]) -> Option<String> {
    let (one, verb, pronoun) = match keys.len() {
        0 => return None,
        1 => ("key", "limits", "it"),
        _ => ("keys", "limit", "them"),
    };
    Some(format!(
        "quota {one} {} {verb} nothing: the quota controller counts no resource by {pronoun} (an \
         extended resource is requests.<name>, e.g. requests.nvidia.com/gpu; a resource of a \
         named API group is count/<resource>.<group>, e.g. count/deployments.apps; a custom \
         resource counts once its definition is installed)",
        keys.join(", ")
    ))
}

/// `readiness` with [`note`] of `keys` added to a `Ready` message.
pub fn readiness(keys: &[String], readiness: Readiness) -> Readiness {
    match (readiness, note(keys)) {
        (Readiness::Ready { reason, message }, Some(note)) => Readiness::Ready {
            reason,
            message: format!("{message}; {note}"),
        },
        (other, _) => other,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn map(keys: &[&str]) -> BTreeMap<String, Quantity> {
        keys.iter()
            .map(|k| ((*k).to_owned(), Quantity("1".into())))
            .collect()
    }

    #[test]
    fn a_synced_key_without_a_usage_counts_nothing() {
        let quota = Quota {
            hard: map(&[
                "count/deployments",
                "count/configmaps",
                "pods",
                "example.com/gpu",
            ]),
            tenant_hard: map(&["count/widgets.example.com"]),
        };
        let observed = BTreeMap::from([
            (
                "a".to_owned(),
                Observed {
                    spec: None,
                    enforced: map(&[
                        "count/deployments",
                        "count/configmaps",
                        "pods",
                        "example.com/gpu",
                    ]),
                    used: map(&["count/configmaps", "pods"]),
                    recorded: None,
                },
            ),
            // Not synced yet: nothing is judged from it.
            ("b".to_owned(), Observed::default()),
        ]);
        // The custom resource's key is not synced anywhere.
        assert_eq!(
            uncounted(&quota, &observed),
            ["count/deployments", "example.com/gpu"]
        );
        let message = note(&uncounted(&quota, &observed)).unwrap();
        assert!(
            message.starts_with("quota keys count/deployments, example.com/gpu limit nothing"),
            "{message}"
        );
        assert_eq!(note(&[]), None);
    }
}
