//! Against the real control plane: what a controller's child caches keep of a child — no
//! `status` unless the kind is owned with `OwnsOptions::reading_status`, no
//! `kubectl.kubernetes.io/last-applied-configuration` copy, no `managedFields` timestamps —
//! and that everything the apply engine reads is still there; and that a primary is kept (and
//! given to the reconcile) without its `managedFields`.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{Echo, EchoSpec, Widget, install_echo, install_widget, namespace, wait_until};
use idem_runtime::apply::ChildCaches;
use idem_runtime::controller::{Action, Attempt, Controller, OwnsOptions};
use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(90);
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

async fn noop(_: Arc<Widget>, _: Arc<()>, _: Attempt) -> Result<Action, kube::Error> {
    Ok(Action::await_change())
}

/// The cached copy of `name` once it is at `rv` (the caches follow the watch).
fn cached_at<K>(caches: &ChildCaches, ns: &str, name: &str, rv: &str) -> Option<K>
where
    K: Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    caches
        .lookup::<K>(Some(ns), name)
        .flatten()
        .filter(|o| o.meta().resource_version.as_deref() == Some(rv))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_caches_drop_what_the_engine_never_reads_and_keep_read_status() {
    let client = idem_tests::shared().client();
    install_widget(&client).await;
    install_echo(&client).await;
    let ns = namespace(&client, "ctl-child-caches").await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let echoes: Api<Echo> = Api::namespaced(client.clone(), &ns);
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    let caches = ChildCaches::new();
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::new(widgets, watcher::Config::default())
            .owns(quotas.clone(), watcher::Config::default())
            .owns_with(
                echoes.clone(),
                watcher::Config::default(),
                OwnsOptions::reading_status(),
            )
            .with_child_caches(caches.clone())
            .run(noop, Arc::new(()), async {
                let _ = stopped.await;
            }),
    );

    // A quota created the way client-side `kubectl apply` does (a copy of itself in an
    // annotation); the controller-manager then writes its status.
    let quota = ResourceQuota {
        metadata: ObjectMeta {
            name: Some("q".into()),
            annotations: Some(BTreeMap::from([
                (
                    LAST_APPLIED.to_owned(),
                    "{\"kind\":\"ResourceQuota\"}".to_owned(),
                ),
                ("keep".to_owned(), "me".to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(BTreeMap::from([("pods".to_owned(), Quantity("3".into()))])),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    };
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    let live = loop {
        let q = quotas.get("q").await.unwrap();
        if q.status.as_ref().and_then(|s| s.used.as_ref()).is_some() {
            break q;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "quota status written"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let rv = live.resource_version().unwrap();
    wait_until("the quota with its status in the cache", WAIT, || {
        cached_at::<ResourceQuota>(&caches, &ns, "q", &rv).is_some()
    })
    .await;
    let cached = cached_at::<ResourceQuota>(&caches, &ns, "q", &rv).unwrap();
    assert!(
        live.status.is_some() && cached.status.is_none(),
        "status: {cached:?}"
    );
    let annotations = cached.metadata.annotations.clone().unwrap_or_default();
    assert!(!annotations.contains_key(LAST_APPLIED), "{annotations:?}");
    assert_eq!(annotations.get("keep").map(String::as_str), Some("me"));
    let entries = cached.metadata.managed_fields.clone().unwrap_or_default();
    assert!(!entries.is_empty(), "managedFields kept");
    assert!(
        entries
            .iter()
            .all(|e| e.time.is_none() && e.fields_v1.is_some()),
        "{entries:?}"
    );
    assert_eq!(cached.spec, live.spec, "spec kept as the server has it");
    assert_eq!(cached.metadata.uid, live.metadata.uid);

    // A kind whose status the reconcile reads keeps it.
    echoes
        .create(
            &PostParams::default(),
            &Echo::new("e", EchoSpec { value: 1 }),
        )
        .await
        .unwrap();
    let status = json!({"status": {"observedGeneration": 1, "reconciles": 7}});
    let live = echoes
        .patch_status("e", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let rv = live.resource_version().unwrap();
    wait_until("the echo with its status in the cache", WAIT, || {
        cached_at::<Echo>(&caches, &ns, "e", &rv).is_some()
    })
    .await;
    let cached = cached_at::<Echo>(&caches, &ns, "e", &rv).unwrap();
    assert_eq!(cached.status.map(|s| s.reconciles), Some(7));

    stop.send(()).unwrap();
    controller.await.unwrap().unwrap();
}

/// Whether each primary a reconcile was given carried managedFields.
async fn report_managed_fields(
    widget: Arc<Widget>,
    seen: Arc<tokio::sync::mpsc::UnboundedSender<(String, bool)>>,
    _: Attempt,
) -> Result<Action, kube::Error> {
    let _ = seen.send((widget.name_any(), widget.metadata.managed_fields.is_some()));
    Ok(Action::await_change())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primaries_are_kept_and_given_without_managed_fields() {
    let client = idem_tests::shared().client();
    install_widget(&client).await;
    let ns = namespace(&client, "ctl-primary-mf").await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let widget = Widget::new("w", common::WidgetSpec { value: 1 });
    let created = widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    assert!(
        created.metadata.managed_fields.is_some(),
        "the server records who wrote the widget: {created:?}"
    );
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default()).run(
            report_managed_fields,
            Arc::new(tx),
            async {
                let _ = stopped.await;
            },
        ),
    );
    // The widget as the reconcile got it: whether it carried managedFields.
    let mut next = async |what: &str| {
        let (name, had) = tokio::time::timeout(WAIT, seen.recv())
            .await
            .unwrap_or_else(|_| panic!("{what} reconciled"))
            .unwrap();
        assert_eq!(name, "w");
        had
    };
    assert!(
        !next("the widget").await,
        "a listed primary is given without managedFields"
    );
    // A change arrives by the watch, not the list.
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"value": 2}})),
        )
        .await
        .unwrap();
    assert!(
        !next("the change").await,
        "a watched primary is given without managedFields"
    );
    let _ = stop.send(());
    controller.await.unwrap().unwrap();
}
