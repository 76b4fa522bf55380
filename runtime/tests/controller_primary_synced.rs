//! Against the real control plane: `Controller::with_primary_synced_signal` says the primary
//! watch alone has listed, while `with_synced_signal` waits for every watch: a child kind the
//! API server does not serve keeps the second `false` and not the first (another controller
//! that reads only this one's primary cache may go on).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Widget, install_widget, namespace};
use idem_runtime::controller::{Action, Attempt, Controller};
use kube::runtime::watcher;
use kube::{Api, CustomResource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};

/// A kind whose CustomResourceDefinition is never installed.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(group = "absent.idem.dev", version = "v1", kind = "Gadget", namespaced)]
pub struct GadgetSpec {
    /// Anything.
    pub size: i32,
}

async fn noop(_: Arc<Widget>, _: Arc<()>, _: Attempt) -> Result<Action, kube::Error> {
    Ok(Action::await_change())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_synced_signal_does_not_wait_for_the_child_watches() {
    let client = idem_tests::shared().client();
    install_widget(&client).await;
    let ns = namespace(&client, "ctl-primary-synced").await;
    let (all_tx, all) = watch::channel(false);
    let (primary_tx, mut primary) = watch::channel(false);
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(
        Controller::new(
            Api::<Widget>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
        )
        .owns(
            Api::<Gadget>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
        )
        .with_synced_signal(all_tx)
        .with_primary_synced_signal(primary_tx)
        .run(noop, Arc::new(()), async {
            let _ = stopped.await;
        }),
    );
    tokio::time::timeout(Duration::from_secs(60), primary.wait_for(|s| *s))
        .await
        .expect("the primary listed in time")
        .unwrap();
    // The Gadget watch cannot list (404): never synced, so neither is the controller.
    assert!(!*all.borrow(), "synced with a child kind not served");
    stop.send(()).unwrap();
    controller.await.unwrap().unwrap();
}
