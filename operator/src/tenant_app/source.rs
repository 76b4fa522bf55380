//! What the TenantApp controller watches: TenantApps, and the children of the kinds
//! [`TenantApps`] declares (ConfigMaps, Deployments, Services) labelled
//! `app.kubernetes.io/managed-by` (when sharded, and with the bucket of a namespace this
//! replica owns). The tenant of an app is what its derive's
//! rule says (`tenant = namespace_label("tenancy.idem.dev/tenant")`), read from the runtime's
//! metadata-only watch of the operator's namespaces, and only from namespaces a Tenant controls
//! (see [`crate::context::tenant_of`]). The reconcile reads the Deployment's status
//! (`TenantApps::children` declares it `owns_reading_status`), so the Deployment's watch keeps it.
//! Its weight in the fair queue is that Tenant's `spec.weight`, read from the Tenant
//! controller's cache at every dispatch, so a weight change applies at once.
//! Foreign objects that block a child's name are watched one by one by the runtime
//! (`idem_runtime::controller::blocked`).

use idem_runtime::TenantKey;
use idem_runtime::controller::{Controller, ControllerConfig};
use idem_runtime::shard::Ranges;
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::reconcile::TenantApps;
use crate::resources::{Tenant, TenantApp};
use crate::shard::NAMESPACE_BUCKET_LABEL;
use crate::tenant::source::sharded_children_config;

/// The TenantApp controller, not yet running; `tenants` is the Tenant controller's cache
/// (see [`Controller::store`]), where each app's weight is read; `namespaces` selects the
/// namespaces whose tenants it watches (the operator's, of this replica's share); with
/// `shard`, its child watches select only the children in the namespaces of this replica's
/// buckets, by the label [`NAMESPACE_BUCKET_LABEL`] the apps put on them.
pub fn controller(
    client: &Client,
    namespaces: watcher::Config,
    config: ControllerConfig,
    tenants: Store<Tenant>,
    shard: Option<&Ranges>,
) -> Controller<TenantApp> {
    Controller::for_reconciler_with::<TenantApps>(
        client,
        watcher::Config::default(),
        sharded_children_config(shard, NAMESPACE_BUCKET_LABEL),
    )
    // A namespace names a tenant only when that Tenant controls it: by the label and the
    // controller reference's name, and at each read by its uid, which must be the Tenant's
    // (a Tenant this replica does not know yet is the garbage collector's to judge).
    .namespace_tenants_with(namespaces, |meta| {
        crate::context::tenant_of_meta(meta).is_some()
    })
    .namespace_tenant_owner({
        let tenants = tenants.clone();
        move |tenant: &TenantKey, uid: &str| {
            crate::context::is_tenants_uid(&tenants, tenant.as_str(), uid)
        }
    })
    .tenant_weight(move |tenant: &TenantKey| {
        let t = tenants.get(&ObjectRef::new(tenant.as_str()))?;
        Some(crate::tenant::source::weight(&t))
    })
    .with_config(config)
}
