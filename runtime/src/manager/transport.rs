//! The manager's HTTP transport: requests that end (reads, writes) share one HTTP/2 connection
//! per API server, as client-go's do, where kube's default stack opens an HTTP/1.1 connection
//! for each request in flight and keeps them all open.
//!
//! Why: a controller that sends its reconciles' requests concurrently (up to the request
//! slots' total, 64 by default) held 80 connections to the API server after a fill, each with
//! its TLS session and buffers: about 3 MB of a 15 MB heap at 1,000 tenants. One HTTP/2
//! connection carries the same requests as streams. The server must offer HTTP/2 in TLS's
//! protocol negotiation (every API server does); otherwise, and through a proxy, the transport
//! is kube's own (HTTP/1.1).
//!
//! Requests that need not end — watches (`watch=true`), followed logs (`follow=true`) and
//! upgrades (exec, attach, port-forward) — each keep an HTTP/1.1 connection of their own
//! ([`long_running`]): a server allows only so many streams on one connection (250 for Go's
//! default), and the HTTP/2 client waits for a free stream rather than open a second
//! connection, so a controller holding that many watches would wait forever on its next write.
//!
//! HTTP/2 pings every [`PING_INTERVAL`] keep an idle connection's reads alive, so the
//! configuration's read timeout fires only for a server that stopped answering (client-go's
//! `ReadIdleTimeout` and `PingTimeout` do the same).

use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::Config;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use tower::util::BoxService;
use tower::{BoxError, Service, ServiceBuilder};

/// How often an HTTP/2 connection is pinged, even with no request on it.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is dropped.
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// The service [`builder`] returns (the same as kube's default stack).
pub type Transport = BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

type Connector = hyper_timeout::TimeoutConnector<hyper_rustls::HttpsConnector<HttpConnector>>;

/// Whether a request may stay open indefinitely: a watch, a followed log or an upgrade.
pub fn long_running<B>(request: &Request<B>) -> bool {
    let flag = |name: &str| {
        request.uri().query().is_some_and(|q| {
            q.split('&')
                .any(|p| p == format!("{name}=true") || p == format!("{name}=1"))
        })
    };
    flag("watch") || flag("follow") || request.headers().contains_key(http::header::UPGRADE)
}

/// A client builder for `config` on this transport (kube's own, HTTP/1.1, through a proxy);
/// add layers and `build()` it.
///
/// # Errors
/// When the TLS material, the credentials or the extra headers of `config` are unusable.
pub fn builder(config: Config) -> Result<ClientBuilder<Transport>, kube::Error> {
    if config.proxy_url.is_some() {
        return ClientBuilder::try_from(config);
    }
    let multiplexed = HttpClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector(&config, true)?);
    let dedicated = HttpClient::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .build(connector(&config, false)?);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .service(Route {
            multiplexed,
            dedicated,
        });
    Ok(ClientBuilder::new(
        BoxService::new(service),
        config.default_namespace,
    ))
}

/// TLS (with the configuration's roots, client identity and server name) and the
/// configuration's timeouts; offering HTTP/2 when `http2`.
fn connector(config: &Config, http2: bool) -> Result<Connector, kube::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http()
        .enable_http1();
    let https = if http2 {
        tls.enable_http2().wrap_connector(http)
    } else {
        tls.wrap_connector(http)
    };
    let mut timed = hyper_timeout::TimeoutConnector::new(https);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    timed.set_reset_reader_on_write(config.reset_reader_on_write);
    Ok(timed)
}

/// Sends each request on the shared connection, or on one of its own when it is
/// [`long_running`].
#[derive(Clone)]
struct Route {
    multiplexed: HttpClient<Connector, Body>,
    dedicated: HttpClient<Connector, Body>,
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
        let client = if long_running(&request) {
            &self.dedicated
        } else {
            &self.multiplexed
        };
        let response = client.request(request);
        Box::pin(async move {
            let response = response.await.map_err(BoxError::from)?;
            Ok(response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    #[test]
    fn watches_follows_and_upgrades_are_long_running_other_requests_are_not() {
        assert!(long_running(&get("/api/v1/namespaces?watch=true")));
        assert!(long_running(&get(
            "/api/v1/pods?labelSelector=a&watch=1&resourceVersion=5"
        )));
        assert!(long_running(&get(
            "/api/v1/namespaces/n/pods/p/log?follow=true"
        )));
        let mut exec = get("/api/v1/namespaces/n/pods/p/exec?command=ls");
        exec.headers_mut()
            .insert(http::header::UPGRADE, "websocket".parse().unwrap());
        assert!(long_running(&exec));

        assert!(!long_running(&get("/api/v1/namespaces")));
        assert!(!long_running(&get("/api/v1/namespaces?watch=false")));
        assert!(!long_running(&get(
            "/api/v1/pods?labelSelector=watch%3Dtrue"
        )));
        assert!(!long_running(&get(
            "/api/v1/pods?allowWatchBookmarks=true&limit=500"
        )));
    }
}
