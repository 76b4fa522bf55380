//! Against the real control plane: every fault of `idem_tests::faults` reaches a kube client
//! call — 409, 429 with Retry-After, 500 and latency as `Api` errors and delays; a cut watch
//! resumes from its resourceVersion, a 410 event makes kube's watcher relist.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;

use idem_tests::faults::{Faults, Schedule, Verb};
use idem_tests::shared;

const TIMEOUT: Duration = Duration::from_secs(60);

/// The label on the tests' own ConfigMaps; the watch test watches only these (the namespace's
/// `kube-root-ca.crt`, published by the controller-manager at its own pace, would add events).
const LABEL: (&str, &str) = ("idem.dev/faults-test", "yes");

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(LABEL.0.to_owned(), LABEL.1.to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

fn code(result: Result<ConfigMap, kube::Error>) -> u16 {
    match result {
        Err(kube::Error::Api(s)) => s.code,
        other => panic!("expected an API status error, got {other:?}"),
    }
}

/// Polls `done` every 10 ms until it holds; panics after [`TIMEOUT`] naming `what`.
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_throttling_server_errors_and_latency_reach_api_calls() {
    let cp = shared();
    let plain = cp.client();
    let ns = idem_tests::create_namespace(&plain, "faults-calls")
        .await
        .unwrap();
    let faults = Faults::new();
    let api: Api<ConfigMap> = Api::namespaced(faults.client(cp.config()).unwrap(), &ns);
    let truth: Api<ConfigMap> = Api::namespaced(plain, &ns);
    let pp = PostParams::default();

    // 409 on the next write: the create fails and nothing reached the server.
    faults.conflicts(Schedule::Next(1));
    assert_eq!(code(api.create(&pp, &config_map("a")).await), 409);
    assert!(truth.get_opt("a").await.unwrap().is_none());
    api.create(&pp, &config_map("a")).await.unwrap();

    // Every second write conflicts; reads are never conflicts.
    faults.conflicts(Schedule::Every(2));
    api.create(&pp, &config_map("b")).await.unwrap();
    api.get("b").await.unwrap();
    assert_eq!(code(api.create(&pp, &config_map("c")).await), 409);
    api.create(&pp, &config_map("c")).await.unwrap();
    faults.conflicts(Schedule::Off);

    // 429 with Retry-After reaches `Api::get` as an error with code 429 (outside kube's retry).
    faults.too_many_requests(Schedule::Next(1), Duration::from_secs(3));
    let err = api.get("a").await.unwrap_err();
    match &err {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (429, "TooManyRequests"));
        }
        other => panic!("expected 429, got {other:?}"),
    }
    api.get("a").await.unwrap();

    // 500 on reads and on lists.
    faults.server_errors(Schedule::Next(2));
    assert_eq!(code(api.get("a").await), 500);
    let list = api.list(&Default::default()).await;
    assert!(
        matches!(list, Err(kube::Error::Api(ref s)) if s.code == 500),
        "{list:?}"
    );
    let names: Vec<String> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .filter(|n| n.len() == 1)
        .collect();
    assert_eq!(names, ["a", "b", "c"]);

    // Added latency: a request takes at least that long.
    faults.latency(Duration::from_millis(400));
    let start = std::time::Instant::now();
    api.get("a").await.unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
    faults.clear();

    let seen = faults.requests();
    assert_eq!(seen[&Verb::Create], 5, "{seen:?}");
    assert_eq!((seen[&Verb::Get], seen[&Verb::List]), (5, 2), "{seen:?}");
    assert_eq!(faults.sent()[&Verb::Create], 3, "the 409s were not sent");
    let injected = faults.injected();
    assert_eq!(
        (
            injected.conflicts,
            injected.too_many_requests,
            injected.server_errors
        ),
        (2, 1, 2)
    );
}

