//! The manager's HTTP transport: requests that end (reads, writes) share one HTTP/2 connection
//! per API server, as client-go's do, where kube's default stack opens an HTTP/1.1 connection
//! for each request in flight and keeps them all open.
//!
//! Why: a controller that sends its reconciles' requests concurrently (up to the request
//! slots' total, 64 by default) held 80 connections to the API server after a fill, each with
//! its TLS session and buffers: about 3 MB of a 15 MB heap at 1,000 tenants. One HTTP/2
//! connection carries the same requests as streams.
//!
//! - **HTTP/2 only, over TLS, once the server has said it speaks it.** The first request asks
//!   the `https` server which protocols it speaks (one TLS handshake offering HTTP/2 and
//!   HTTP/1.1, `Protocol`); every request after it waits for that answer. Where the server
//!   chose HTTP/2 (every kube-apiserver does) the shared client speaks it from the first byte,
//!   so a burst of requests on a new client, or right after the connection was lost, waits for
//!   one connection instead of each opening its own (with the protocol negotiated per
//!   connection, 64 requests opened 34 connections and dropped all but one). Where it chose
//!   HTTP/1.1 (a TLS proxy in between that speaks only that) every request gets a connection
//!   of its own, as on kube's stack. Plain-`http` servers get HTTP/1.1.
//! - **Credentials as kube's stack takes them**: its authentication layer (tokens, refreshed
//!   ones, and `exec` credential plugins giving tokens) and its TLS configuration (client
//!   certificates, an `exec` plugin's included). A client certificate from an `exec` plugin
//!   is used until the client is built again: [`kube::Client::valid_until`] is `None` here,
//!   where kube's stack gives the certificate's expiry (kube keeps what reads it to itself).
//! - **Through an HTTP proxy** when one applies (the kubeconfig's
//!   `proxy-url`, or `HTTPS_PROXY` unless `NO_PROXY` or a loopback server excludes it): every
//!   connection is an HTTP `CONNECT` tunnel through it; TLS and HTTP/2 then run end to end with
//!   the API server, as without a proxy. One connector type serves both, so the binary holds
//!   one copy of the HTTP client: keeping kube's own stack for proxies and `exec` plugins, as
//!   idem did, held a second copy, about 0.5 MB of code resident in every replica.
//! - **Long-running requests keep a connection of their own** ([`long_running`]: watches,
//!   followed logs, upgrades such as exec and port-forward), over HTTP/1.1: a server allows only
//!   so many streams on one connection (kube-apiserver 1.37 advertises 100) and the HTTP/2
//!   client waits for a free stream rather than open a second connection, so a controller
//!   holding that many watches would wait forever on its next write.
//! - **A request the server refused unprocessed is sent again** (`refused_unprocessed`): a
//!   server closing the connection gracefully (`GOAWAY` with `NO_ERROR`, which
//!   `--goaway-chance` does to spread clients over API servers) refuses the streams it had not
//!   started, and `REFUSED_STREAM` says the same of one stream (RFC 9113, 8.7). Safe for every
//!   method, a create included: the server did nothing with it.
//! - **Pings** every [`PING_INTERVAL`] keep the shared connection's reads alive, so a quiet
//!   connection is not ended by the configuration's read timeout, and a dead one is dropped
//!   after [`PING_TIMEOUT`] (client-go's `ReadIdleTimeout` and `PingTimeout`). The read timeout
//!   applies to the whole connection: set one (kube's default is none) above the ping interval
//!   plus its timeout, or slow answers end every request on the connection.
//!
//! Each request is a debug-level `HTTP` span with its method, URI and status (what kube's
//! stack logs under `kube_client`), here under this module.

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt as _, Shared};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::Connection;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::Config;

pub use super::proxy::ProxyError;
use super::proxy::Tcp;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use tower::util::BoxService;
use tower::{BoxError, Service, ServiceBuilder};
use tracing::Instrument;

/// How often an HTTP/2 connection is pinged, even with no request on it.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is dropped.
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);
/// Times a request refused unprocessed is sent again. One `GOAWAY` refuses every stream the
/// server had not started, and a request sent again at once may meet the same closing
/// connection before the pool has seen it close: several resends in a row are normal.
const RESENDS: usize = 10;

/// The service [`builder`] returns (the same as kube's default stack).
pub type Transport = BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

type Connector = hyper_timeout::TimeoutConnector<hyper_rustls::HttpsConnector<Tcp>>;

/// Whether a request may stay open indefinitely: a watch (a `watch` parameter the API server
/// reads as true — any value but `false` or `0` — or a path under `/watch/`), a followed log
/// (`follow`, alike) or an upgrade (exec, attach, port-forward).
pub fn long_running<B>(request: &Request<B>) -> bool {
    let set = |name: &str| {
        let query = request.uri().query().unwrap_or_default();
        query.split('&').any(|p| {
            let (key, value) = p.split_once('=').unwrap_or((p, ""));
            key == name && !value.eq_ignore_ascii_case("false") && value != "0"
        })
    };
    // `/api/<version>/watch/…` or `/apis/<group>/<version>/watch/…`.
    let segments: Vec<&str> = request.uri().path().split('/').collect();
    let watch_path = match segments.get(1) {
        Some(&"api") => segments.get(3) == Some(&"watch"),
        Some(&"apis") => segments.get(4) == Some(&"watch"),
        _ => false,
    };
    set("watch")
        || set("follow")
        || watch_path
        || request.headers().contains_key(http::header::UPGRADE)
}

