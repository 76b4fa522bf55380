//! A write fence: a tower layer for the kube `Client` that refuses every mutating request
//! while this replica's lease is not valid by its own clock, so a deposed or paused leader
//! (or shard member) cannot write.
//!
//! The check runs as the request enters the layer, before it is handed to the layers below
//! (in the end the HTTP connection); reads (GET, including watches, HEAD, OPTIONS) always
//! pass. A write let through that has not ended when the fence's time runs out (it waited
//! for a connection, a stream, or a slow server) is abandoned then ([`FenceError::Expired`]):
//! one still waiting for a connection or a stream is never sent; one already on the wire
//! cannot be called back, so [`Fence::drained`] waits [`ABANDONED_MARGIN`] more. A refused request fails with a [`FenceError`] naming the mode of the
//! fence (kube reports it as `kube::Error::Service`) and counts in [`Fence::refused`].
//!
//! A write the fence lets through is driven to its end (its response, or the client's timeout)
//! by a task of its own, even when the caller stops waiting for it (a cancelled reconcile):
//! its request may already be on its way to the server. [`Fence::drained`] resolves once no
//! write it let through is still in flight (answered, or abandoned and the margin past), so a
//! replica can revoke the fence, wait, and only then tell others that it writes no more (a
//! shard ring's handover).
//!
//! Put the layer *below* any retry layer (with kube's `ClientBuilder::with_layer`, add it
//! before the retry layer), so that every attempt is checked; [`Fence::wrap`] fences a built
//! `Client` as a whole, so a retry inside that client (kube's default `RetryPolicy`) is not
//! checked again.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt as _, ready};
use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;
use prometheus_client::metrics::counter::Counter;
use tower::{Layer, Service};

/// How long [`Fence::drained`] waits after a write was abandoned ([`FenceError::Expired`])
/// before it resolves: abandoning it ends the request on this side, but one already on the
/// wire may still be applied by the server for a while.
pub const ABANDONED_MARGIN: Duration = Duration::from_secs(5);

/// The boxed error of kube's client stack.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Errors of the fence: a write refused, with the reason of its [`FenceMode`].
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// A write was attempted while this replica held no valid leader lease (leader election:
    /// not elected yet, deposed, or its lease ran out by its own clock).
    #[error("{method} {path} refused: this replica holds no valid leader lease")]
    NotLeader {
        /// The request's method.
        method: Method,
        /// The request's path.
        path: String,
    },
    /// A write was attempted while this replica was not working on the current shard ring
    /// (sharding: the ring changed and was not acknowledged yet, or its member Lease was not
    /// renewed in time).
    #[error(
        "{method} {path} refused: this replica is not working on the current shard ring or its member lease ran out"
    )]
    NotShardMember {
        /// The request's method.
        method: Method,
        /// The request's path.
        path: String,
    },
    /// A write let through had not ended when the lease it was let through under ran out (it
    /// waited for a connection, or the server was slow): it is abandoned, so that it is not
    /// sent once another replica may write.
    #[error("{method} {path} abandoned: not answered before this replica's lease ran out")]
    Expired {
        /// The request's method.
        method: Method,
        /// The request's path.
        path: String,
    },
}

/// What a [`Fence`] guards, which names the reason of a refused write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceMode {
    /// Leader election: valid while this replica holds the leader Lease
    /// ([`FenceError::NotLeader`]).
    LeaderElection,
    /// Sharding: valid while this replica works on an acknowledged ring with a fresh member
    /// Lease ([`FenceError::NotShardMember`]).
    ShardMembership,
}

/// Whether this replica may write: the instant until which its lease is valid by its own
/// monotonic clock, or none. Shared by the loop that renews the lease (which calls
/// [`Fence::extend`] and [`Fence::revoke`]) and the client's [`FenceLayer`].
#[derive(Debug)]
pub struct Fence {
    mode: FenceMode,
    valid_until: Mutex<Option<Instant>>,
    /// Writes let through whose request has not ended yet.
    admitted: tokio::sync::watch::Sender<usize>,
    /// When a write let through was last abandoned ([`FenceError::Expired`]).
    abandoned: Mutex<Option<Instant>>,
    /// Writes refused because the lease was not valid (register it, e.g. as
    /// `idem_fenced_writes`).
    pub refused: Counter,
}

impl Fence {
    /// A closed fence (no write passes until [`Fence::extend`]) for `mode`.
    pub fn new(mode: FenceMode) -> Arc<Self> {
        Self::counting_into(mode, Counter::default())
    }

