//! One reconcile of a Tenant: finalizer, namespaces, their contents, status; and cleanup on
//! deletion (the finalizer is removed only once every namespace of the tenant is gone).

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::TenantKey;
use idem_runtime::apply::{DesiredChildren, OWNER_UID_LABEL, Owner};
use idem_runtime::controller::{Action, Attempt};
use idem_runtime::resource::IdempotentResource as _;
use idem_runtime::status::{Readiness, StatusWriter};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
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
            let _ = write_status(&ctx, &tenant, None, &readiness).await;
        }
    }
    result
}

async fn reconcile_inner(tenant: &Tenant, ctx: &Context) -> Result<Action, Error> {
    let name = tenant.name_any();
    let owner = Owner::new(tenant, Tenant::FIELD_MANAGER, Some(TenantKey::new(&name)))?;
    if tenant.meta().deletion_timestamp.is_some() {
        return finalize(tenant, ctx, &owner).await;
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

/// Deletes every namespace the tenant owns and waits until they are gone before removing the
/// finalizer, so deleting a Tenant leaves nothing behind.
async fn finalize(tenant: &Tenant, ctx: &Context, owner: &Owner) -> Result<Action, Error> {
    let writer = StatusWriter::new(Api::<Tenant>::all(ctx.client.clone()));
    if !tenant.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let mut all = DesiredChildren::new();
    all.prune_kind::<Namespace>();
    let report = ctx.applier.reconcile(owner, &all).await?;
    events::children(&ctx.recorder, &tenant.object_ref(&()), &report).await;
    let uid = tenant.uid().unwrap_or_default();
    let left = Api::<Namespace>::all(ctx.client.clone())
        .list_metadata(&ListParams::default().labels(&format!("{OWNER_UID_LABEL}={uid}")))
        .await?;
    if !left.items.is_empty() {
        let names: Vec<String> = left.items.iter().map(|n| n.name_any()).collect();
        let readiness = Readiness::Reconciling {
            reason: "Deleting".into(),
            message: format!("waiting for namespaces to be deleted: {}", names.join(", ")),
        };
        write_status(ctx, tenant, None, &readiness).await?;
        return Ok(Action::requeue(TERMINATING_POLL));
    }
    writer.remove_finalizer(tenant, FINALIZER).await?;
    Ok(Action::await_change())
}

/// Writes conditions (and the namespace list when given), only if something changed, and
/// publishes an event when `Ready` changes.
async fn write_status(
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