/// Runs a watcher of ConfigMaps in `ns` through `client`, forwarding its events (errors as
/// `None`) to the returned channel.
fn watch(client: Client, ns: &str) -> mpsc::UnboundedReceiver<Option<Event<ConfigMap>>> {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let stream = watcher::watcher(
            api,
            watcher::Config::default().labels(&format!("{}={}", LABEL.0, LABEL.1)),
        );
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            if tx.send(event.ok()).is_err() {
                break;
            }
        }
    });
    rx
}

/// A short description of an event: `init`, `init-apply:<name>`, `init-done`, `apply:<name>`,
/// `delete:<name>`, `error`.
fn describe(event: &Option<Event<ConfigMap>>) -> String {
    match event {
        Some(Event::Init) => "init".into(),
        Some(Event::InitApply(o)) => format!("init-apply:{}", o.name_any()),
        Some(Event::InitDone) => "init-done".into(),
        Some(Event::Apply(o)) => format!("apply:{}", o.name_any()),
        Some(Event::Delete(o)) => format!("delete:{}", o.name_any()),
        None => "error".into(),
    }
}

/// Receives events until `last` (inclusive), returning their descriptions.
async fn events_until(
    rx: &mut mpsc::UnboundedReceiver<Option<Event<ConfigMap>>>,
    last: &str,
) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(TIMEOUT, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no {last} within {TIMEOUT:?}; saw {seen:?}"))
            .expect("the watcher task ended");
        seen.push(describe(&event));
        if seen.last().map(String::as_str) == Some(last) {
            return seen;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_watch_resumes_and_a_410_event_forces_a_relist_that_misses_held_deletes() {
    let cp = shared();
    let plain = cp.client();
    let ns = idem_tests::create_namespace(&plain, "faults-watch")
        .await
        .unwrap();
    let truth: Api<ConfigMap> = Api::namespaced(plain, &ns);
    let pp = PostParams::default();
    truth.create(&pp, &config_map("kept")).await.unwrap();
    truth.create(&pp, &config_map("doomed")).await.unwrap();
    let faults = Faults::new();
    let mut rx = watch(faults.client(cp.config()).unwrap(), &ns);
    let first = events_until(&mut rx, "init-done").await;
    assert_eq!(first.first().map(String::as_str), Some("init"), "{first:?}");
    wait_until("the watch is open", || faults.open_watches() == 1).await;
    let lists = faults.requests()[&Verb::List];

    // A cut: the watcher watches again from its resourceVersion — no relist, no event lost.
    assert_eq!(faults.cut_watches(), 1);
    truth.create(&pp, &config_map("after-cut")).await.unwrap();
    let resumed = events_until(&mut rx, "apply:after-cut").await;
    assert_eq!(resumed, ["apply:after-cut"], "a cut relisted: {resumed:?}");
    assert_eq!(faults.requests()[&Verb::List], lists, "a cut relisted");
    assert_eq!(faults.injected().watches_cut, 1);

    // Held watch, a delete, then a 410 event: the Delete event is never seen; the relist
    // (a fresh Init … InitDone without the object) is the only news of it.
    wait_until("the watch is open again", || faults.open_watches() == 1).await;
    faults.hold_watches(true);
    truth
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(faults.expire_watches(), 1);
    let relist = events_until(&mut rx, "init-done").await;
    faults.hold_watches(false);
    assert_eq!(
        relist.first().map(String::as_str),
        Some("error"),
        "{relist:?}"
    );
    let after_error: Vec<&str> = relist[1..].iter().map(String::as_str).collect();
    assert_eq!(after_error.first(), Some(&"init"), "{relist:?}");
    assert!(!after_error.contains(&"delete:doomed"), "{relist:?}");
    assert!(!after_error.contains(&"init-apply:doomed"), "{relist:?}");
    for name in ["kept", "after-cut"] {
        assert!(
            after_error.contains(&format!("init-apply:{name}").as_str()),
            "{relist:?}"
        );
    }
    assert_eq!(
        faults.requests()[&Verb::List],
        lists + 1,
        "the 410 caused one relist"
    );
}
