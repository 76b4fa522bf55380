//! The layer against a fake inner service: schedules, answers, latency and watch control.
//! (That each fault reaches a real kube client call is shown in `tests/tests/faults.rs`.)

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use tokio::sync::mpsc;
use tower::{Layer, Service, ServiceExt};

use super::*;

/// A body fed through a channel: each message is one frame.
struct Fed(mpsc::UnboundedReceiver<Bytes>);

impl Body for Fed {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// A fake API server: answers 200; a watch's body is fed by the returned senders.
struct Fake {
    sent: Arc<AtomicUsize>,
    feeds: mpsc::UnboundedReceiver<mpsc::UnboundedSender<Bytes>>,
    svc: FaultService<
        tower::util::BoxService<Request<String>, Response<Fed>, std::convert::Infallible>,
    >,
}

fn fake(faults: &Faults) -> Fake {
    let sent = Arc::new(AtomicUsize::new(0));
    let (feed_tx, feeds) = mpsc::unbounded_channel();
    let counter = Arc::clone(&sent);
    let inner = tower::service_fn(move |_req: Request<String>| {
        counter.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = feed_tx.send(tx);
        async move { Ok::<_, std::convert::Infallible>(Response::new(Fed(rx))) }
    });
    Fake {
        sent,
        feeds,
        svc: faults.layer().layer(tower::util::BoxService::new(inner)),
    }
}

fn request(method: Method, uri: &str) -> Request<String> {
    Request::builder()
        .method(method)
        .uri(uri)
        .body(String::new())
        .unwrap()
}

const CM: &str = "/api/v1/namespaces/a/configmaps/x";
const CMS: &str = "/api/v1/namespaces/a/configmaps";
const WATCH: &str = "/api/v1/namespaces/a/configmaps?watch=true&resourceVersion=5";

async fn call(fake: &mut Fake, method: Method, uri: &str) -> Response<FaultBody<Fed>> {
    fake.svc
        .ready()
        .await
        .unwrap()
        .call(request(method, uri))
        .await
        .unwrap()
}

async fn status_body(res: Response<FaultBody<Fed>>) -> (StatusCode, serde_json::Value) {
    let status = res.status();
    let mut body = res.into_body();
    let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
        .await
        .expect("one frame")
        .unwrap();
    let json = serde_json::from_slice(&frame.into_data().unwrap()).unwrap();
    (status, json)
}

async fn next(body: &mut FaultBody<Fed>) -> Option<Bytes> {
    std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx))
        .await
        .map(|f| f.unwrap().into_data().unwrap())
}

#[tokio::test]
async fn every_third_write_conflicts_and_reads_are_never_conflicts() {
    let faults = Faults::new();
    let mut fake = fake(&faults);
    faults.conflicts(Schedule::Every(3));
    let mut codes = Vec::new();
    for _ in 0..2 {
        for (method, uri) in [
            (Method::PATCH, CM),
            (Method::GET, CM),
            (Method::POST, CMS),
            (Method::GET, CMS),
            (Method::DELETE, CM),
        ] {
            codes.push(call(&mut fake, method, uri).await.status().as_u16());
        }
    }
    // Writes: PATCH, POST, DELETE, PATCH, POST, DELETE → the 3rd and 6th conflict.
    assert_eq!(
        codes,
        [200, 200, 200, 200, 409, 200, 200, 200, 200, 409],
        "{codes:?}"
    );
    assert_eq!(
        fake.sent.load(Ordering::SeqCst),
        8,
        "injected answers are not sent"
    );
    assert_eq!(faults.sent().values().sum::<u64>(), 8);
    assert_eq!(
        (faults.sent()[&Verb::Delete], faults.sent()[&Verb::Patch]),
        (0, 2),
        "each DELETE was a third write"
    );
    assert_eq!(faults.injected().conflicts, 2);
    let seen = faults.requests();
    assert_eq!(
        (seen[&Verb::Patch], seen[&Verb::Get], seen[&Verb::List]),
        (2, 2, 2)
    );
    assert_eq!(
        (seen[&Verb::Create], seen[&Verb::Delete], seen[&Verb::Watch]),
        (2, 2, 0)
    );

    let res = {
        faults.conflicts(Schedule::Next(1));
        call(&mut fake, Method::PUT, CM).await
    };
    let (code, status) = status_body(res).await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert_eq!(
        (status["kind"].as_str(), status["reason"].as_str()),
        (Some("Status"), Some("Conflict"))
    );
    assert_eq!(status["code"], 409);
    assert_eq!(
        call(&mut fake, Method::PUT, CM).await.status(),
        200,
        "Next(1) is spent"
    );
}