    /// [`Fence::new`], counting its refusals in `refused` (e.g. another fence's
    /// [`Fence::refused`], so one metric counts both).
    pub fn counting_into(mode: FenceMode, refused: Counter) -> Arc<Self> {
        Arc::new(Self {
            mode,
            valid_until: Mutex::new(None),
            admitted: tokio::sync::watch::channel(0).0,
            abandoned: Mutex::new(None),
            refused,
        })
    }

    /// A fence that is always open (valid for a hundred years): for a replica that runs
    /// without leader election.
    pub fn open() -> Arc<Self> {
        let fence = Self::new(FenceMode::LeaderElection);
        fence.extend(Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600));
        fence
    }

    fn lock(&self) -> MutexGuard<'_, Option<Instant>> {
        self.valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// What the fence guards.
    pub fn mode(&self) -> FenceMode {
        self.mode
    }

    /// True while the lease is valid by this replica's clock.
    pub fn is_valid(&self) -> bool {
        self.lock().is_some_and(|until| Instant::now() < until)
    }

    /// Opens the fence until `until` (by this replica's monotonic clock), e.g. after a
    /// successful renewal sent at `t`: `t + lease duration − clock skew`.
    pub fn extend(&self, until: Instant) {
        *self.lock() = Some(until);
    }

    /// Closes the fence now: no write passes until the next [`Fence::extend`]. Writes it let
    /// through before may still be in flight: see [`Fence::drained`].
    pub fn revoke(&self) {
        *self.lock() = None;
    }

    /// Writes this fence let through whose request has not ended (answered, failed or timed
    /// out), whether or not their caller still waits for them.
    pub fn writes_in_flight(&self) -> usize {
        *self.admitted.borrow()
    }

    /// Resolves once no write this fence let through is in flight. After [`Fence::revoke`]
    /// nothing more is let through, so once it resolves no write that passed this fence can
    /// still reach the server.
    pub async fn drained(&self) {
        let mut rx = self.admitted.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
        // An abandoned write's request may already have reached the server (its connection
        // held it, or the server had begun): give it time to be applied or dropped there.
        let abandoned = *self
            .abandoned
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = abandoned {
            tokio::time::sleep_until((at + ABANDONED_MARGIN).into()).await;
        }
    }

    /// Lets a write through if the fence is valid, counting it in flight until the returned
    /// guard is dropped; checked and counted under the lock, so a write let through before a
    /// [`Fence::revoke`] is counted before it returns.
    fn admit(self: &Arc<Self>) -> Option<(InFlight, Instant)> {
        let guard = self.lock();
        let until = (*guard).filter(|until| Instant::now() < *until)?;
        self.admitted.send_modify(|n| *n += 1);
        drop(guard);
        Some((InFlight(Arc::clone(self)), until))
    }

    /// Drives `write`, let through while the fence was valid until `until`, to its end or
    /// until the fence's time runs out, whichever comes first: `until`, or a later instant the
    /// fence was extended to meanwhile while valid (a revoked fence lets what it let through
    /// finish within the time it had when let through).
    async fn within<T>(
        &self,
        until: Instant,
        write: impl Future<Output = Result<T, BoxError>>,
        expired: impl FnOnce() -> FenceError,
    ) -> Result<T, BoxError> {
        let mut until = until;
        let mut write = std::pin::pin!(write);
        loop {
            // An open fence (`Fence::open`) has no time to run out.
            if until.saturating_duration_since(Instant::now()) > Duration::from_secs(24 * 3600) {
                return write.await;
            }
            match tokio::time::timeout_at(until.into(), &mut write).await {
                Ok(result) => return result,
                Err(_) => match *self.lock() {
                    Some(later) if later > until => until = later,
                    _ => {
                        self.note_abandoned();
                        return Err(Box::new(expired()));
                    }
                },
            }
        }
    }

    /// Notes that a write let through was abandoned now.
    fn note_abandoned(&self) {
        *self
            .abandoned
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// A layer that lets this fence's writes through only while it is valid.
    pub fn layer(self: &Arc<Self>) -> FenceLayer {
        FenceLayer::new(Arc::clone(self))
    }

    /// `client` with its writes fenced: a new `Client` (same default namespace) that sends
    /// every request through [`FenceService`] and then `client`. Requests that `client`
    /// retries internally are checked once, on entry; build the client with
    /// [`FenceLayer`] under its retry layer to check every attempt.
    pub fn wrap(self: &Arc<Self>, client: &Client) -> Client {
        let valid_until = *client.valid_until();
        Client::new(
            self.layer().layer(ClientService(client.clone())),
            client.default_namespace(),
        )
        .with_valid_until(valid_until)
    }

    /// The error for a refused `method` on `path`, by mode.
    fn refusal(&self, method: &Method, path: &str) -> FenceError {
        let (method, path) = (method.clone(), path.to_string());
        match self.mode {
            FenceMode::LeaderElection => FenceError::NotLeader { method, path },
            FenceMode::ShardMembership => FenceError::NotShardMember { method, path },
        }
    }
}

