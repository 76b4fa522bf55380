//! Against the real control plane: a controller given `shard_cache` keeps in its primary
//! cache only the objects the predicate keeps (another replica's share, where the API server
//! does not filter by shard), from its first list and from later events, and never reconciles
//! the others.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Widget, WidgetSpec, install_widget, namespace, wait_until};
use idem_runtime::controller::{Action, Attempt, Controller};
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Reconciled(Mutex<BTreeSet<String>>);

async fn note(obj: Arc<Widget>, log: Arc<Reconciled>, _: Attempt) -> Result<Action, String> {
    log.0.lock().unwrap().insert(obj.name_any());
    Ok(Action::await_change())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_cache_keeps_and_reconciles_only_the_kept_objects() {
    let client = idem_tests::shared().client();
    install_widget(&client).await;
    let ns = namespace(&client, "ctl-shard-cache").await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let create = |name: &str| {
        let widgets = widgets.clone();
        let widget = Widget::new(name, WidgetSpec { value: 1 });
        async move {
            widgets
                .create(&PostParams::default(), &widget)
                .await
                .unwrap();
        }
    };
    // Listed at start: two of each.
    for name in ["a-kept", "b-other", "c-kept", "d-other"] {
        create(name).await;
    }
    let log = Arc::new(Reconciled::default());
    let (synced_tx, mut synced) = tokio::sync::watch::channel(false);
    let controller = Controller::new(widgets.clone(), watcher::Config::default())
        .shard_cache(|w: &Widget| w.name_any().ends_with("-kept"))
        .with_synced_signal(synced_tx);
    let store = controller.store();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(note, Arc::clone(&log), async {
        let _ = stopped.await;
    }));
    tokio::time::timeout(WAIT, synced.wait_for(|s| *s))
        .await
        .expect("synced")
        .unwrap();
    // Created after start: one of each, the other one first.
    create("e-other").await;
    create("f-kept").await;
    let want = ["a-kept", "c-kept", "f-kept"];
    wait_until("the kept widgets reconciled", WAIT, || {
        log.0.lock().unwrap().contains("f-kept")
    })
    .await;
    // `e-other`'s event came before `f-kept`'s, and `f-kept` was reconciled: had `e-other` been
    // kept it would be in the store by now.
    let cached: BTreeSet<String> = store.state().iter().map(|w| w.name_any()).collect();
    assert_eq!(cached, want.iter().map(|n| n.to_string()).collect());
    assert_eq!(
        *log.0.lock().unwrap(),
        want.iter().map(|n| n.to_string()).collect()
    );
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
}