/// A client builder for `config` on this transport; add layers and `build()` it.
///
/// # Errors
/// When the proxy `config` goes through is not an `http://` one ([`ProxyError`], as
/// [`kube::Error::Service`]), or the TLS material, the server name, the credentials or the
/// extra headers of `config` are unusable.
pub fn builder(config: Config) -> Result<ClientBuilder<Transport>, kube::Error> {
    let proxy = super::proxy::through(&config, &super::proxy::Environment::read());
    let tcp = Tcp::new(proxy.as_ref()).map_err(|e| kube::Error::Service(Box::new(e)))?;
    let tls = config.cluster_url.scheme_str() == Some("https");
    // Made once: with an `exec` plugin giving a client certificate, each one runs the plugin.
    let tls_config = config.rustls_client_config()?;
    let make = |alpn| connector(&config, tcp.clone(), tls_config.clone(), alpn);
    let multiplexed = HttpClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_only(tls)
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(make(if tls { Alpn::H2 } else { Alpn::H1 })?);
    let dedicated = HttpClient::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .build(make(Alpn::H1)?);
    let protocol = if tls {
        Protocol::Ask(make(Alpn::Both)?, Arc::default())
    } else {
        Protocol::Http1
    };
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .service(Route {
            multiplexed,
            dedicated,
            protocol,
        });
    Ok(ClientBuilder::new(
        BoxService::new(service),
        config.default_namespace,
    ))
}

/// The protocols a connector offers the server (TLS ALPN).
#[derive(Clone, Copy)]
enum Alpn {
    H2,
    H1,
    Both,
}

/// TLS over `tcp` with `tls` (the configuration's roots and client identity) and the
/// configuration's server name (`tls-server-name`) and timeouts; offering the protocols of
/// `alpn`.
fn connector(
    config: &Config,
    tcp: Tcp,
    tls: rustls::ClientConfig,
    alpn: Alpn,
) -> Result<Connector, kube::Error> {
    let mut tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name
            .clone()
            .try_into()
            .map_err(|e| kube::Error::Service(Box::new(e)))?;
        tls = tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = match alpn {
        Alpn::H2 => tls.enable_http2().wrap_connector(tcp),
        Alpn::H1 => tls.enable_http1().wrap_connector(tcp),
        Alpn::Both => tls.enable_all_versions().wrap_connector(tcp),
    };
    let mut timed = hyper_timeout::TimeoutConnector::new(https);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    timed.set_reset_reader_on_write(config.reset_reader_on_write);
    Ok(timed)
}

/// Whether `error` says the server refused the request without processing it: its stream was
/// above the last one a graceful `GOAWAY` (`NO_ERROR`) let through, or was reset with
/// `REFUSED_STREAM`.
fn refused_unprocessed(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM)
                || (h2.is_go_away()
                    && h2.is_remote()
                    && h2.reason() == Some(h2::Reason::NO_ERROR));
        }
        next = e.source();
    }
    false
}

/// A copy of `request` to send again, when its body can be copied.
fn copy(request: &Request<Body>) -> Option<Request<Body>> {
    let mut copy = Request::new(request.body().try_clone()?);
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    Some(copy)
}

/// Whether the server speaks HTTP/2: known, or asked once by a connection offering both.
#[derive(Clone)]
enum Protocol {
    /// Plain `http`: HTTP/1.1.
    Http1,
    /// `https`: the connector offering both protocols, and what is known of the server.
    Ask(Connector, Arc<Mutex<Asked>>),
}

/// A handshake's answer: HTTP/2 or not, or why it failed.
type Answer = Shared<BoxFuture<'static, Result<bool, Arc<BoxError>>>>;

/// What is known of the server's protocol.
#[derive(Default)]
enum Asked {
    /// Nothing yet, or the last handshake failed.
    #[default]
    Unknown,
    /// A handshake is under way; everyone asking waits for its answer.
    Asking(Answer),
    /// The server's choice (`true`: HTTP/2).
    Known(bool),
}

