//! One reconcile of a Tenant: finalizer, namespaces, their contents, status; on deletion the
//! cleanup of [`super::finalize`].

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::TenantKey;
use idem_runtime::apply::Owner;
use idem_runtime::controller::{Action, Attempt};
use idem_runtime::resource::IdempotentResource as _;
use idem_runtime::status::{Readiness, StatusWriter};
use kube::api::Api;
use kube::{Resource, ResourceExt};

use super::desired;
use super::status::{self, NamespacePass};
use crate::context::{Context, STALLED_AFTER_FAILURES};
use crate::error::Error;
use crate::events;
use crate::resources::{FINALIZER, Tenant};

/// How often a tenant whose namespaces are still being deleted is looked at again.
pub const TERMINATING_POLL: Duration = Duration::from_secs(2);

/// How often a tenant stalled on a namespace conflict is looked at again. No watch event
/// tells it when the namespace is released: an unmanaged namespace is not watched at all, and
/// another tenant's namespace maps to that other tenant. A conflicted reconcile writes nothing
/// (its status is unchanged), so this slow poll costs a few reads.
pub const CONFLICT_POLL: Duration = Duration::from_secs(30);

/// Reconciles one Tenant; on failure, after [`STALLED_AFTER_FAILURES`] attempts in a row the
/// status says `Stalled` with reason `ReconcileFailed` (the error is still returned, so the
/// key keeps retrying with backoff).
///
/// # Errors
/// [`Error`] from the API; the controller retries with per-key backoff.
pub async fn reconcile(
    tenant: Arc<Tenant>,
    ctx: Arc<Context>,
    attempt: Attempt,
) -> Result<Action, Error> {
    let result = reconcile_inner(&tenant, &ctx).await;
    if let Err(e) = &result {
        let failures = attempt.failures + 1;
        if failures >= STALLED_AFTER_FAILURES {
            let readiness = status::failed(failures, &e.to_string());
            // The namespaces that exist, so that the count does not say 0 while they are there.
            let namespaces = ctx.namespaces_of(&tenant.name_any());
            let _ = write_status(&ctx, &tenant, Some(&namespaces), &readiness).await;
        }
    }
    result
}

async fn reconcile_inner(tenant: &Tenant, ctx: &Context) -> Result<Action, Error> {
    let name = tenant.name_any();
    let owner = Owner::new(tenant, Tenant::FIELD_MANAGER, Some(TenantKey::new(&name)))?;
    if tenant.meta().deletion_timestamp.is_some() {
        return super::finalize::finalize(tenant, ctx, &owner).await;
    }
    let writer = StatusWriter::new(Api::<Tenant>::all(ctx.client.clone()));
    let added;
    let tenant = match writer.add_finalizer(tenant, FINALIZER).await? {
        Some(updated) => {
            added = updated;
            &added
        }
        None => tenant,
    };
    if tenant.spec.paused {
        let readiness = Readiness::Stalled {
            reason: "Paused".into(),
            message: "spec.paused is true: children are neither applied nor pruned".into(),
        };
        write_status(ctx, tenant, None, &readiness).await?;
        return Ok(Action::await_change());
    }

    let ns_report = ctx
        .applier
        .reconcile(&owner, &desired::namespaces(tenant)?)
        .await?;
    let pass = NamespacePass::from_report(&ns_report);
    let contents = ctx
        .applier
        .reconcile(&owner, &desired::contents(tenant, &pass.owned)?)
        .await?;
    let reference = tenant.object_ref(&());
    events::children(&ctx.recorder, &reference, &ns_report).await;
    events::children(&ctx.recorder, &reference, &contents).await;
    let readiness = status::readiness(&pass, &contents);
    write_status(ctx, tenant, Some(&pass.owned), &readiness).await?;
    if !pass.terminating.is_empty() {
        Ok(Action::requeue(TERMINATING_POLL))
    } else if !pass.conflicts.is_empty() {
        Ok(Action::requeue(CONFLICT_POLL))
    } else {
        Ok(Action::await_change())
    }
}

/// Writes conditions (and the namespace list when given), only if something changed, and
/// publishes an event when `Ready` changes.
pub(crate) async fn write_status(
    ctx: &Context,
    tenant: &Tenant,
    namespaces: Option<&[String]>,
    readiness: &Readiness,
) -> Result<(), Error> {
    let api = Api::<Tenant>::all(ctx.client.clone());
    crate::status::write(ctx, api, tenant, readiness, |status| {
        if let Some(namespaces) = namespaces {
            status.namespaces = namespaces.to_vec();
            status.namespace_count = namespaces.len() as i32;
        }
    })
    .await
}
