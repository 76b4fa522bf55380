//! A tower layer for the kube `Client` that asks the API server for this replica's shard only:
//! it appends the API server's `shardSelector` to list and watch requests of the sharded collections,
//! counts every request it sends by method and answer (as controller-runtime's
//! `rest_client_requests_total`), and the bytes and watch events every GET brings back.
//!
//! The selector is added only to GETs of the cluster-wide collections named in
//! [`Selectors::new`] (a list,
//! or a watch with `watch=true`), and only while [`Selectors::server_side`] holds: when the
//! `ShardedListAndWatch` gate is off the parameter would be ignored, and the controllers filter
//! on their side in any case ([`crate::controller::Controller::shard`]), so results
//! are the same either way.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use super::{Ranges, ShardField};
use futures::future::{BoxFuture, FutureExt as _};
use http::{Method, Request, Response, Uri};
use http_body::{Body as HttpBody, Frame, SizeHint};
use kube::client::Body;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tower::{Layer, Service};

/// The labels of a request count: `method` (`GET`, `POST`, `PUT`, `PATCH`, `DELETE`; a GET
/// with `watch=true` is `WATCH`) and `code` (the answer's HTTP status, `<error>` when none
/// came).
pub type RequestLabels = Vec<(&'static str, String)>;

/// What the layer reads and counts; shared with the manager.
#[derive(Debug, Default)]
pub struct Selectors {
    /// The cluster-wide collection paths (e.g. `/api/v1/configmaps`) whose lists and watches
    /// are sharded, and on which field.
    sharded: Vec<(String, ShardField)>,
    ranges: RwLock<Option<Ranges>>,
    /// Whether the API server filters by `shardSelector` (found by [`super::probe_server_side`]).
    pub server_side: AtomicBool,
    /// Bytes of response bodies of GET requests (lists, watches, reads), in bytes.
    pub bytes_received: Counter,
    /// Watch events received (lines of `watch=true` responses).
    pub events_received: Counter,
    /// Requests sent (see [`RequestLabels`]); on the controllers' client, below its retry,
    /// each attempt of a retried request is counted.
    pub requests: Family<RequestLabels, Counter>,
}

impl Selectors {
    /// Selectors for the cluster-wide collections `sharded` (path, e.g.
    /// `/apis/apps/v1/deployments`, and the field its objects are sharded on); objects of
    /// one owner must share the field's value (a uid-sharded kind's children have uids of
    /// their own, so they are not listed here but selected by label).
    pub fn new(sharded: Vec<(String, ShardField)>) -> Self {
        Self {
            sharded,
            ..Self::default()
        }
    }

    /// Sets the ranges later list/watch requests select (`None`: no selector).
    pub fn set(&self, ranges: Option<Ranges>) {
        *self.ranges.write().unwrap_or_else(|e| e.into_inner()) = ranges;
    }

    /// The `shardSelector` for a GET of `path`, if it is sharded and server-side filtering is on.
    fn selector_for(&self, path: &str) -> Option<String> {
        if !self.server_side.load(Ordering::Relaxed) {
            return None;
        }
        let field = self.sharded.iter().find(|(p, _)| p == path)?.1;
        let ranges = self.ranges.read().unwrap_or_else(|e| e.into_inner());
        ranges.as_ref()?.selector(field)
    }
}

/// Percent-encodes a query value (RFC 3986 unreserved characters pass).
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 2);
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `uri` with `shardSelector=selector` appended to its query.
pub fn with_selector(uri: &Uri, selector: &str) -> Uri {
    let pq = match uri.query() {
        Some(q) => format!("{}?{q}&shardSelector={}", uri.path(), encode(selector)),
        None => format!("{}?shardSelector={}", uri.path(), encode(selector)),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = pq.parse().ok();
    Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
}

/// Adds [`SelectorService`] to a client's stack.
#[derive(Clone, Debug)]
pub struct SelectorLayer(pub Arc<Selectors>);

impl<S> Layer<S> for SelectorLayer {
    type Service = SelectorService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SelectorService {
            inner,
            selectors: Arc::clone(&self.0),
        }
    }
}