impl Protocol {
    /// Whether requests to the server at `uri` go on the shared HTTP/2 connection: asked with
    /// one TLS handshake, whose answer every request waits for; asked again by the first
    /// request after a handshake failed (every request that waited for it fails with it).
    ///
    /// # Errors
    /// When the connection or the handshake failed.
    async fn http2(&self, uri: &http::Uri) -> Result<bool, BoxError> {
        let Self::Ask(connector, asked) = self else {
            return Ok(false);
        };
        let answer = {
            let mut asked = asked.lock().unwrap_or_else(PoisonError::into_inner);
            match &*asked {
                Asked::Known(h2) => return Ok(*h2),
                Asked::Asking(answer) => answer.clone(),
                Asked::Unknown => {
                    let (mut connector, uri) = (connector.clone(), uri.clone());
                    let answer = async move {
                        let connection = connector.call(uri).await.map_err(Arc::new)?;
                        let h2 = connection.connected().is_negotiated_h2();
                        tracing::debug!(http2 = h2, "the server's protocol");
                        Ok(h2)
                    }
                    .boxed()
                    .shared();
                    *asked = Asked::Asking(answer.clone());
                    answer
                }
            }
        };
        let result = answer.clone().await;
        let mut asked = asked.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(&*asked, Asked::Asking(current) if current.ptr_eq(&answer)) {
            *asked = match result {
                Ok(h2) => Asked::Known(h2),
                Err(_) => Asked::Unknown,
            };
        }
        result.map_err(|e| e.to_string().into())
    }

    /// Forgets the server's answer, so the next request asks again: a connection could not be
    /// made with the protocol it chose (another server behind the same address, a proxy put
    /// in front since).
    fn forget(&self) {
        if let Self::Ask(_, asked) = self {
            let mut asked = asked.lock().unwrap_or_else(PoisonError::into_inner);
            if matches!(&*asked, Asked::Known(_)) {
                *asked = Asked::Unknown;
            }
        }
    }
}

/// Sends each request on the shared connection, or on one of its own when it is
/// [`long_running`] or the server speaks only HTTP/1.1; a connection that could not be made
/// makes the next request ask the server's protocol again.
#[derive(Clone)]
struct Route {
    multiplexed: HttpClient<Connector, Body>,
    dedicated: HttpClient<Connector, Body>,
    protocol: Protocol,
}

impl Service<Request<Body>> for Route {
    type Response = Response<Box<DynBody>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // hyper's client is always ready: it queues on its pool.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let span = tracing::debug_span!(
            "HTTP",
            method = %request.method(),
            uri = %request.uri(),
            status = tracing::field::Empty,
        );
        let long = long_running(&request);
        let (multiplexed, dedicated) = (self.multiplexed.clone(), self.dedicated.clone());
        let protocol = self.protocol.clone();
        let send = async move {
            let client = if !long && protocol.http2(request.uri()).await? {
                multiplexed
            } else {
                dedicated
            };
            let mut request = request;
            let mut resends = 0;
            let response = loop {
                let again = (!long && resends < RESENDS)
                    .then(|| copy(&request))
                    .flatten();
                match client.request(request).await {
                    Err(e) if refused_unprocessed(&e) && again.is_some() => {
                        tracing::debug!(error = %e, "refused unprocessed; sending again");
                        resends += 1;
                        request = again.expect("checked");
                        // Lets the connection's task read the `GOAWAY` first, so the pool
                        // gives the resend a connection that is not closing.
                        tokio::task::yield_now().await;
                    }
                    Err(e) => {
                        if !long && e.is_connect() {
                            protocol.forget();
                        }
                        return Err(e.into());
                    }
                    Ok(response) => break response,
                }
            };
            tracing::Span::current().record("status", response.status().as_u16());
            tracing::debug!("response");
            Ok(response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>))
        };
        Box::pin(send.instrument(span))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    #[test]
    fn what_the_server_reads_as_a_watch_a_follow_or_an_upgrade_is_long_running() {
        for uri in [
            "/api/v1/namespaces?watch=true",
            "/api/v1/pods?labelSelector=a&watch=1&resourceVersion=5",
            "/api/v1/pods?watch=True",
            "/api/v1/pods?watch=yes",
            "/api/v1/pods?watch",
            "/api/v1/pods?watch=",
            "/api/v1/watch/namespaces",
            "/apis/apps/v1/watch/namespaces/n/deployments/d",
            "/api/v1/namespaces/n/pods/p/log?follow=true",
        ] {
            assert!(long_running(&get(uri)), "{uri}");
        }
        let mut exec = get("/api/v1/namespaces/n/pods/p/exec?command=ls");
        exec.headers_mut()
            .insert(http::header::UPGRADE, "websocket".parse().unwrap());
        assert!(long_running(&exec));

        for uri in [
            "/api/v1/namespaces",
            "/api/v1/namespaces?watch=false",
            "/api/v1/namespaces?watch=FALSE",
            "/api/v1/namespaces?watch=0",
            "/api/v1/pods?labelSelector=watch%3Dtrue",
            "/api/v1/pods?allowWatchBookmarks=true&limit=500",
            "/api/v1/namespaces/watch/configmaps/watcher",
        ] {
            assert!(!long_running(&get(uri)), "{uri}");
        }
    }

    #[test]
    fn only_a_graceful_goaway_or_a_refused_stream_is_sent_again() {
        let refused: h2::Error = h2::Reason::REFUSED_STREAM.into();
        assert!(refused_unprocessed(&refused));
        let cancelled: h2::Error = h2::Reason::CANCEL.into();
        assert!(!refused_unprocessed(&cancelled));
        let io = std::io::Error::other("connection reset");
        assert!(!refused_unprocessed(&io));
    }
}
