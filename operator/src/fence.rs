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
    #[error("{method} {path} refused: this replica does not hold a valid leader lease")]
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