/// The service made by [`SelectorLayer`].
#[derive(Clone, Debug)]
pub struct SelectorService<S> {
    inner: S,
    selectors: Arc<Selectors>,
}

impl<S, B> Service<Request<Body>> for SelectorService<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<Counting<B>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        let get = req.method() == Method::GET;
        let watch = get && req.uri().query().is_some_and(|q| q.contains("watch=true"));
        if get && let Some(selector) = self.selectors.selector_for(req.uri().path()) {
            *req.uri_mut() = with_selector(req.uri(), &selector);
        }
        let method = if watch {
            "WATCH".to_owned()
        } else {
            req.method().as_str().to_owned()
        };
        let counted = Arc::clone(&self.selectors);
        let selectors = get.then(|| Arc::clone(&self.selectors));
        self.inner
            .call(req)
            .map(move |res| {
                let code = match &res {
                    Ok(r) => r.status().as_u16().to_string(),
                    Err(_) => "<error>".to_owned(),
                };
                counted
                    .requests
                    .get_or_create(&vec![("method", method), ("code", code)])
                    .inc();
                res.map(|r| {
                    r.map(|inner| Counting {
                        inner,
                        selectors,
                        watch,
                    })
                })
            })
            .boxed()
    }
}

/// A response body that counts its bytes (and lines, for a watch) in [`Selectors`].
#[derive(Debug)]
pub struct Counting<B> {
    inner: B,
    selectors: Option<Arc<Selectors>>,
    watch: bool,
}

impl<B> HttpBody for Counting<B>
where
    B: HttpBody<Data = bytes::Bytes> + Unpin,
{
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some(s)) = (&polled, &self.selectors)
            && let Some(data) = frame.data_ref()
        {
            s.bytes_received.inc_by(data.len() as u64);
            if self.watch {
                let lines = data.iter().filter(|b| **b == b'\n').count();
                s.events_received.inc_by(lines as u64);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_are_appended_only_to_sharded_collections_when_server_side() {
        let s = Selectors::new(vec![
            (
                "/apis/tenancy.idem.dev/v1alpha1/tenants".into(),
                ShardField::Uid,
            ),
            ("/api/v1/configmaps".into(), ShardField::Namespace),
        ]);
        s.set(Some(Ranges::all()));
        assert_eq!(
            s.selector_for("/api/v1/configmaps"),
            None,
            "server side off"
        );
        s.server_side.store(true, Ordering::Relaxed);
        let sel = s.selector_for("/api/v1/configmaps").unwrap();
        assert!(sel.contains("object.metadata.namespace"), "{sel}");
        assert!(
            s.selector_for("/apis/tenancy.idem.dev/v1alpha1/tenants")
                .unwrap()
                .contains("object.metadata.uid")
        );
        assert_eq!(s.selector_for("/api/v1/namespaces/a/configmaps"), None);
        assert_eq!(s.selector_for("/api/v1/namespaces"), None);
        s.set(None);
        assert_eq!(s.selector_for("/api/v1/configmaps"), None);
    }

    #[test]
    fn the_selector_is_percent_encoded_into_the_query() {
        let uri: Uri = "/api/v1/configmaps?watch=true&resourceVersion=5"
            .parse()
            .unwrap();
        let out = with_selector(&uri, "shardRange(object.metadata.uid, '0x0', '0x1') || x");
        assert_eq!(
            out.to_string(),
            "/api/v1/configmaps?watch=true&resourceVersion=5&shardSelector=shardRange%28object.metadata.uid%2C%20%270x0%27%2C%20%270x1%27%29%20%7C%7C%20x"
        );
        let bare: Uri = "/api/v1/configmaps".parse().unwrap();
        assert!(
            with_selector(&bare, "a")
                .to_string()
                .ends_with("?shardSelector=a")
        );
    }
}
