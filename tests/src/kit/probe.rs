//! The kit's client layer: records every request a reconcile sends and, for the crash check,
//! aborts the reconcile right after the k-th one has been carried out.

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Method, Request};
use tokio::sync::Notify;
use tower::{BoxError, Layer, Service};

/// Message of the error a tripped probe answers with.
pub const ABORTED: &str = "aborted by the idem test kit (simulated crash)";

/// One request as the probe saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// HTTP method (`GET`, `POST`, `PUT`, `PATCH`, `DELETE`).
    pub method: String,
    /// Path and query, e.g. `/api/v1/namespaces/a/configmaps?watch=true`.
    pub target: String,
}

impl Sent {
    /// Whether the request may change state (every method but `GET`/`HEAD`).
    pub fn is_write(&self) -> bool {
        self.method != "GET" && self.method != "HEAD"
    }

    /// Whether it is a watch cache's request rather than a reconcile's: a watch
    /// (`watch=true`) or a list served from the watch cache (`resourceVersion=0`, how kube's
    /// and client-go's reflectors list).
    pub fn is_cache_fill(&self) -> bool {
        let query = self.target.split_once('?').map_or("", |(_, q)| q);
        query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1" || kv == "resourceVersion=0")
    }
}

impl std::fmt::Display for Sent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.target)
    }
}

/// Shared state of one client's probe: whether it counts (only while a reconcile pass runs),
/// what it recorded, and when it trips.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    state: Mutex<State>,
    tripped: Notify,
}

#[derive(Debug, Default)]
struct State {
    armed: bool,
    sent: Vec<Sent>,
    /// Every request, armed or not.
    all: Vec<Sent>,
    trip_after: Option<usize>,
    tripped: bool,
}

/// What the probe decided for one request.
enum Admit {
    /// Send it; `trip` when the probe trips once its answer is in.
    Send { trip: bool },
    /// Refuse it: the probe has tripped.
    Refuse,
}

impl Probe {
    /// A probe that never trips.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A probe that trips after the `k`-th counted request (1-based) has been answered.
    pub(crate) fn tripping_after(k: usize) -> Arc<Self> {
        let probe = Self::new();
        probe.lock().trip_after = Some(k);
        probe
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts counting (a reconcile pass begins); returns how many were recorded before.
    pub(crate) fn arm(&self) -> usize {
        let mut s = self.lock();
        s.armed = true;
        s.sent.len()
    }

    /// Stops counting (the pass ended).
    pub(crate) fn disarm(&self) {
        self.lock().armed = false;
    }

    /// Every request recorded while armed, in order.
    pub(crate) fn sent(&self) -> Vec<Sent> {
        self.lock().sent.clone()
    }

    /// Every request recorded, during passes or not (e.g. a session's watches), in order.
    pub(crate) fn all_sent(&self) -> Vec<Sent> {
        self.lock().all.clone()
    }

    /// Whether the probe has tripped.
    pub(crate) fn has_tripped(&self) -> bool {
        self.lock().tripped
    }

    /// Resolves once the probe trips (at once when it already has).
    pub(crate) async fn tripped(&self) {
        loop {
            let notified = self.tripped.notified();
            if self.has_tripped() {
                return;
            }
            notified.await;
        }
    }

    fn admit<B>(&self, req: &Request<B>) -> Admit {
        let mut s = self.lock();
        if s.tripped {
            return Admit::Refuse;
        }
        let sent = Sent {
            method: req.method().to_string(),
            target: req
                .uri()
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default(),
        };
        s.all.push(sent.clone());
        if !s.armed {
            return Admit::Send { trip: false };
        }
        s.sent.push(sent);
        let trip = s.trip_after == Some(s.sent.len());
        Admit::Send { trip }
    }

    fn trip(&self) {
        self.lock().tripped = true;
        self.tripped.notify_waiters();
    }
}

/// A [`Layer`] putting a [`Probe`] in front of kube's client stack.
#[derive(Clone)]
pub(crate) struct ProbeLayer(pub(crate) Arc<Probe>);

impl<S> Layer<S> for ProbeLayer {
    type Service = ProbeService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ProbeService {
            inner,
            probe: self.0.clone(),
        }
    }
}

/// The service of [`ProbeLayer`].
#[derive(Clone)]
pub(crate) struct ProbeService<S> {
    inner: S,
    probe: Arc<Probe>,
}

impl<S, B, R> Service<Request<B>> for ProbeService<S>
where
    S: Service<Request<B>, Response = R, Error = BoxError>,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = R;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<R, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let method: Method = req.method().clone();
        match self.probe.admit(&req) {
            Admit::Refuse => Box::pin(async move { Err(format!("{ABORTED}: {method}").into()) }),
            Admit::Send { trip } => {
                let fut = self.inner.call(req);
                let probe = self.probe.clone();
                Box::pin(async move {
                    let res = fut.await;
                    if trip {
                        // The request was carried out; the reconcile never learns its answer.
                        probe.trip();
                        return Err(ABORTED.into());
                    }
                    res
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method) -> Request<()> {
        Request::builder()
            .method(method)
            .uri("/api/v1/namespaces/a/configmaps?watch=true")
            .body(())
            .unwrap()
    }

    #[test]
    fn counts_only_while_armed_and_trips_at_the_kth() {
        let probe = Probe::tripping_after(2);
        assert!(matches!(
            probe.admit(&req(Method::GET)),
            Admit::Send { trip: false }
        ));
        assert_eq!(probe.arm(), 0);
        assert!(matches!(
            probe.admit(&req(Method::GET)),
            Admit::Send { trip: false }
        ));
        assert!(matches!(
            probe.admit(&req(Method::POST)),
            Admit::Send { trip: true }
        ));
        probe.trip();
        assert!(matches!(probe.admit(&req(Method::GET)), Admit::Refuse));
        let sent = probe.sent();
        assert_eq!(sent.len(), 2);
        assert!(!sent[0].is_write() && sent[1].is_write());
        assert_eq!(
            sent[1].to_string(),
            "POST /api/v1/namespaces/a/configmaps?watch=true"
        );
        assert_eq!(probe.all_sent().len(), 3);
        assert!(sent[0].is_cache_fill());
        let list = |q: &str| Sent {
            method: "GET".into(),
            target: format!("/api/v1/configmaps?{q}"),
        };
        assert!(list("&resourceVersion=0").is_cache_fill());
        assert!(!list("&resourceVersion=10&labelSelector=a").is_cache_fill());
    }
}
