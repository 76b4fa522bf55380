//! RoleBindings that would first grant access to a tenant namespace wait until its quota is enforced.
//!
//! Quota admission enforces a ResourceQuota only once the controller-manager's quota
//! controller has filled its `status.hard`; until then the namespace has no limit at all.
//! A new namespace's quota is written in the same pass as its RoleBindings, and with the
//! quota controller slow, restarting or down, the owners could create without bound in that
//! window (216 pods against a tenant total of 4, in a trial). So in a namespace whose quota
//! does not enforce every key it is given yet, the RoleBindings that do not exist yet are not
//! created; the Tenant says `Reconciling` (`QuotaNotEnforced`) and the quota's status update
//! reconciles it again. A RoleBinding that exists stays (pulling access that was granted
//! would be worse than the window, and it is not the window of a new namespace).

use std::collections::BTreeSet;

use idem_runtime::apply::ChildCaches;
use idem_runtime::prelude::*;
use k8s_openapi::api::rbac::v1::RoleBinding;

use super::desired::bindings;
use super::quota_split::observe;
use crate::resources::Tenant;

/// The RoleBindings (namespace, name) of `namespaces` to leave out of the pass: those that do
/// not exist yet in a namespace whose quota does not enforce every key it is given. The quotas
/// are read as the pass reads children (from the controller's cache: no request on a
/// converged pass; GETs when the pass has none), whether a RoleBinding exists from `caches`
/// (without a cache of them, none is held: leaving out one that exists would delete it).
///
/// # Errors
/// As [`Pass::children`].
pub async fn held_bindings(
    tenant: &Tenant,
    pass: &Pass<Tenant>,
    caches: &ChildCaches,
    namespaces: &[String],
) -> Result<BTreeSet<(String, String)>, ReconcileError> {
    let Some(quota) = tenant.spec.quota.as_ref() else {
        return Ok(BTreeSet::new());
    };
    let keys: BTreeSet<&String> = quota.hard.keys().chain(quota.tenant_hard.keys()).collect();
    let names: Vec<String> = bindings(tenant, None)
        .into_iter()
        .filter_map(|b| b.metadata.name)
        .collect();
    if keys.is_empty() || names.is_empty() || namespaces.is_empty() {
        return Ok(BTreeSet::new());
    }
    // Bindings not made yet, in each namespace (none where it is not known).
    let missing: Vec<(&String, Vec<&String>)> = namespaces
        .iter()
        .map(|ns| {
            let absent = names
                .iter()
                .filter(|name| matches!(caches.lookup::<RoleBinding>(Some(ns), name), Some(None)))
                .collect::<Vec<_>>();
            (ns, absent)
        })
        .filter(|(_, absent)| !absent.is_empty())
        .collect();
    if missing.is_empty() {
        return Ok(BTreeSet::new());
    }
    let namespaces: Vec<String> = missing.iter().map(|(ns, _)| (*ns).clone()).collect();
    let observed = observe(tenant, pass, &namespaces).await?;
    let mut held = BTreeSet::new();
    for (ns, absent) in missing {
        let enforced = observed
            .get(ns)
            .is_some_and(|o| keys.iter().all(|k| o.enforced.contains_key(*k)));
        if !enforced {
            held.extend(absent.into_iter().map(|name| (ns.clone(), name.clone())));
        }
    }
    Ok(held)
}

/// The readiness of a tenant some of whose RoleBindings wait for their quota: `Reconciling`
/// (reason `QuotaNotEnforced`) instead of `Ready`; any other readiness as it is.
pub fn readiness(held: &BTreeSet<(String, String)>, readiness: Readiness) -> Readiness {
    match readiness {
        Readiness::Ready { .. } if !held.is_empty() => {
            let namespaces: BTreeSet<&str> = held.iter().map(|(ns, _)| ns.as_str()).collect();
            Readiness::Reconciling {
                reason: "QuotaNotEnforced".into(),
                message: format!(
                    "the RoleBindings of {} wait until the quota controller enforces the \
                     namespace's quota (its status.hard)",
                    namespaces.into_iter().collect::<Vec<_>>().join(", ")
                ),
            }
        }
        other => other,
    }
}
