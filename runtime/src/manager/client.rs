//! The manager's API client: kube's client stack, but transient failures (429, 503, 504) are
//! retried only for requests that are safe to repeat; every write passes the manager's fences.
//!
//! kube's default retry (`Config::default_retry`, up to 15 attempts) repeats every method. A
//! `POST` that met 504 Gateway Timeout may have been carried out (the API server gave up
//! waiting, not necessarily the write), so repeating it blindly could create twice, and a
//! create that times out because it is expensive would be sent again 15 times. Here a `POST`
//! is retried only on 429 Too Many Requests (API Priority and Fairness rejected it before it
//! ran); every other failure of a create goes back to the reconcile, whose next attempt reads
//! first and decides again. `GET`, `PUT`, `PATCH` (server-side apply, guarded merges) and
//! `DELETE` keep kube's retry (Kubernetes API conventions: only `POST` is not idempotent).

use std::path::Path;
use std::sync::Arc;

use crate::inflight::RequestSlots;
use http::{Method, Request, Response, StatusCode};
use kube::client::{Body, retry::RetryPolicy};
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};
use tower::BoxError;
use tower::buffer::BufferLayer;
use tower::retry::{Policy, RetryLayer};

use crate::leader::{Fence, FenceLayer};
use crate::shard::selector::{SelectorLayer, Selectors};

/// Why no client configuration could be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The kubeconfig file given could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// What failed.
        source: KubeconfigError,
    },
    /// Neither `KUBECONFIG`, `~/.kube/config` nor the in-cluster configuration worked.
    #[error(
        "no Kubernetes client configuration (set KUBECONFIG, pass --kubeconfig or run in a \
         cluster): {0}"
    )]
    Infer(#[from] kube::config::InferConfigError),
}

/// The configuration of `kubeconfig`, or kube's inferred one (`KUBECONFIG`, `~/.kube/config`,
/// then in-cluster).
///
/// # Errors
/// [`ConfigError`] when none can be loaded.
///
/// # Cancel safety
/// Cancel-safe: it only reads files and the environment.
pub async fn config(kubeconfig: Option<&Path>) -> Result<Config, ConfigError> {
    let kubeconfig_error = |source| ConfigError::Kubeconfig {
        path: kubeconfig
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        source,
    };
    Ok(match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(kubeconfig_error)?
        }
        None => Config::infer().await?,
    })
}

/// Whether a request with `method` that got `status` may be sent again.
pub fn safe_to_retry(method: &Method, status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || *method != Method::POST
}

/// kube's server-aware retry policy, limited to requests [`safe_to_retry`].
#[derive(Clone)]
pub struct IdempotentRetry(RetryPolicy);

impl Default for IdempotentRetry {
    fn default() -> Self {
        Self(RetryPolicy::server_retry())
    }
}

impl<Res> Policy<Request<Body>, Response<Res>, BoxError> for IdempotentRetry {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        req: &mut Request<Body>,
        result: &mut Result<Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        if let Ok(response) = result
            && !safe_to_retry(req.method(), response.status())
        {
            return None;
        }
        self.0.retry(req, result)
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        <RetryPolicy as Policy<Request<Body>, Response<Res>, BoxError>>::clone_request(
            &mut self.0,
            req,
        )
    }
}

/// A client for `config` on idem's transport (every request on one HTTP/2 connection,
/// [`super::transport`]) with kube's layers, its retry replaced by [`IdempotentRetry`].
///
/// # Errors
/// When kube cannot build the client stack from `config` (e.g. bad TLS material).
pub fn build(mut config: Config) -> Result<Client, kube::Error> {
    config.default_retry = false;
    Ok(super::transport::builder(config)?
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&RetryLayer::new(IdempotentRetry::default()))
        .build())
}

/// A client for `config` whose writes pass only while `fence` and `gate` are valid
/// ([`crate::leader::fence`]; `gate` is a shard ring's own fence, [`Fence::open`] otherwise),
/// whose lists and watches select this replica's shard ([`SelectorLayer`]), with
/// [`IdempotentRetry`] outside the fences so every attempt is fenced; with `slots`, the
/// requests of reconciles share them fairly by tenant ([`RequestSlots::client`]).
pub(crate) fn fenced(
    mut config: Config,
    fence: Arc<Fence>,
    gate: Arc<Fence>,
    selectors: Arc<Selectors>,
    slots: Option<&RequestSlots>,
) -> Result<Client, kube::Error> {
    config.default_retry = false;
    let client = super::transport::builder(config)?
        .with_layer(&SelectorLayer(selectors))
        .with_layer(&FenceLayer::new(fence))
        .with_layer(&FenceLayer::new(gate))
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&RetryLayer::new(IdempotentRetry::default()))
        .build();
    Ok(slots.map_or_else(|| client.clone(), |s| s.client(client.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_is_retried_only_when_the_server_did_not_run_it() {
        assert!(!safe_to_retry(&Method::POST, StatusCode::GATEWAY_TIMEOUT));
        assert!(!safe_to_retry(
            &Method::POST,
            StatusCode::SERVICE_UNAVAILABLE
        ));
        assert!(safe_to_retry(&Method::POST, StatusCode::TOO_MANY_REQUESTS));
        for method in [Method::GET, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(
                safe_to_retry(&method, StatusCode::GATEWAY_TIMEOUT),
                "{method}"
            );
        }
    }
}
