//! Against a real control plane that forgets its history within seconds
//! (`--etcd-compaction-interval=1s`): a controller run on the child caches an earlier run left,
//! with [`Controller::resume`], whose store is complete to a version the API server no longer
//! has, lists its whole share and ends with the right children: one deleted between the runs
//! gone, one created between them and those of the buckets it gained there, as the API server
//! has them. The earlier run's watch, for the buckets it held, went on from its store.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{Widget, install_widget, namespace};
use idem_runtime::apply::{ChildCaches, Labels, SHARD_BUCKET_LABEL};
use idem_runtime::controller::{Action, Attempt, Controller};
use idem_runtime::shard::{Ranges, Ring};
use idem_tests::{ControlPlane, Options};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, VersionMatch};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(120);

/// The label every child of the test carries (the base of the child watch's selector).
const CHILD: &str = "test.idem.dev/resume";

async fn nothing(_: Arc<Widget>, _: Arc<()>, _: Attempt) -> Result<Action, String> {
    Ok(Action::await_change())
}

/// A child ConfigMap `name` in `ns` labelled with shard bucket `bucket`.
async fn child(client: &Client, ns: &str, name: &str, bucket: usize) {
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                (CHILD.to_owned(), "1".to_owned()),
                (SHARD_BUCKET_LABEL.to_owned(), bucket.to_string()),
            ])),
            ..Default::default()
        },
        ..Default::default()
    };
    (Api::<ConfigMap>::namespaced(client.clone(), ns))
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
}

/// One run of a controller of widgets owning the child ConfigMaps of `buckets` in `ns`, on
/// `caches`, until the returned sender stops it; returns once its caches are synced.
async fn run(
    client: &Client,
    ns: &str,
    caches: &ChildCaches,
    buckets: &Ranges,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let selector = match buckets.label_selector(SHARD_BUCKET_LABEL) {
        Some(b) => format!("{CHILD},{b}"),
        None => CHILD.to_owned(),
    };
    let (synced_tx, mut synced) = tokio::sync::watch::channel(false);
    let controller = Controller::new(
        Api::<Widget>::namespaced(client.clone(), ns),
        watcher::Config::default(),
    )
    .owns(
        Api::<ConfigMap>::namespaced(client.clone(), ns),
        watcher::Config::default().labels(&selector),
    )
    .with_child_caches(caches.clone())
    .resume(Labels::operator().shard_bucket(), buckets.clone())
    .with_synced_signal(synced_tx);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        controller
            .run(nothing, Arc::new(()), async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    tokio::time::timeout(WAIT, synced.wait_for(|s| *s))
        .await
        .expect("synced")
        .unwrap();
    (stop, task)
}

/// Whether the caches hold `name` (`Some(false)`: they say it does not exist).
fn cached(caches: &ChildCaches, ns: &str, name: &str) -> Option<bool> {
    caches
        .lookup::<ConfigMap>(Some(ns), name)
        .map(|c| c.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_caches_version_is_forgotten_lists_its_whole_share() {
    let (subscriber, logs) = idem_tests::logs::subscriber(tracing::Level::INFO);
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let options = Options {
        apiserver_args: vec!["--etcd-compaction-interval=1s".into()],
        ..Options::default()
    };
    let cp = tokio::task::block_in_place(|| ControlPlane::start_with(options))
        .expect("starting a control plane");
    let client = cp.client();
    install_widget(&client).await;
    let ns = namespace(&client, "ctl-resume").await;
    // The first run holds a's buckets of a ring of two; the second every bucket.
    let ring = Ring::new(["a", "b"]);
    let (first, second) = (ring.ranges_of("a"), Ranges::all());
    let mine = first.buckets().next().unwrap();
    let theirs = (0..).find(|b| !first.holds(*b)).unwrap();
    child(&client, &ns, "kept", mine).await;
    child(&client, &ns, "deleted", mine).await;
    child(&client, &ns, "gained", theirs).await;
    let caches = ChildCaches::new();
    let (stop, task) = run(&client, &ns, &caches, &first).await;
    assert_eq!(cached(&caches, &ns, "kept"), Some(true));
    assert_eq!(cached(&caches, &ns, "deleted"), Some(true));
    assert_eq!(
        cached(&caches, &ns, "gained"),
        Some(false),
        "not its bucket"
    );
    stop.send(()).unwrap();
    task.await.unwrap();

    // Between the runs: one child deleted, one created; then a version after everything the
    // first run saw is forgotten (a list at it refused with 410 Gone), writes moving the
    // history on meanwhile.
    let children = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    children
        .delete("deleted", &DeleteParams::default())
        .await
        .unwrap();
    child(&client, &ns, "created", theirs).await;
    let marks = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let apply = PatchParams::apply("controller-resume-test").force();
    let mark = |n: u32| {
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "history"}, "data": {"n": n.to_string()}})
    };
    let after = marks
        .patch("history", &apply, &Patch::Apply(&mark(0)))
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    let at = ListParams::default()
        .at(&after)
        .matching(VersionMatch::Exact);
    let deadline = tokio::time::Instant::now() + WAIT;
    for n in 1.. {
        match children.list(&at).await {
            Err(kube::Error::Api(s)) if s.code == 410 => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "{after} still listed: {other:?}"
            ),
        }
        marks
            .patch("history", &apply, &Patch::Apply(&mark(n)))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (stop, task) = run(&client, &ns, &caches, &second).await;
    assert_eq!(cached(&caches, &ns, "kept"), Some(true));
    assert_eq!(
        cached(&caches, &ns, "deleted"),
        Some(false),
        "deleted meanwhile"
    );
    assert_eq!(cached(&caches, &ns, "gained"), Some(true), "gained");
    assert_eq!(
        cached(&caches, &ns, "created"),
        Some(true),
        "created meanwhile"
    );
    let text = logs.text();
    assert!(
        text.contains("child watch going on from the store of the ring before"),
        "{text}"
    );
    assert!(
        text.contains("listing the gained objects failed; listing the whole share"),
        "{text}"
    );
    stop.send(()).unwrap();
    task.await.unwrap();
    tokio::task::block_in_place(|| cp.stop());
}
