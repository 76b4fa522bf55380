//! Access to a tenant namespace waits until its quota is enforced: RoleBindings that would first grant it are held, and a namespace whose quota is new (made again, or given) is cordoned.
//!
//! Quota admission enforces a ResourceQuota only once the controller-manager's quota
//! controller has filled its `status.hard`; until then the namespace has no limit at all.
//! A new namespace's quota is written in the same pass as its RoleBindings, and with the
//! quota controller slow, restarting or down, the owners could create without bound in that
//! window (216 pods against a tenant total of 4, in a trial). So in a namespace whose quota
//! does not enforce every key it is given yet, the RoleBindings that do not exist yet are not
//! created; the Tenant says `Reconciling` (`QuotaNotEnforced`) and the quota's status update
//! reconciles it again. A RoleBinding that exists stays (pulling access that was granted
//! would be worse than the window). But a namespace whose owners have access and whose quota
//! enforces nothing (someone deleted `idem-quota` and the pass creates it again, or the
//! Tenant is given a quota; an admin's slip let 62 ConfigMaps past a `hard` of 20 in a trial)
//! is cordoned through its TenantPolicy (`quotaNotEnforced`, [`super::policy`]) until the quota
//! controller has counted the new quota. A quota that enforces some key cordons nothing, even
//! when none of the keys it is given now (an administrator replaced `pods` with
//! `count/pods`): what it enforces stays enforced until the quota controller copies the new
//! keys, and the namespace had no limit of a new key before either.

use std::collections::{BTreeMap, BTreeSet};

use idem_runtime::apply::ChildCaches;
use idem_runtime::prelude::*;
use k8s_openapi::api::rbac::v1::RoleBinding;

use super::desired::bindings;
use super::policy::PARAMS;
use super::quota_split::observe;
use crate::resources::{Tenant, TenantPolicy};

/// What a pass holds back until the namespaces' quotas are enforced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gate {
    /// RoleBindings (namespace, name) to leave out of the pass: they do not exist yet, and
    /// their namespace's quota does not enforce every key it is given.
    pub held: BTreeSet<(String, String)>,
    /// Namespaces where access was granted (a RoleBinding of ours is or was there, or the
    /// namespace is cordoned already) whose quota enforces nothing (or is gone): their
    /// TenantPolicy refuses creates and updates until it does.
    pub cordoned: BTreeSet<String>,
}

impl Gate {
    /// Whether the pass holds nothing back.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty() && self.cordoned.is_empty()
    }
}

/// What to hold back in `namespaces` ([`Gate`]). The quotas are read as the pass reads
/// children (from the controller's cache: no request on a converged pass; GETs when the pass
/// has none), whether a RoleBinding exists from `caches` (without a cache of them, nothing is
/// held: leaving out one that exists would delete it, and cordoning needs to know access was
/// granted).
///
/// # Errors
/// As [`Pass::children`].
pub async fn gate(
    tenant: &Tenant,
    pass: &Pass<Tenant>,
    caches: &ChildCaches,
    namespaces: &[String],
) -> Result<Gate, ReconcileError> {
    let Some(quota) = tenant.spec.quota.as_ref() else {
        return Ok(Gate::default());
    };
    let keys: BTreeSet<&String> = quota.hard.keys().chain(quota.tenant_hard.keys()).collect();
    let names: Vec<String> = bindings(tenant, None)
        .into_iter()
        .filter_map(|b| b.metadata.name)
        .collect();
    if keys.is_empty() || names.is_empty() || namespaces.is_empty() {
        return Ok(Gate::default());
    }
    // Per namespace, the bindings not made yet and whether one is (where it is known).
    let known: Vec<(&String, Vec<&String>, bool)> = namespaces
        .iter()
        .map(|ns| {
            let lookups: Vec<(&String, Option<bool>)> = (names.iter())
                .map(|name| {
                    let found = caches.lookup::<RoleBinding>(Some(ns), name);
                    (name, found.map(|b| b.is_some()))
                })
                .collect();
            let absent: Vec<&String> = (lookups.iter())
                .filter(|(_, exists)| *exists == Some(false))
                .map(|(name, _)| *name)
                .collect();
            // Access was granted: a binding of ours is there or was (the record holds one: an
            // owner deleting it does not take back what others they bound may do), or the
            // namespace is cordoned already (until its quota is enforced, whatever happens to
            // the bindings meanwhile).
            let granted = lookups.iter().any(|(_, exists)| *exists == Some(true))
                || recorded_binding(tenant, ns)
                || (caches.lookup::<TenantPolicy>(Some(ns), PARAMS))
                    .flatten()
                    .is_some_and(|p| p.spec.quota_not_enforced);
            (ns, absent, granted)
        })
        .filter(|(_, absent, granted)| !absent.is_empty() || *granted)
        .collect();
    if known.is_empty() {
        return Ok(Gate::default());
    }
    let observed_in: Vec<String> = known.iter().map(|(ns, ..)| (*ns).clone()).collect();
    let observed = observe(tenant, pass, &observed_in).await?;
    let mut gate = Gate::default();
    for (ns, absent, granted) in known {
        let enforced = observed.get(ns).map(|o| &o.enforced);
        let count = keys
            .iter()
            .filter(|k| enforced.is_some_and(|e| e.contains_key(**k)))
            .count();
        if count < keys.len() {
            let held = absent.into_iter().map(|name| (ns.clone(), name.clone()));
            gate.held.extend(held);
        }
        if granted && enforced.is_none_or(BTreeMap::is_empty) {
            gate.cordoned.insert(ns.clone());
        }
    }
    Ok(gate)
}

/// Whether the Tenant's record (its status) holds a RoleBinding it created in `ns`.
fn recorded_binding(tenant: &Tenant, ns: &str) -> bool {
    (tenant.status.iter())
        .flat_map(|s| s.created_children.iter())
        .any(|c| c.kind == "RoleBinding" && c.namespace.as_deref() == Some(ns))
}

/// The readiness of a tenant some of whose access waits for its quota: `Reconciling`
/// (reason `QuotaNotEnforced`) instead of `Ready`; any other readiness as it is.
pub fn readiness(gate: &Gate, readiness: Readiness) -> Readiness {
    match readiness {
        Readiness::Ready { .. } if !gate.is_empty() => {
            let list = |names: BTreeSet<&str>| names.into_iter().collect::<Vec<_>>().join(", ");
            let mut said = Vec::new();
            let waiting: BTreeSet<&str> = gate.held.iter().map(|(ns, _)| ns.as_str()).collect();
            if !waiting.is_empty() {
                said.push(format!("the RoleBindings of {} wait", list(waiting)));
            }
            if !gate.cordoned.is_empty() {
                let cordoned = gate.cordoned.iter().map(String::as_str).collect();
                said.push(format!(
                    "creates and updates in {} are refused (its quota is new: not counted yet)",
                    list(cordoned)
                ));
            }
            Readiness::Reconciling {
                reason: "QuotaNotEnforced".into(),
                message: format!(
                    "{} until the quota controller enforces the namespace's quota (its status.hard)",
                    said.join("; ")
                ),
            }
        }
        other => other,
    }
}
