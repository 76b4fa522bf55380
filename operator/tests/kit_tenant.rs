//! The idempotence test kit on the operator's Tenant and TenantApp: repeat, race, crash,
//! faults, tamper and stale reads (a third namespace, or another config, flipped in and out
//! while watch events arrive late) on a tenant with two namespaces and every kind of child, and on an app
//! (ConfigMap, Deployment, Service) in a tenant namespace, each reconciled the way the operator
//! does it: the operator's `Driver` of `Tenants`, one `reconcile_once` per pass, children read
//! from watch caches filled by the session's own watches.
//!
//! Prints the kit's report with its run time (`cargo test -p idem-operator --test kit_tenant
//! -- --nocapture`).

mod common;

use std::sync::Arc;

use common::{apps, install_crds, tenants};
use futures::StreamExt;
use idem_operator::context::Context;
use idem_operator::resources::tenant_policy::{Allowed, ClassName, Registry};
use idem_operator::resources::{TENANT_LABEL, Tenant, TenantApp, TenantPolicy};
use idem_operator::tenant::reconcile::Tenants;
use idem_operator::tenant::source::children_config;
use idem_operator::tenant_app::reconcile::TenantApps;
use idem_runtime::apply::{ChildScope, OWNER_UID_LABEL};
use idem_runtime::reconciler::{Driver, Reconciler};
use idem_tests::kit::{BoxError, Check, Children, Kit, Report, Subject};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, LimitRange, Namespace, ResourceQuota, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::task::JoinHandle;

/// Tenants with namespaces `dev` and `prod`, quota, limits, two owners and isolation.
struct TenantKind;

/// What one operator process keeps between reconciles: a driver on the operator's context
/// (namespace cache, child caches of both controllers), and the watches filling the caches.
struct Session<R: Reconciler> {
    client: Client,
    driver: Driver<R>,
    watches: Vec<JoinHandle<()>>,
}

impl<R: Reconciler> Drop for Session<R> {
    fn drop(&mut self) {
        for w in &self.watches {
            w.abort();
        }
    }
}

/// Watches kind `C` as the Tenant controller does (managed-by label) into a store; returns it
/// once listed.
async fn cache<C>(client: &Client, watches: &mut Vec<JoinHandle<()>>) -> Result<Store<C>, BoxError>
where
    C: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Serialize + DeserializeOwned,
    C: Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<C>();
    watches.push(tokio::spawn(
        watcher(Api::<C>::all(client.clone()), children_config())
            .default_backoff()
            .reflect(writer)
            .for_each(|_| futures::future::ready(())),
    ));
    store.wait_until_ready().await?;
    Ok(store)
}

/// A session on `client`: the operator's context with every child kind of both controllers
/// cached as the operator caches it, and a driver of the reconciler `make` builds.
async fn session<R: Reconciler>(
    client: Client,
    make: impl FnOnce(Arc<Context>) -> R,
) -> Result<Session<R>, BoxError>
where
    <R::Resource as Resource>::Scope: ChildScope,
{
    let mut watches = Vec::new();
    let namespaces = cache::<Namespace>(&client, &mut watches).await?;
    let ctx = Context::new(client.clone(), namespaces.clone());
    let caches = &ctx.caches;
    caches.register(namespaces);
    caches.register(cache::<ResourceQuota>(&client, &mut watches).await?);
    caches.register(cache::<LimitRange>(&client, &mut watches).await?);
    caches.register(cache::<RoleBinding>(&client, &mut watches).await?);
    caches.register(cache::<NetworkPolicy>(&client, &mut watches).await?);
    caches.register(cache::<TenantPolicy>(&client, &mut watches).await?);
    caches.register(cache::<ConfigMap>(&client, &mut watches).await?);
    caches.register(cache::<Deployment>(&client, &mut watches).await?);
    caches.register(cache::<Service>(&client, &mut watches).await?);
    let driver = Driver::new(client.clone(), make(ctx.clone())).with_caches(ctx.caches.clone());
    Ok(Session {
        client,
        driver,
        watches,
    })
}

/// Removes annotation `key` (and an annotation map it leaves empty) from a child.
fn drop_annotation(child: &mut Value, key: &str) {
    let Some(meta) = child.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
        a.remove(key);
        if a.is_empty() {
            meta.remove("annotations");
        }
    }
}

