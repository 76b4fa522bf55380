//! The bench's BaseTenant controller on a plain kube-runtime 5 `Controller`, written as a
//! kube-rs user would: every reconcile applies every child and the status with server-side
//! apply (`force`), 16 concurrent reconciles.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures::StreamExt;
use idem_bench::{
    BaseTenant, BaseTenantStatus, ControllerArgs, MANAGED_BY_LABEL, PEER_MANAGER, desired,
};
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

struct Ctx {
    client: Client,
    resync: Option<Duration>,
}

/// Sets the controller owner reference and the managed-by label on a child.
fn own(meta: &mut ObjectMeta, bt: &BaseTenant) {
    meta.owner_references = Some(vec![bt.controller_owner_ref(&()).expect("a stored object")]);
    meta.labels = Some([(MANAGED_BY_LABEL.to_owned(), PEER_MANAGER.to_owned())].into());
}

async fn apply<K>(api: Api<K>, obj: &K) -> Result<(), kube::Error>
where
    K: Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
{
    let pp = PatchParams::apply(PEER_MANAGER).force();
    api.patch(&obj.name_any(), &pp, &Patch::Apply(obj)).await?;
    Ok(())
}

async fn reconcile(bt: Arc<BaseTenant>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    idem_bench::report_reconcile(&bt);
    let c = &ctx.client;
    let mut d = desired(&bt);
    for ns in &mut d.namespaces {
        own(&mut ns.metadata, &bt);
        apply(Api::all(c.clone()), ns).await?;
    }
    for i in 0..d.namespaces.len() {
        let ns = d.namespaces[i].name_any();
        own(&mut d.quotas[i].metadata, &bt);
        own(&mut d.limits[i].metadata, &bt);
        own(&mut d.bindings[i].metadata, &bt);
        apply(Api::namespaced(c.clone(), &ns), &d.quotas[i]).await?;
        apply(Api::namespaced(c.clone(), &ns), &d.limits[i]).await?;
        apply(Api::namespaced(c.clone(), &ns), &d.bindings[i]).await?;
    }
    // Keep the transition time of an unchanged Ready condition, as API conventions ask.
    let since = bt
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == "True")
        })
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(now);
    let status = BaseTenantStatus {
        observed_generation: bt.metadata.generation,
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Reconciled".into(),
            message: format!("{} children applied", d.namespaces.len() * 4),
            last_transition_time: since,
            observed_generation: bt.metadata.generation,
        }],
    };
    let body = json!({
        "apiVersion": BaseTenant::api_version(&()),
        "kind": BaseTenant::kind(&()),
        "status": status,
    });
    Api::<BaseTenant>::all(c.clone())
        .patch_status(
            &bt.name_any(),
            &PatchParams::apply(PEER_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    Ok(match ctx.resync {
        Some(period) => Action::requeue(period),
        None => Action::await_change(),
    })
}

fn error_policy(_: Arc<BaseTenant>, err: &kube::Error, _: Arc<Ctx>) -> Action {
    tracing::warn!("reconcile failed: {err}");
    Action::requeue(Duration::from_secs(2))
}

/// A namespaced child's owner: kube-runtime's `owns` would look the cluster-scoped owner up
/// in the child's namespace, so namespaced children map through `watches` instead.
fn owner_of<C: Resource>(child: C) -> Option<ObjectRef<BaseTenant>> {
    child
        .owner_references()
        .iter()
        .find(|r| r.controller == Some(true) && r.kind == "BaseTenant")
        .map(|r| ObjectRef::new(&r.name))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = ControllerArgs::parse();
    idem_bench::init_logging();
    let client = args.client().await?;
    let children =
        || watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={PEER_MANAGER}"));
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        resync: args.resync(),
    });
    let controller = Controller::new(
        Api::<BaseTenant>::all(client.clone()),
        watcher::Config::default().labels(&args.run_selector()),
    );
    let store = controller.store();
    tokio::spawn(async move {
        // The store's readiness wakes only its last waiter (a oneshot receiver) and the
        // controller waits on it too, so poll it again now and then.
        loop {
            let ready = tokio::time::timeout(Duration::from_millis(50), store.wait_until_ready());
            if let Ok(result) = ready.await {
                if result.is_ok() {
                    idem_bench::report_synced();
                }
                return;
            }
        }
    });
    controller
        .owns(Api::<Namespace>::all(client.clone()), children())
        .watches(
            Api::<ResourceQuota>::all(client.clone()),
            children(),
            owner_of,
        )
        .watches(Api::<LimitRange>::all(client.clone()), children(), owner_of)
        .watches(
            Api::<RoleBinding>::all(client.clone()),
            children(),
            owner_of,
        )
        .with_config(Config::default().concurrency(args.workers as u16))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            if let Err(e) = result {
                tracing::warn!("controller: {e}");
            }
            futures::future::ready(())
        })
        .await;
    Ok(())
}

/// Now, in whole seconds (as `metav1.Time` is serialised).
fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}
