//! Shared helpers of the controller integration tests: test CRDs, namespaces, polling.

#![allow(dead_code)] // each test binary uses a subset

pub mod user;

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Field manager of the tests' own writes.
pub const MANAGER: &str = "idem-runtime-tests";

/// Test primary kind for the trigger and concurrency tests.
#[derive(kube::CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema, PartialEq)]
#[kube(
    group = "test.idem.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
pub struct WidgetSpec {
    /// Any value; changing it bumps metadata.generation.
    pub value: i64,
}

/// Status of a [`Widget`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema, PartialEq)]
pub struct WidgetStatus {
    /// The generation the reconcile saw.
    #[serde(rename = "observedGeneration", default)]
    pub observed_generation: i64,
    /// Changes on every reconcile, so each status write is a real write.
    #[serde(default)]
    pub reconciles: i64,
}

/// Test primary kind for the no-cycle test (its own resource, so apiserver write counters are
/// not shared with other tests running in parallel).
#[derive(kube::CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema, PartialEq)]
#[kube(
    group = "test.idem.dev",
    version = "v1",
    kind = "Echo",
    namespaced,
    status = "WidgetStatus"
)]
pub struct EchoSpec {
    /// Any value.
    pub value: i64,
}

/// Install `crd` (server-side apply, idempotent) and wait until it is Established.
pub async fn install_crd(client: &Client, crd: CustomResourceDefinition) {
    idem_tests::install_crd(client, &crd)
        .await
        .expect("install crd");
}

/// Install the [`Widget`] CRD.
pub async fn install_widget(client: &Client) {
    install_crd(client, Widget::crd()).await;
}

/// Install the [`Echo`] CRD.
pub async fn install_echo(client: &Client) {
    install_crd(client, Echo::crd()).await;
}

/// Create a fresh namespace and return its name.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = idem_tests::unique_name(prefix);
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    name
}

/// Polls `done` every 50 ms until it holds.
///
/// # Panics
/// After `timeout`, naming `what`.
pub async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {timeout:?} for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
