//! A tower layer for the kube `Client` that refuses every mutating request while this
//! replica's leader lease is not valid, so a deposed or paused leader cannot write.
//!
//! The check runs as the request enters the client's stack, immediately before it is sent;
//! reads (GET, including watches, HEAD, OPTIONS) always pass. A refused request fails with
//! [`FenceError::NotLeader`] (kube reports it as `kube::Error::Service`) and counts in
//! [`Fence::refused`](crate::leader::Fence::refused).

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use http::{Method, Request, Response};
use kube::client::Body;
use tower::{Layer, Service};

use crate::leader::Fence;

/// The boxed error of kube's client stack.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Errors of the fence.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// A write was attempted while this replica's lease was not valid.
    #[error(
        "{method} {path} refused: this replica holds no valid lease (leader election) or is not working on the current shard ring (sharding)"
    )]
    NotLeader {
        /// The request's method.
        method: Method,
        /// The request's path.
        path: String,
    },
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
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = Either<
        futures::future::MapErr<S::Future, fn(S::Error) -> BoxError>,
        Ready<Result<Response<B>, BoxError>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if is_write(req.method()) && !self.fence.is_valid() {
            self.fence.refused.inc();
            let err = FenceError::NotLeader {
                method: req.method().clone(),
                path: req.uri().path().to_string(),
            };
            tracing::warn!(error = %err, "write fenced");
            return Either::Right(ready(Err(Box::new(err))));
        }
        use futures::TryFutureExt as _;
        Either::Left(
            self.inner
                .call(req)
                .map_err(Into::into as fn(S::Error) -> BoxError),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// An inner service that answers 200 to everything and counts the calls.
    #[derive(Clone, Default)]
    struct Ok200(Arc<std::sync::atomic::AtomicUsize>);

    impl Service<Request<Body>> for Ok200 {
        type Response = Response<Body>;
        type Error = BoxError;
        type Future = Ready<Result<Response<Body>, BoxError>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request<Body>) -> Self::Future {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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
        let fence = Arc::new(Fence::default());
        let inner = Ok200::default();
        let mut svc = FenceLayer::new(Arc::clone(&fence)).layer(inner.clone());
        // Never held: writes refused, reads pass.
        let err = svc.call(request(Method::POST)).await.unwrap_err();
        assert!(
            err.to_string().contains("POST /api/v1/namespaces refused"),
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
        assert_eq!(inner.0.load(std::sync::atomic::Ordering::SeqCst), 5);
    }
}
