//! The response body the fault layer returns: the server's body, a watch body that can be held,
//! delayed, cut or expired, or the body of an injected error.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tower::BoxError;

/// What a watch body is told to do next (0, the default: run):
/// end at once, as if the connection closed cleanly.
pub(super) const END: u8 = 1;
/// Send an `ERROR` event with status 410 Gone, then end.
pub(super) const EXPIRE: u8 = 2;

/// The shared control of one open watch response.
#[derive(Debug, Default)]
pub(super) struct WatchCtl {
    /// 0 (run), [`END`] or [`EXPIRE`].
    pub action: AtomicU8,
    /// The task polling the body, woken when the action or the hold changes.
    pub waker: Mutex<Option<Waker>>,
    /// Set once the body has ended (or was dropped): no longer an open watch.
    pub done: std::sync::atomic::AtomicBool,
}

impl WatchCtl {
    /// Tells the body to `action` and wakes it; false when it had already ended.
    pub fn order(&self, action: u8) -> bool {
        if self.done.load(Ordering::SeqCst) {
            return false;
        }
        self.action.store(action, Ordering::SeqCst);
        self.wake();
        true
    }

    /// Wakes the task polling the body, if any.
    pub fn wake(&self) {
        if let Some(w) = self.waker.lock().expect("waker lock").take() {
            w.wake();
        }
    }
}

/// What the body reads when held: whether watches are held now.
pub(super) type HoldFlag = Arc<std::sync::atomic::AtomicBool>;

/// What the body reads for each frame it receives: how long to keep it from the client, in
/// nanoseconds (0: none).
pub(super) type DelayNanos = Arc<AtomicU64>;

/// The frames of a delayed watch that reached the layer but not yet the client.
struct Delayed {
    delay: DelayNanos,
    /// Each frame with the instant it may be handed on, in arrival order.
    queue: VecDeque<(Instant, Frame<Bytes>)>,
    /// What the server's body ended with (`Some(None)`: a clean end), handed on after the
    /// queued frames.
    end: Option<Option<BoxError>>,
    timer: Option<Pin<Box<Sleep>>>,
}

impl Delayed {
    fn new(delay: DelayNanos) -> Self {
        Self {
            delay,
            queue: VecDeque::new(),
            end: None,
            timer: None,
        }
    }

    fn now_delay(&self) -> Duration {
        Duration::from_nanos(self.delay.load(Ordering::SeqCst))
    }
}

/// The line of a watch `ERROR` event with a 410 Gone status, as the API server sends when a
/// watch's resourceVersion is too old (reason `Expired`). A leading newline ends any partial
/// line the client may hold; kube's decoder skips the empty line.
pub const GONE_EVENT: &str = concat!(
    "\n{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\",",
    "\"metadata\":{},\"status\":\"Failure\",",
    "\"message\":\"too old resource version (injected by idem_tests::faults)\",",
    "\"reason\":\"Expired\",\"code\":410}}\n"
);

/// The body of a response that passed through a [`super::FaultLayer`]: `Data` is [`Bytes`],
/// errors are the inner body's errors boxed.
pub struct FaultBody<B> {
    kind: Kind<B>,
}

enum Kind<B> {
    /// Passed through untouched.
    Plain(B),
    /// A watch: held, cut or expired on the shared handle's order.
    Watch {
        inner: B,
        ctl: Arc<WatchCtl>,
        hold: HoldFlag,
        delayed: Box<Delayed>,
    },
    /// An injected answer, sent in one frame.
    Full(Option<Bytes>),
}

impl<B> FaultBody<B> {
    pub(super) fn plain(inner: B) -> Self {
        Self {
            kind: Kind::Plain(inner),
        }
    }

    pub(super) fn watch(inner: B, ctl: Arc<WatchCtl>, hold: HoldFlag, delay: DelayNanos) -> Self {
        Self {
            kind: Kind::Watch {
                inner,
                ctl,
                hold,
                delayed: Box::new(Delayed::new(delay)),
            },
        }
    }

    pub(super) fn full(bytes: impl Into<Bytes>) -> Self {
        Self {
            kind: Kind::Full(Some(bytes.into())),
        }
    }
}

impl<B> Drop for FaultBody<B> {
    fn drop(&mut self) {
        if let Kind::Watch { ctl, .. } = &self.kind {
            ctl.done.store(true, Ordering::SeqCst);
        }
    }
}

impl<B> Body for FaultBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match &mut this.kind {
            Kind::Plain(inner) => Pin::new(inner)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(Into::into))),
            Kind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Kind::Watch {
                inner,
                ctl,
                hold,
                delayed,
            } => {
                // Register first, so an order given between the check and `Pending` still wakes.
                *ctl.waker.lock().expect("waker lock") = Some(cx.waker().clone());
                if ctl.done.load(Ordering::SeqCst) {
                    return Poll::Ready(None);
                }
                match ctl.action.load(Ordering::SeqCst) {
                    END => {
                        ctl.done.store(true, Ordering::SeqCst);
                        return Poll::Ready(None);
                    }
                    EXPIRE => {
                        // Delayed events are discarded with the watch, as held ones are.
                        delayed.queue.clear();
                        ctl.action.store(END, Ordering::SeqCst);
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                            GONE_EVENT.as_bytes(),
                        )))));
                    }
                    _ => {}
                }
                if hold.load(Ordering::SeqCst) {
                    // Leave the server's events unread (in the connection) until released.
                    return Poll::Pending;
                }
                poll_delayed(inner, ctl, delayed, cx)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Plain(inner) => inner.is_end_stream(),
            Kind::Full(bytes) => bytes.is_none(),
            Kind::Watch { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Plain(inner) => inner.size_hint(),
            Kind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Kind::Full(None) => SizeHint::with_exact(0),
            Kind::Watch { .. } => SizeHint::default(),
        }
    }
}

/// Reads what the server sent into `delayed`'s queue, each frame due its delay after it
/// arrived, and hands on the first frame once due (then the server's end).
fn poll_delayed<B>(
    inner: &mut B,
    ctl: &WatchCtl,
    delayed: &mut Delayed,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    while delayed.end.is_none() {
        match Pin::new(&mut *inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let delay = delayed.now_delay();
                if delay.is_zero() && delayed.queue.is_empty() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                delayed.queue.push_back((Instant::now() + delay, frame));
            }
            Poll::Ready(Some(Err(e))) => delayed.end = Some(Some(e.into())),
            Poll::Ready(None) => delayed.end = Some(None),
            Poll::Pending => break,
        }
    }
    if let Some(&(due, _)) = delayed.queue.front() {
        if Instant::now() < due {
            let timer = delayed
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
            timer.as_mut().reset(due);
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        delayed.timer = None;
        let (_, frame) = delayed.queue.pop_front().expect("a queued frame");
        return Poll::Ready(Some(Ok(frame)));
    }
    match delayed.end.take() {
        None => Poll::Pending,
        Some(end) => {
            ctl.done.store(true, Ordering::SeqCst);
            Poll::Ready(end.map(Err))
        }
    }
}

impl<B> std::fmt::Debug for FaultBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Plain(_) => "plain",
            Kind::Watch { .. } => "watch",
            Kind::Full(_) => "injected",
        };
        f.debug_struct("FaultBody").field("kind", &kind).finish()
    }
}