/// One write let through by a fence, in flight until dropped.
struct InFlight(Arc<Fence>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.admitted.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A built `Client` as a tower service (what [`Fence::wrap`] puts under the fence).
#[derive(Clone)]
struct ClientService(Client);

impl Service<Request<Body>> for ClientService {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move { client.send(req).await })
    }
}

/// Wraps a client's service in [`FenceService`].
#[derive(Clone, Debug)]
pub struct FenceLayer {
    fence: Arc<Fence>,
}

impl FenceLayer {
    /// A layer that lets writes through only while `fence` is valid.
    pub fn new(fence: Arc<Fence>) -> Self {
        Self { fence }
    }
}

impl<S> Layer<S> for FenceLayer {
    type Service = FenceService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FenceService {
            inner,
            fence: Arc::clone(&self.fence),
        }
    }
}

/// The service made by [`FenceLayer`].
#[derive(Clone, Debug)]
pub struct FenceService<S> {
    inner: S,
    fence: Arc<Fence>,
}

/// Whether a request with `method` changes state (everything but GET, HEAD and OPTIONS).
pub fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

impl<S, B> Service<Request<Body>> for FenceService<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<B>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if !is_write(req.method()) {
            return self.inner.call(req).map(|r| r.map_err(Into::into)).boxed();
        }
        let Some((in_flight, until)) = self.fence.admit() else {
            self.fence.refused.inc();
            let err = self.fence.refusal(req.method(), req.uri().path());
            tracing::warn!(error = %err, "write fenced");
            return ready(Err(Box::new(err) as BoxError)).boxed();
        };
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        // Driven to its end by a task of its own, so that `drained` sees its end even when
        // the caller is cancelled meanwhile; abandoned once the fence's time ran out.
        let write = self.inner.call(req).map(|r| r.map_err(Into::into));
        let fence = Arc::clone(&self.fence);
        let task = tokio::spawn(async move {
            let result = fence
                .within(until, write, || {
                    tracing::warn!(%method, %path, "write abandoned: the fence's time ran out");
                    FenceError::Expired { method, path }
                })
                .await;
            // A fence inside this one (a ring's gate around the membership's fence) that
            // abandoned the write: it may still be on the wire, so this fence's `drained`
            // waits the margin too.
            if let Err(e) = &result
                && matches!(e.downcast_ref(), Some(FenceError::Expired { .. }))
            {
                fence.note_abandoned();
            }
            drop(in_flight);
            result
        });
        async move { task.await.unwrap_or_else(|e| Err(Box::new(e) as BoxError)) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::future::Ready;

    use super::*;

    /// An inner service that answers 200 to everything and counts the calls.
    #[derive(Clone, Default)]
    struct Ok200(Arc<AtomicUsize>);

    impl Service<Request<Body>> for Ok200 {
        type Response = Response<Body>;
        type Error = BoxError;
        type Future = Ready<Result<Response<Body>, BoxError>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request<Body>) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            ready(Ok(Response::new(Body::empty())))
        }
    }

    fn request(method: Method) -> Request<Body> {
        Request::builder()
            .method(method)
            .uri("/api/v1/namespaces")
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn writes_pass_only_while_the_lease_is_valid_and_reads_always() {
        let fence = Fence::new(FenceMode::LeaderElection);
        let inner = Ok200::default();
        let mut svc = fence.layer().layer(inner.clone());
        // Never held: writes refused, reads pass.
        let err = svc.call(request(Method::POST)).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("POST /api/v1/namespaces refused: this replica holds no valid leader"),
            "{err}"
        );
        svc.call(request(Method::GET)).await.unwrap();
        // Held: writes pass.
        fence.extend(Instant::now() + Duration::from_secs(60));
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            svc.call(request(m)).await.unwrap();
        }
        // Expired by this replica's clock (a pause longer than the lease): refused again.
        fence.extend(Instant::now() - Duration::from_millis(1));
        assert!(svc.call(request(Method::PATCH)).await.is_err());
        fence.extend(Instant::now() + Duration::from_secs(60));
        fence.revoke();
        assert!(svc.call(request(Method::DELETE)).await.is_err());
        assert_eq!(fence.refused.get(), 3);
        assert_eq!(inner.0.load(Ordering::SeqCst), 5);
    }

    /// An inner service whose writes take until `release` is notified; counts those ended.
    #[derive(Clone, Default)]
    struct Slow {
        release: Arc<tokio::sync::Notify>,
        ended: Arc<AtomicUsize>,
    }

    impl Service<Request<Body>> for Slow {
        type Response = Response<Body>;
        type Error = BoxError;
        type Future = BoxFuture<'static, Result<Response<Body>, BoxError>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request<Body>) -> Self::Future {
            let (release, ended) = (Arc::clone(&self.release), Arc::clone(&self.ended));
            Box::pin(async move {
                release.notified().await;
                ended.fetch_add(1, Ordering::SeqCst);
                Ok(Response::new(Body::empty()))
            })
        }
    }

    #[tokio::test]
    async fn drained_waits_for_a_write_let_through_before_the_revoke_even_if_its_caller_is_gone() {
        let fence = Fence::new(FenceMode::ShardMembership);
        fence.extend(Instant::now() + Duration::from_secs(60));
        let inner = Slow::default();
        let mut svc = fence.layer().layer(inner.clone());
        // A write in flight, then its caller cancelled (a reconcile dropped at a ring change).
        let write = svc.call(request(Method::PUT));
        assert_eq!(fence.writes_in_flight(), 1);
        drop(write);
        fence.revoke();
        assert!(
            svc.call(request(Method::PATCH)).await.is_err(),
            "refused now"
        );
        let mut drained = Box::pin(fence.drained());
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut drained)
                .await
                .is_err(),
            "not drained while the write is in flight"
        );
        inner.release.notify_one();
        tokio::time::timeout(Duration::from_secs(5), drained)
            .await
            .expect("drained once the write ended");
        assert_eq!(
            inner.ended.load(Ordering::SeqCst),
            1,
            "the write ran to its end"
        );
        assert_eq!(fence.writes_in_flight(), 0);
        // Reads are neither counted nor held.
        fence.drained().await;
    }

    #[tokio::test]
    async fn a_write_not_ended_when_the_fences_time_runs_out_is_abandoned() {
        let fence = Fence::new(FenceMode::ShardMembership);
        fence.extend(Instant::now() + Duration::from_millis(300));
        let inner = Slow::default();
        let mut svc = fence.layer().layer(inner.clone());
        // Let through while valid, never answered (waiting for a connection, say).
        let write = tokio::spawn(svc.call(request(Method::PATCH)));
        // Extended meanwhile (a renewal): the write may go on until then.
        fence.extend(Instant::now() + Duration::from_millis(600));
        let extended = Instant::now() + Duration::from_millis(500);
        let err = write.await.expect("no panic").unwrap_err();
        assert!(
            Instant::now() >= extended,
            "abandoned before the extended time ran out"
        );
        let err = err.downcast::<FenceError>().expect("a FenceError");
        assert!(
            matches!(*err, FenceError::Expired { ref method, .. } if method == Method::PATCH),
            "{err:?}"
        );
        assert_eq!(inner.ended.load(Ordering::SeqCst), 0, "never ended");
        assert_eq!(fence.writes_in_flight(), 0, "no longer in flight");
        // It may have been on the wire: drained waits a margin more.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), fence.drained())
                .await
                .is_err(),
            "drained at once after an abandoned write"
        );
    }

    #[tokio::test]
    async fn a_write_an_inner_fence_abandoned_holds_the_outer_fences_drain_too() {
        // A ring's gate (open) around the membership's fence, as the sharded manager stacks
        // them: the gate's drain is what a ring change waits for.
        let gate = Fence::open();
        let membership = Fence::new(FenceMode::ShardMembership);
        membership.extend(Instant::now() + Duration::from_millis(200));
        let inner = Slow::default();
        let mut svc = gate.layer().layer(membership.layer().layer(inner.clone()));
        let err = svc.call(request(Method::PATCH)).await.unwrap_err();
        assert!(
            matches!(err.downcast_ref(), Some(FenceError::Expired { .. })),
            "{err:?}"
        );
        assert_eq!(gate.writes_in_flight(), 0, "no longer in flight");
        gate.revoke();
        assert!(
            tokio::time::timeout(Duration::from_millis(100), gate.drained())
                .await
                .is_err(),
            "the gate drained at once after a write the membership's fence abandoned"
        );
    }

    #[tokio::test]
    async fn a_refusal_names_the_mode_of_the_fence() {
        let fence = Fence::new(FenceMode::ShardMembership);
        let mut svc = fence.layer().layer(Ok200::default());
        let err = svc.call(request(Method::PUT)).await.unwrap_err();
        let err = err.downcast::<FenceError>().expect("a FenceError");
        assert!(
            matches!(*err, FenceError::NotShardMember { ref method, .. } if method == Method::PUT),
            "{err:?}"
        );
        assert!(err.to_string().contains("shard ring"), "{err}");
        assert!(!err.to_string().contains("leader"), "{err}");
        assert!(Fence::open().is_valid());
    }
}
