//! The example `BaseTenant` (runtime/examples/base_tenant.rs), reconciled by idem-runtime's
//! [`Driver`] one pass at a time, passes idem-tests' idempotence kit: repeat, race, crash,
//! faults, tamper and stale reads, against the real control plane.

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;

use std::sync::Arc;
use std::time::{Duration, Instant};

use base_tenant::{BaseTenant, BaseTenantSpec, BaseTenants};
use futures::StreamExt;
use idem_runtime::apply::{ChildCaches, TENANT_LABEL};
use idem_runtime::reconciler::Driver;
use idem_tests::kit::{BoxError, Children, Kit, Subject};
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

/// One controller process: the driver, reading children from watch caches on the kit's client.
struct Session {
    driver: Driver<BaseTenants>,
    client: Client,
    watches: Vec<JoinHandle<()>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        for w in &self.watches {
            w.abort();
        }
    }
}

/// Watches children of kind `K` (by the driver's label) into `caches`, once listed.
async fn cache<K>(client: &Client, caches: &ChildCaches) -> Result<JoinHandle<()>, BoxError>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let config = Driver::<BaseTenants>::children_config();
    let stream = reflector::reflector(writer, watcher(Api::<K>::all(client.clone()), config))
        .default_backoff()
        .for_each(|_| futures::future::ready(()));
    let task = tokio::spawn(stream);
    tokio::time::timeout(Duration::from_secs(30), store.wait_until_ready()).await??;
    caches.register(store);
    Ok(task)
}

struct BaseTenantSubject;

impl Subject for BaseTenantSubject {
    type Primary = BaseTenant;
    type Session = Session;

    fn primary(&self, name: &str) -> BaseTenant {
        let spec = BaseTenantSpec {
            owners: vec!["alice".into(), "bob".into()],
            cpu: "2".into(),
            memory: "4Gi".into(),
        };
        BaseTenant::new(name, spec)
    }

    fn children(&self, primary: &BaseTenant) -> Children {
        let name = primary.meta().name.clone().unwrap_or_default();
        Children::labelled(format!("{TENANT_LABEL}={name}"))
            .kind::<Namespace>()
            .kind::<ResourceQuota>()
            .kind::<LimitRange>()
            .kind::<RoleBinding>()
    }

    async fn session(&self, client: Client) -> Result<Session, BoxError> {
        let caches = ChildCaches::new();
        let watches = vec![
            cache::<Namespace>(&client, &caches).await?,
            cache::<ResourceQuota>(&client, &caches).await?,
            cache::<LimitRange>(&client, &caches).await?,
            cache::<RoleBinding>(&client, &caches).await?,
        ];
        let driver = Driver::new(client.clone(), BaseTenants).with_caches(caches);
        Ok(Session {
            driver,
            client,
            watches,
        })
    }

    async fn reconcile(&self, s: &Session, primary: Arc<BaseTenant>) -> Result<(), BoxError> {
        s.driver.reconcile_once(s.client.clone(), primary).await?;
        Ok(())
    }

    /// One owner more (the RoleBinding's subjects change).
    fn flipped(&self, primary: &BaseTenant) -> Option<BaseTenant> {
        let mut flipped = primary.clone();
        flipped.spec.owners.push("carol".into());
        Some(flipped)
    }

    fn settled(&self, primary: &BaseTenant) -> bool {
        primary.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    }
}

#[tokio::test]
async fn the_example_resource_passes_the_idempotence_kit() {
    let cp = idem_tests::shared();
    base_tenant::install_crd(&cp.client()).await.unwrap();
    let started = Instant::now();
    let report = Kit::new(cp, BaseTenantSubject).run_all().await.unwrap();
    eprintln!("kit run for BaseTenant: {:?}\n{report}", started.elapsed());
    report.assert_idempotent();
}
