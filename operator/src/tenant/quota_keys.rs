//! Object-count quota keys that count nothing, as the cluster's own quota controller shows them.
//!
//! The API server takes any `count/<resource>` key (`count/deployments` as readily as
//! `count/deployments.apps`) and the Tenant's schema cannot know which resources the cluster
//! serves. But the quota controller fills `status.used` with a usage for every key it counts,
//! and leaves out a key that no resource it knows matches: a resource of a named API group
//! given without its group (`count/deployments`), a misspelt one, or a custom resource whose
//! definition is not installed. So a key the quota's `status.hard` holds (the quota controller
//! has synced it) and its `status.used` lacks limits nothing; the Tenant's `Ready` message says
//! so, and says it no more once the key counts (a definition installed, the key corrected).
//! Nothing is asked of discovery, and no list of kinds is kept here.

use std::collections::{BTreeMap, BTreeSet};

use idem_runtime::prelude::*;

use super::quota_split::Observed;
use crate::resources::tenant::Quota;

/// The object-count quota key prefix.
const COUNT: &str = "count/";

/// The `count/` keys of `quota` (only they are judged here), with repeats.
fn count_keys(quota: &Quota) -> impl Iterator<Item = &String> {
    (quota.hard.keys())
        .chain(quota.tenant_hard.keys())
        .filter(|k| k.starts_with(COUNT))
}

/// Whether `quota` has `count/` keys.
pub fn has_count_keys(quota: &Quota) -> bool {
    count_keys(quota).next().is_some()
}

/// The `count/` keys of `quota` that some namespace's quota (in `observed`) has synced
/// (`status.hard` holds it) without counting them (`status.used` lacks it), sorted.
pub fn uncounted(quota: &Quota, observed: &BTreeMap<String, Observed>) -> Vec<String> {
    let keys: BTreeSet<&String> = count_keys(quota).collect();
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
        "quota {one} {} {verb} nothing: the quota controller counts no resource by {pronoun} (a \
         resource of a named API group is count/<resource>.<group>, e.g. count/deployments.apps; \
         a custom resource counts once its definition is installed)",
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
    fn a_synced_count_key_without_a_usage_counts_nothing() {
        let quota = Quota {
            hard: map(&["count/deployments", "count/configmaps", "pods"]),
            tenant_hard: map(&["count/widgets.example.com"]),
        };
        let observed = BTreeMap::from([
            (
                "a".to_owned(),
                Observed {
                    spec: None,
                    enforced: map(&["count/deployments", "count/configmaps", "pods"]),
                    used: map(&["count/configmaps"]),
                },
            ),
            // Not synced yet: nothing is judged from it.
            ("b".to_owned(), Observed::default()),
        ]);
        // `pods` is not an object-count key; the custom resource's key is not synced anywhere.
        assert_eq!(uncounted(&quota, &observed), ["count/deployments"]);
        let message = note(&uncounted(&quota, &observed)).unwrap();
        assert!(
            message.starts_with("quota key count/deployments limits nothing"),
            "{message}"
        );
        assert_eq!(note(&[]), None);
    }
}