/// Whether a status observed `generation` and says `Ready`.
fn ready_at(generation: Option<i64>, observed: Option<i64>, conditions: &[Condition]) -> bool {
    observed == generation
        && conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

impl Subject for TenantKind {
    type Primary = Tenant;
    type Session = Session<Tenants>;

    /// Every feature, including a tenant-wide quota, allowed classes and registries and a cordon
    /// (their TenantPolicies; no admission policy is installed in this binary, so nothing is refused).
    fn primary(&self, name: &str) -> Tenant {
        let mut spec = tenants::full_spec(&["dev", "prod"]);
        spec.allowed = Some(Allowed {
            storage_classes: Some(vec![ClassName::from("standard")]),
            priority_classes: Some(vec![]),
            registries: Some(vec![Registry::from("docker.io/library")]),
            ..Allowed::default()
        });
        spec.cordoned = true;
        // A tenant-wide total split over the two namespaces' quotas (15 pods each, at most the
        // per-namespace 20), read from the quotas' status.
        if let Some(quota) = spec.quota.as_mut() {
            quota.tenant_hard = tenants::quantities(&[("pods", "30"), ("count/configmaps", "40")]);
        }
        Tenant::new(name, spec)
    }

    fn children(&self, tenant: &Tenant) -> Children {
        Children::labelled(format!("{TENANT_LABEL}={}", tenant.name_any()))
            .kind::<Namespace>()
            .kind::<ResourceQuota>()
            .kind::<LimitRange>()
            .kind::<RoleBinding>()
            .kind::<NetworkPolicy>()
            .kind::<TenantPolicy>()
    }

    /// `Ready` at its generation: not before a namespace no longer desired is gone (the
    /// Tenant says `NamespaceTerminating` while one is held, and keeps it in its record).
    fn settled(&self, tenant: &Tenant) -> bool {
        let status = tenant.status.clone().unwrap_or_default();
        ready_at(
            tenant.metadata.generation,
            status.observed_generation,
            &status.conditions,
        )
    }

    async fn session(&self, client: Client) -> Result<Session<Tenants>, BoxError> {
        session(client, |ctx| Tenants { ctx }).await
    }

    /// One namespace more (`extra`), with all that goes in it.
    fn flipped(&self, tenant: &Tenant) -> Option<Tenant> {
        let mut flipped = tenant.clone();
        flipped.spec.namespaces.push("extra".into());
        Some(flipped)
    }

    async fn reconcile(
        &self,
        session: &Session<Tenants>,
        tenant: Arc<Tenant>,
    ) -> Result<(), BoxError> {
        session
            .driver
            .reconcile_once(session.client.clone(), tenant)
            .await?;
        Ok(())
    }
}

/// TenantApps of one replica in the `apps` namespace of a tenant of their own.
struct AppKind {
    namespace: String,
}

impl AppKind {
    /// Creates a tenant with namespace `apps` and reconciles it until the namespace exists.
    async fn new() -> Self {
        let client = idem_tests::shared().client();
        let name = idem_tests::unique_name("kitapps");
        let tenant = tenants::create(&client, &name, tenants::full_spec(&["apps"])).await;
        let session = TenantKind.session(client.clone()).await.expect("a session");
        let namespace = format!("{name}-apps");
        for _ in 0..10 {
            let tenant = Api::<Tenant>::all(client.clone())
                .get(&tenant.name_any())
                .await
                .expect("the tenant");
            TenantKind
                .reconcile(&session, Arc::new(tenant))
                .await
                .expect("the tenant reconciles");
            let ns = Api::<Namespace>::all(client.clone())
                .get_opt(&namespace)
                .await;
            if matches!(ns, Ok(Some(_))) {
                break;
            }
        }
        Self { namespace }
    }
}

impl Subject for AppKind {
    type Primary = TenantApp;
    type Session = Session<TenantApps>;

    fn primary(&self, name: &str) -> TenantApp {
        let mut app = TenantApp::new(name, apps::spec(1, "greeting = 'hi'"));
        app.metadata.namespace = Some(self.namespace.clone());
        app
    }

    fn children(&self, app: &TenantApp) -> Children {
        Children::labelled(format!(
            "{OWNER_UID_LABEL}={}",
            app.uid().unwrap_or_default()
        ))
        .kind::<ConfigMap>()
        .kind::<Deployment>()
        .kind::<Service>()
    }

    /// The Service's cluster IPs (allocated at random) and the Deployment's revision (counted
    /// by the Deployment controller on each template change).
    fn normalize(&self, child: &mut Value) {
        drop_annotation(child, "deployment.kubernetes.io/revision");
        if let Some(spec) = child.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("clusterIP");
            spec.remove("clusterIPs");
        }
    }

    /// Ready for the current generation: the Deployment is available.
    fn settled(&self, app: &TenantApp) -> bool {
        let status = app.status.clone().unwrap_or_default();
        ready_at(
            app.metadata.generation,
            status.observed_generation,
            &status.conditions,
        )
    }

    async fn session(&self, client: Client) -> Result<Session<TenantApps>, BoxError> {
        session(client, |ctx| TenantApps { ctx }).await
    }

    /// Another config file (its ConfigMap and the Deployment's template change).
    fn flipped(&self, app: &TenantApp) -> Option<TenantApp> {
        let mut flipped = app.clone();
        flipped
            .spec
            .config
            .insert("extra.toml".into(), "flipped = true".into());
        Some(flipped)
    }

    async fn reconcile(
        &self,
        session: &Session<TenantApps>,
        app: Arc<TenantApp>,
    ) -> Result<(), BoxError> {
        session
            .driver
            .reconcile_once(session.client.clone(), app)
            .await?;
        Ok(())
    }
}

/// The kit's report for `subject` with `checks`, printed with its run time.
async fn run<S: Subject>(what: &str, subject: S, checks: &[Check]) -> Report {
    let report = Kit::new(idem_tests::shared(), subject)
        .checks(checks)
        .run_all()
        .await
        .expect("the kit runs");
    eprintln!("{what}:\n{report}");
    report
}

/// Installs the CRDs once per test binary.
async fn crds() {
    static ONCE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    ONCE.get_or_init(install_crds_now).await;
}

async fn install_crds_now() {
    install_crds(&idem_tests::shared().client()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_passes_every_check() {
    crds().await;
    let report = run("Tenant", TenantKind, &Check::ALL).await;
    report.assert_idempotent();
    let tamper = report.get(Check::Tamper).expect("tamper ran");
    let fields: u32 = tamper
        .figure_value("fields tampered")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        fields >= 40,
        "two namespaces with five children of labels, annotations and specs\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_app_passes_every_check() {
    crds().await;
    let report = run("TenantApp", AppKind::new().await, &Check::ALL).await;
    report.assert_idempotent();
}