#[tokio::test]
async fn throttling_sends_retry_after_in_whole_seconds_and_server_errors_are_500() {
    let faults = Faults::new();
    let mut fake = fake(&faults);
    faults.too_many_requests(Schedule::Next(2), Duration::from_millis(1500));
    for _ in 0..2 {
        let res = call(&mut fake, Method::GET, CM).await;
        assert_eq!(res.headers()[http::header::RETRY_AFTER], "2");
        let (code, status) = status_body(res).await;
        assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(status["details"]["retryAfterSeconds"], 2);
        assert_eq!(status["reason"], "TooManyRequests");
    }
    assert_eq!(call(&mut fake, Method::GET, CM).await.status(), 200);

    faults.server_errors(Schedule::Every(1));
    let (code, status) = status_body(call(&mut fake, Method::GET, WATCH).await).await;
    assert_eq!(
        (code, status["code"].as_u64()),
        (StatusCode::INTERNAL_SERVER_ERROR, Some(500))
    );
    faults.clear();
    assert_eq!(call(&mut fake, Method::GET, CM).await.status(), 200);
    let injected = faults.injected();
    assert_eq!((injected.too_many_requests, injected.server_errors), (2, 1));
    assert_eq!(fake.sent.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn throttled_writes_spare_reads_and_watches() {
    let faults = Faults::new();
    let mut fake = fake(&faults);
    faults.too_many_writes(Schedule::Next(1), Duration::from_secs(1));
    assert_eq!(call(&mut fake, Method::GET, WATCH).await.status(), 200);
    assert_eq!(call(&mut fake, Method::GET, CM).await.status(), 200);
    let res = call(&mut fake, Method::PUT, CM).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()[http::header::RETRY_AFTER], "1");
    assert_eq!(
        call(&mut fake, Method::PUT, CM).await.status(),
        200,
        "Next(1) is spent"
    );
    assert_eq!(faults.injected().too_many_requests, 1);
}

#[tokio::test(start_paused = true)]
async fn latency_delays_each_request() {
    let faults = Faults::new();
    let mut fake = fake(&faults);
    faults.latency(Duration::from_millis(300));
    let start = tokio::time::Instant::now();
    call(&mut fake, Method::GET, CM).await;
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
    faults.latency(Duration::ZERO);
    let start = tokio::time::Instant::now();
    call(&mut fake, Method::GET, CM).await;
    assert!(start.elapsed() < Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn held_watch_events_wait_and_an_expiry_discards_them_for_a_410_event() {
    let faults = Faults::new();
    let mut fake = fake(&faults);
    assert_eq!(faults.expire_watches(), 0, "no watch open yet");
    let mut body = call(&mut fake, Method::GET, WATCH).await.into_body();
    let feed = fake.feeds.recv().await.unwrap();
    assert_eq!(faults.open_watches(), 1);

    feed.send(Bytes::from_static(b"one\n")).unwrap();
    assert_eq!(next(&mut body).await.as_deref(), Some(&b"one\n"[..]));

    faults.hold_watches(true);
    feed.send(Bytes::from_static(b"two\n")).unwrap();
    let held = tokio::time::timeout(Duration::from_secs(60), next(&mut body)).await;
    assert!(held.is_err(), "a held watch delivered {held:?}");
    faults.hold_watches(false);
    assert_eq!(next(&mut body).await.as_deref(), Some(&b"two\n"[..]));

    faults.hold_watches(true);
    feed.send(Bytes::from_static(b"three\n")).unwrap();
    assert_eq!(faults.expire_watches(), 1);
    let gone = next(&mut body).await.unwrap();
    assert_eq!(gone, GONE_EVENT.as_bytes());
    assert_eq!(
        next(&mut body).await,
        None,
        "the watch ends after the 410 event"
    );
    assert_eq!(faults.open_watches(), 0);
    assert_eq!(faults.injected().watches_expired, 1);

    // What kube's watch decoder makes of the line: an ERROR event with code 410.
    let line = GONE_EVENT.trim();
    let event: kube::api::WatchEvent<k8s_openapi::api::core::v1::ConfigMap> =
        serde_json::from_str(line).unwrap();
    match event {
        kube::api::WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"))
        }
        other => panic!("not an error event: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_cut_ends_open_watches_and_spares_later_ones() {
    let faults = Faults::new();
    let mut fake = fake(&faults);
    let mut first = call(&mut fake, Method::GET, WATCH).await.into_body();
    let _feed = fake.feeds.recv().await.unwrap();
    // The task reading the watch is woken by the cut, not only on its next poll.
    let reader = tokio::spawn(async move { next(&mut first).await });
    tokio::task::yield_now().await;
    assert_eq!(faults.cut_watches(), 1);
    assert_eq!(reader.await.unwrap(), None);

    let mut second = call(&mut fake, Method::GET, WATCH).await.into_body();
    let feed = fake.feeds.recv().await.unwrap();
    feed.send(Bytes::from_static(b"x\n")).unwrap();
    assert_eq!(next(&mut second).await.as_deref(), Some(&b"x\n"[..]));
    assert_eq!(faults.open_watches(), 1);
    assert_eq!(faults.injected().watches_cut, 1);
    drop(second);
    assert_eq!(faults.open_watches(), 0, "a dropped watch is not open");
    // A plain request's body is not a watch.
    let _list = call(&mut fake, Method::GET, CMS).await;
    assert_eq!(faults.open_watches(), 0);
}

#[tokio::test(start_paused = true)]
async fn delayed_watch_events_arrive_in_order_each_its_delay_after_it_was_sent() {
    let faults = Faults::new();
    let mut fake = fake(&faults);
    let mut body = call(&mut fake, Method::GET, WATCH).await.into_body();
    let feed = fake.feeds.recv().await.unwrap();
    faults.delay_watches(Duration::from_secs(4));
    let start = tokio::time::Instant::now();
    feed.send(Bytes::from_static(b"one\n")).unwrap();
    // The client waits on the watch all along (as kube's watcher does): not delivered yet.
    let early = tokio::time::timeout(Duration::from_secs(1), next(&mut body)).await;
    assert!(early.is_err(), "delivered before its delay: {early:?}");
    feed.send(Bytes::from_static(b"two\n")).unwrap();
    assert_eq!(next(&mut body).await.as_deref(), Some(&b"one\n"[..]));
    assert_eq!(start.elapsed(), Duration::from_secs(4));
    assert_eq!(next(&mut body).await.as_deref(), Some(&b"two\n"[..]));
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    // No delay any more: a new event arrives at once.
    faults.delay_watches(Duration::ZERO);
    feed.send(Bytes::from_static(b"three\n")).unwrap();
    assert_eq!(next(&mut body).await.as_deref(), Some(&b"three\n"[..]));
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    // The server's end waits for the events before it.
    faults.delay_watches(Duration::from_secs(2));
    feed.send(Bytes::from_static(b"four\n")).unwrap();
    drop(feed);
    assert_eq!(next(&mut body).await.as_deref(), Some(&b"four\n"[..]));
    assert_eq!(start.elapsed(), Duration::from_secs(7));
    assert_eq!(next(&mut body).await, None);
    assert_eq!(faults.open_watches(), 0);
}
