//! One reconcile of a Tenant on idem-runtime's [`Reconciler`]: namespaces, then their
//! contents, then status; on deletion the cleanup of [`super::finalize`]. The runtime's
//! [`Driver`] does the rest (finalizer, owner, Events,
//! status writes, `Stalled` after repeated failures, timeout, tracing span).

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::prelude::*;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::desired;
use super::finalize::waiting_poll;
use super::status::{self, NamespacePass};
use super::{quota_gate, quota_keys, quota_split};
use crate::context::Context;
use crate::error::Error;
use crate::resources::{FINALIZER, Tenant, TenantPolicy, TenantStatus};

/// How often a tenant stalled on a namespace conflict is looked at again. The runtime watches
/// the conflicting namespace (`idem_runtime::controller::blocked`), but only for its deletion
/// or replacement: no event of that watch says its ownerReferences changed hands (another
/// tenant's namespace maps to that other tenant). A conflicted reconcile writes nothing (its
/// status is unchanged), so this slow poll costs a few reads.
pub const CONFLICT_POLL: Duration = Duration::from_secs(30);

/// Since when the Tenant has waited, at the latest: the last transition of its `Ready`
/// condition, when false (whatever its status names first: a namespace conflict may rank above
/// the deletion it also waits for). A Tenant not ready for long before a deletion began looks
/// at it seldom from the start; the deleted object's own events still wake it.
fn waiting_since(tenant: &Tenant) -> Option<&Time> {
    let status = tenant.status.as_ref()?;
    (status.conditions.iter())
        .find(|c| c.type_ == "Ready" && c.status == "False")
        .map(|c| &c.last_transition_time)
}

/// What a Tenant's pass left it waiting for, besides the events that normally wake it.
#[derive(Clone, Copy, Debug, Default)]
struct Waits {
    /// A namespace or object being deleted, desired or held before it goes: looked at again
    /// until it is gone (its deletion's own event may come late or never reach us), less and
    /// less often while the Tenant waits (a hold may last).
    deletion: bool,
    /// Quota increases that wait for the decreases, or a lower usage not believed yet
    /// ([`quota_split::HELD_POLL`]).
    quota: bool,
    /// A namespace conflict ([`CONFLICT_POLL`]).
    conflict: bool,
}

