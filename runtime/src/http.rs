//! An operator's HTTP endpoints: `/metrics` (Prometheus text format), `/healthz` (the process
//! serves requests) and `/readyz` (ready to serve as a replica: with leader election as soon as
//! it takes part in the election, leader or standby — readiness does not depend on leadership,
//! controller-runtime's convention; without it once every controller's caches have synced, e.g.
//! from [`Controller::with_synced_signal`](crate::controller::Controller::with_synced_signal)),
//! and [`shutdown_signal`] for a graceful shutdown on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Shared state of the endpoints.
#[derive(Clone)]
struct Endpoints {
    registry: Arc<Registry>,
    ready: watch::Receiver<bool>,
}

async fn metrics(State(e): State<Endpoints>) -> impl IntoResponse {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &e.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        ),
        Err(err) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            err.to_string(),
        ),
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(e): State<Endpoints>) -> (StatusCode, &'static str) {
    if *e.ready.borrow() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// Binds `addr` and serves the given routes until `shutdown` resolves. Returns the bound
/// address (useful with port 0) and the server task.
///
/// # Errors
/// When `addr` cannot be bound.
async fn serve(
    addr: SocketAddr,
    app: Router,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let stop = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::error!(error = %e, "HTTP server failed");
        }
    });
    Ok((bound, task))
}

/// Serves `/metrics` on `metrics_addr` and `/healthz` + `/readyz` on `health_addr` (the same
/// address may be given for both; then one server has all three) until `shutdown` holds
/// `true`. `/readyz` answers 200 while `ready` holds `true`, else 503. Returns each bound
/// address (port 0 picks a free one) with its server task.
///
/// # Errors
/// When an address cannot be bound.
pub async fn start(
    metrics_addr: SocketAddr,
    health_addr: SocketAddr,
    registry: Arc<Registry>,
    ready: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<Vec<(SocketAddr, tokio::task::JoinHandle<()>)>> {
    let state = Endpoints { registry, ready };
    let health = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    let metrics = Router::new().route("/metrics", get(metrics));
    if metrics_addr == health_addr {
        let app = health.merge(metrics).with_state(state);
        return Ok(vec![serve(health_addr, app, shutdown).await?]);
    }
    Ok(vec![
        serve(
            metrics_addr,
            metrics.with_state(state.clone()),
            shutdown.clone(),
        )
        .await?,
        serve(health_addr, health.with_state(state), shutdown).await?,
    ])
}

/// Resolves on SIGTERM (what the kubelet sends to stop a pod) or Ctrl-C: give it to
/// [`Controller::run`](crate::controller::Controller::run) (or the driver's `run`) for a
/// graceful shutdown (stop taking work, let in-flight reconciles finish within
/// [`ControllerConfig::shutdown_grace`](crate::controller::ControllerConfig::shutdown_grace)).
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Status code and body of `GET path` on `addr` (HTTP/1.1, connection closed after).
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let code = answer[9..12].parse().unwrap();
        let body = answer
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        (code, body)
    }

    #[tokio::test]
    async fn probes_follow_readiness_and_metrics_are_served() {
        let mut registry = Registry::default();
        let counter = prometheus_client::metrics::counter::Counter::<u64>::default();
        registry.register("probe_test", "a test counter", counter.clone());
        counter.inc();
        let (ready_tx, ready) = watch::channel(false);
        let (stop_tx, stop) = watch::channel(false);
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let servers = start(any, any, Arc::new(registry), ready, stop)
            .await
            .unwrap();
        assert_eq!(servers.len(), 1, "one address: one server with all three");
        let (metrics_addr, health_addr) = (servers[0].0, servers[0].0);
        assert_eq!(get(health_addr, "/healthz").await.0, 200);
        assert_eq!(get(health_addr, "/readyz").await.0, 503);
        ready_tx.send(true).unwrap();
        assert_eq!(get(health_addr, "/readyz").await.0, 200);
        let (code, body) = get(metrics_addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("probe_test_total 1"), "{body}");
        stop_tx.send(true).unwrap();
        for (_, task) in servers {
            task.await.unwrap();
        }
    }
}
