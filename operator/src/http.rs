//! The operator's HTTP endpoints: `/metrics` (Prometheus text format), `/healthz` (the process
//! serves requests) and `/readyz` (ready to serve as a replica: with leader election as soon as
//! it takes part in the election, leader or standby — readiness does not depend on leadership,
//! controller-runtime's convention; without it once every controller's caches have synced).

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
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "cannot listen on {addr}: {e} (choose another with --metrics-addr / --health-addr)"
            ),
        )
    })?;
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
/// address may be given for both; then one server has all three).
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