impl Waits {
    /// When to look again: the soonest of the polls of everything it waits for, so that one
    /// slow wait does not delay another.
    fn requeue(self, since: Option<&Time>, now: Time) -> Option<Duration> {
        [
            self.deletion.then(|| waiting_poll(since, now)),
            self.quota.then_some(quota_split::HELD_POLL),
            self.conflict.then_some(CONFLICT_POLL),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// The Tenant reconciler: namespaces first (their contents go only into namespaces the tenant
/// owns), `spec.paused` stops everything, the finalizer runs [`super::finalize`].
pub struct Tenants {
    /// The operator's shared state (child caches, namespaces' tenants).
    pub ctx: Arc<Context>,
}

/// The namespaces the Tenant's record holds children in (as last written to its status).
fn recorded_namespaces(tenant: &Tenant) -> impl Iterator<Item = &str> {
    (tenant.status.iter())
        .flat_map(|s| s.created_children.iter())
        .filter_map(|c| c.namespace.as_deref())
}

/// Sets the namespace list and count of a Tenant's status.
fn set_namespaces(status: &mut TenantStatus, namespaces: &[String]) {
    status.namespaces = namespaces.to_vec();
    status.namespace_count = namespaces.len() as i32;
}

impl Reconciler for Tenants {
    type Resource = Tenant;
    const FINALIZER: Option<&'static str> = Some(FINALIZER);

    /// Namespaces and what goes in them.
    fn children() -> ChildKinds<Tenant> {
        ChildKinds::new()
            .owns::<Namespace>()
            .owns_reading_status::<ResourceQuota>()
            .owns::<LimitRange>()
            .owns::<RoleBinding>()
            .owns::<NetworkPolicy>()
            .owns::<TenantPolicy>()
    }

    async fn reconcile(
        &self,
        tenant: &Tenant,
        pass: &mut Pass<Tenant>,
    ) -> Result<Outcome<Tenant>, Error> {
        if tenant.spec.paused {
            let message = "spec.paused is true: children are neither applied nor pruned";
            return Ok(Outcome::new(Readiness::Stalled {
                reason: "Paused".into(),
                message: message.into(),
            }));
        }
        let ns = NamespacePass::from_report(&pass.apply_part(&desired::namespaces(tenant)?).await?);
        let leaving = ns.leaving();
        let not_ours = ns.not_ours_of(recorded_namespaces(tenant), &leaving);
        // The quotas' decreases first (quota_split), then everything with the increases.
        let split = quota_split::settle(
            tenant,
            pass,
            &ns.owned,
            &leaving,
            &not_ours,
            &self.ctx.usage,
            &self.ctx.splits,
        )
        .await?;
        let quotas = split.as_ref().map(|p| p.hard.clone()).unwrap_or_default();
        let gate = quota_gate::gate(tenant, pass, &self.ctx.caches, &ns.owned).await?;
        let contents = pass
            .apply_part(&desired::contents(
                tenant,
                &ns.owned,
                &not_ours,
                &quotas,
                &gate.held,
                &gate.cordoned,
            )?)
            .await?;
        for event in status::released_events(&ns, &contents) {
            // An administrator's release or a namespace leaving the spec: once, and the only
            // record of what was kept.
            pass.publish_always(event).await;
        }
        let waits = Waits {
            deletion: !ns.terminating.is_empty()
                || !ns.held.is_empty()
                || !contents.pruning.is_empty(),
            quota: !gate.is_empty()
                || split
                    .as_ref()
                    .is_some_and(|p| !p.held.is_empty() || p.settling),
            conflict: !ns.conflicts.is_empty(),
        };
        let requeue = waits.requeue(waiting_since(tenant), Time(Timestamp::now()));
        let mut readiness = status::readiness(&ns, &contents);
        if let Some(plan) = &split {
            readiness = quota_split::readiness(plan, readiness);
        }
        readiness = quota_gate::readiness(&gate, readiness);
        if let Some(quota) = &tenant.spec.quota
            && quota_keys::has_keys(quota)
        {
            let observed = quota_split::observe(tenant, pass, &ns.owned).await?;
            readiness = quota_keys::readiness(&quota_keys::uncounted(quota, &observed), readiness);
        }
        let owned = ns.owned.clone();
        let cordoned = tenant.spec.cordoned;
        let quota_split = split.map(|p| p.decided).unwrap_or_default();
        let readiness = super::policy::readiness(tenant, readiness);
        Ok(Outcome::new(readiness).requeue(requeue).status(move |s| {
            set_namespaces(s, &owned);
            s.cordoned = cordoned;
            s.quota_split.clone_from(&quota_split);
        }))
    }

    async fn cleanup(
        &self,
        tenant: &Tenant,
        pass: &mut Pass<Tenant>,
    ) -> Result<Cleanup<Tenant>, Error> {
        let done = super::finalize::finalize(tenant, pass).await;
        if matches!(done, Ok(Cleanup::Done)) {
            let uid = tenant.metadata.uid.as_deref().unwrap_or_default();
            self.ctx.usage.forget(uid);
            self.ctx.splits.forget(uid);
        }
        done
    }

    fn child_record(status: &mut TenantStatus) -> Option<&mut Vec<CreatedChild>> {
        Some(&mut status.created_children)
    }

    fn failed_status(&self, tenant: &Tenant, status: &mut TenantStatus) {
        // The namespaces that exist, so that the count does not say 0 while they are there.
        let listed = super::desired::namespace_names(tenant);
        set_namespaces(status, &self.ctx.namespaces_of(tenant, &listed));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use k8s_openapi::jiff::SignedDuration;

    use super::*;
    use crate::tenant::finalize::{DELETION_POLL_MAX, TERMINATING_POLL};

    fn ready(status: &str, reason: &str, since: Timestamp) -> Tenant {
        let mut t = Tenant::new("t", Default::default());
        t.status = Some(TenantStatus {
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: status.into(),
                reason: reason.into(),
                message: String::new(),
                last_transition_time: Time(since),
                observed_generation: None,
            }],
            ..TenantStatus::default()
        });
        t
    }

    #[test]
    fn a_tenant_waiting_for_a_held_deletion_is_looked_at_less_and_less_often() {
        let since = Timestamp::now();
        let after = |secs| Time(since + SignedDuration::from_secs(secs));
        let held = ready("False", "NamespaceTerminating", since);
        assert_eq!(
            waiting_poll(waiting_since(&held), after(0)),
            TERMINATING_POLL
        );
        assert_eq!(
            waiting_poll(waiting_since(&held), after(40)),
            Duration::from_secs(10)
        );
        // Stalled on a conflict, which its status names before the deletion it waits for.
        let stalled = ready("False", "NamespaceConflict", since);
        assert_eq!(
            waiting_poll(waiting_since(&stalled), after(3_600)),
            DELETION_POLL_MAX
        );
        // Ready until now: the wait has just begun.
        let was_ready = ready("True", "Reconciled", since);
        assert_eq!(
            waiting_poll(waiting_since(&was_ready), after(3_600)),
            TERMINATING_POLL
        );
    }

    #[test]
    fn a_tenant_waiting_for_several_things_looks_again_at_the_soonest_of_their_polls() {
        let since = Timestamp::now();
        let long_after = Time(since + SignedDuration::from_secs(3_600));
        let stalled = ready("False", "NamespaceConflict", since);
        let waits = |deletion, quota, conflict| Waits {
            deletion,
            quota,
            conflict,
        };
        // A held deletion waited on for an hour polls at its most; the conflict's is sooner.
        assert_eq!(
            waits(true, false, true).requeue(waiting_since(&stalled), long_after.clone()),
            Some(CONFLICT_POLL)
        );
        assert_eq!(
            waits(true, true, true).requeue(waiting_since(&stalled), long_after.clone()),
            Some(quota_split::HELD_POLL)
        );
        assert_eq!(
            waits(true, false, false).requeue(waiting_since(&stalled), long_after.clone()),
            Some(DELETION_POLL_MAX)
        );
        assert_eq!(
            waits(false, false, false).requeue(waiting_since(&stalled), long_after),
            None
        );
    }
}
