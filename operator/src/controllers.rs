//! The operator's controllers as one set for idem-runtime's manager: Tenant and TenantApp
//! sharing a cache of the operator's namespaces, a Tenant sharded by its uid and a TenantApp by
//! its namespace (see [`crate::shard`]).

use idem_runtime::apply::{MANAGED_BY_LABEL, SHARD_BUCKET_LABEL};
use idem_runtime::manager::{Controllers, Running, Start};
use idem_runtime::reconciler::Driver;
use idem_runtime::schema::SchemaError;
use idem_runtime::shard::{ShardField, shard_hash};
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::Resource as _;
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::context::Context;
use crate::resources::{FIELD_MANAGER, Tenant, TenantApp};
use crate::shard::NAMESPACE_BUCKET_LABEL;
use crate::{tenant, tenant_app};

/// Tenant and TenantApp: add it to a [`idem_runtime::manager::Manager`] ([`crate::manager`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Operator;

/// The cleanup guards (policy, binding) of Tenant and TenantApp, labelled `labels`: only the
/// operator, once a cleanup is marked done, removes their finalizer from an object being
/// deleted (`deploy/operator/08-cleanup-guard.yaml`).
pub fn cleanup_guards(labels: &serde_json::Value) -> Vec<serde_json::Value> {
    use idem_runtime::reconciler::cleanup_guard::cleanup_guard;
    [
        cleanup_guard::<Tenant>(crate::resources::FINALIZER, labels),
        cleanup_guard::<TenantApp>(crate::resources::FINALIZER, labels),
    ]
    .into_iter()
    .flatten()
    .flatten()
    .collect()
}

impl Controllers for Operator {
    fn crds(&self) -> Result<Vec<CustomResourceDefinition>, SchemaError> {
        crate::resources::try_crds()
    }

    /// A Tenant by its uid, a TenantApp by its namespace; their children are selected by
    /// label (see [`crate::shard`]).
    fn sharded(&self) -> Vec<(String, ShardField)> {
        vec![
            (Tenant::url_path(&(), None), ShardField::Uid),
            (TenantApp::url_path(&(), None), ShardField::Namespace),
        ]
    }

    /// The operator's ClusterRole rules (`operator/src/rbac.rs`, what `cargo xtask manifests`
    /// writes in `deploy/operator/`).
    fn rules(&self) -> Vec<PolicyRule> {
        crate::rbac::policy_rules()
    }

    /// The cleanup guards of Tenant and TenantApp ([`cleanup_guards`]).
    fn admission(&self) -> Vec<serde_json::Value> {
        cleanup_guards(&serde_json::json!({}))
    }

    fn start(&self, start: Start<'_>) -> Running {
        let client: &Client = start.client;
        let shard = start.shard;
        // Sharded: only the namespaces of this replica's TenantApps (see `crate::shard`).
        let ns_buckets = shard.and_then(|s| {
            (s.ranges().label_selector(NAMESPACE_BUCKET_LABEL)).map(|b| format!(",{b}"))
        });
        let ns_config = watcher::Config::default().labels(&format!(
            "{MANAGED_BY_LABEL}={FIELD_MANAGER}{}",
            ns_buckets.unwrap_or_default()
        ));
        let config = |name: &str| idem_runtime::controller::ControllerConfig {
            name: Some(name.into()),
            ..start.config.clone()
        };
        let (tenant_synced, tenant_ready) = watch::channel(false);
        let (app_synced, app_ready) = watch::channel(false);
        let (tenants_listed_tx, tenants_listed) = watch::channel(false);
        let mut tenants =
            tenant::source::controller(client, config("tenant"), shard.map(|s| s.ranges()))
                .with_metrics(start.metrics.clone())
                .with_synced_signal(tenant_synced)
                .with_primary_synced_signal(tenants_listed_tx);
        let tenant_store = tenants.store();
        let mut apps = tenant_app::source::controller(
            client,
            ns_config,
            config("tenantapp"),
            tenants.store(),
            shard.map(|s| s.ranges()),
        )
        .with_metrics(start.metrics.clone())
        .with_synced_signal(app_synced)
        // Its reconciles and the namespaces' owner check read the Tenants' cache: a namespace
        // is judged by the Tenant it names only once the Tenants are listed.
        .workers_after(tenants_listed);
        // The apps' controller watches the operator's namespaces for their tenants; the
        // reconciles read them from there too (one watch, and per namespace only its tenant).
        let namespaces = apps
            .namespace_tenants()
            .expect("the TenantApp controller watches namespaces for their tenants");
        let ctx = Context::with_namespace_tenants(client.clone(), namespaces, start.caches.clone());
        let tenant_driver = driver(&start, tenant::reconcile::Tenants { ctx: ctx.clone() });
        let app_driver = driver(
            &start,
            tenant_app::reconcile::TenantApps { ctx: ctx.clone() },
        );
        let mut owned = None;
        if let Some(shard) = shard {
            let (by_uid, by_ns) = (shard.clone(), shard.clone());
            // A ring change lists only the children of the Tenants' buckets gained.
            tenants = tenants
                .shard(move |t| by_uid.owns(t.meta(), ShardField::Uid))
                .resume(SHARD_BUCKET_LABEL, shard.ranges().clone());
            if shard.lists_whole() {
                // Every replica keeps every Tenant (the TenantApps' reconciles read them).
                tenants = tenants.resume_primary();
            }
            // Nothing else reads the apps' cache (the Tenants' is read by the apps' reconciles,
            // so it keeps every Tenant): another replica's TenantApps, each up to ~1.3 MB, are
            // not kept here. Their children are selected by the bucket of their namespace,
            // which they carry; a ring change lists only those of the buckets gained.
            let share = shard.ranges().clone();
            apps = apps
                .shard(move |a| by_ns.owns(a.meta(), ShardField::Namespace))
                .shard_cache(move |a| share.contains(shard_hash(a.meta(), ShardField::Namespace)))
                .resume(NAMESPACE_BUCKET_LABEL, shard.ranges().clone());
            let shard = shard.clone();
            owned = Some(move || {
                (tenant_store.state().iter())
                    .filter(|t| {
                        shard
                            .ranges()
                            .contains(shard_hash(t.meta(), ShardField::Uid))
                    })
                    .count()
            });
        }
        let (synced_tx, synced) = watch::channel(false);
        let readiness = tokio::spawn(idem_runtime::controller::all_ready(
            vec![tenant_ready, app_ready],
            synced_tx,
        ));
        let (tenant_stop, app_stop) = (start.stopping(), start.stopping());
        let stopped = async move {
            let (t, a) = futures::future::join(
                tenant_driver.run(tenants, tenant_stop),
                app_driver.run(apps, app_stop),
            )
            .await;
            vec![("tenant".to_string(), t), ("tenantapp".to_string(), a)]
        };
        let mut running = Running::new(stopped, synced)
            .with_task(readiness)
            .with_caches(ctx.caches.clone());
        if let Some(owned) = owned {
            running = running.counting(owned);
        }
        running
    }
}

/// A driver of `reconciler` as both of the operator's are made: the run's client, child caches,
/// drift metrics and Event reporter.
fn driver<R>(start: &Start<'_>, reconciler: R) -> Driver<R>
where
    R: idem_runtime::reconciler::Reconciler,
    <R::Resource as kube::Resource>::Scope: idem_runtime::apply::ChildScope,
{
    Driver::new(start.client.clone(), reconciler)
        .with_caches(start.caches.clone())
        .with_drift_metrics(start.drift.clone())
        .with_reporter(start.reporter.clone())
}
