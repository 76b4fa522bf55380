//! The tower layer and service that apply a [`Faults`] handle to every request.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tower::{BoxError, Layer, Service};

use super::{Decision, FaultBody, Faults, Verb};

/// A tower [`Layer`] that puts a [`FaultService`] around a client's service stack.
#[derive(Debug, Clone)]
pub struct FaultLayer {
    faults: Faults,
}

impl FaultLayer {
    /// A layer applying `faults`.
    pub fn new(faults: Faults) -> Self {
        Self { faults }
    }
}

impl<S> Layer<S> for FaultLayer {
    type Service = FaultService<S>;

    fn layer(&self, inner: S) -> FaultService<S> {
        FaultService {
            inner,
            faults: self.faults.clone(),
        }
    }
}

/// The service of a [`FaultLayer`]: counts each request by [`Verb`], answers it with an
/// injected error or forwards it (after the configured latency), and wraps successful watch
/// responses so they can be held, delayed, cut or expired.
#[derive(Debug, Clone)]
pub struct FaultService<S> {
    inner: S,
    faults: Faults,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for FaultService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    ResB: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
{
    type Response = Response<FaultBody<ResB>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let verb = Verb::of(req.method(), req.uri(), req.headers());
        let (decision, latency) = self.faults.decide(verb);
        let forwarded = match decision {
            Decision::Forward => Some(self.inner.call(req)),
            _ => None,
        };
        let faults = self.faults.clone();
        Box::pin(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            let Some(forwarded) = forwarded else {
                return Ok(injected(decision));
            };
            let res = forwarded.await.map_err(Into::into)?;
            if verb == Verb::Watch && res.status().is_success() {
                let (ctl, hold, delay) = faults.open_watch();
                Ok(res.map(|b| FaultBody::watch(b, ctl, hold, delay)))
            } else {
                Ok(res.map(FaultBody::plain))
            }
        })
    }
}

/// The response the API server would send for `decision`: a `Status` object as JSON.
fn injected<B>(decision: Decision) -> Response<FaultBody<B>> {
    let (code, reason, message, retry_after) = match decision {
        Decision::Conflict => (
            StatusCode::CONFLICT,
            "Conflict",
            "the object has been modified (injected by idem_tests::faults)",
            None,
        ),
        Decision::TooManyRequests(secs) => (
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            "too many requests, please try again later (injected by idem_tests::faults)",
            Some(secs),
        ),
        Decision::ServerError | Decision::Forward => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "an error on the server (injected by idem_tests::faults)",
            None,
        ),
    };
    let mut status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    let mut res = Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json");
    if let Some(secs) = retry_after {
        status["details"] = serde_json::json!({ "retryAfterSeconds": secs });
        res = res.header(http::header::RETRY_AFTER, secs);
    }
    res.body(FaultBody::full(status.to_string()))
        .expect("a response from valid parts")
}
