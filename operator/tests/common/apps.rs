//! TenantApp helpers for the end-to-end tests: creating apps and waiting on their conditions.

use std::collections::BTreeMap;

use idem_operator::resources::{TenantApp, TenantAppSpec};
use kube::api::{Api, PostParams};

use super::{TIMEOUT, eventually, why};

/// An app running `nginx:1.27` with `replicas` pods on port 8080, one env var and one config
/// file with `config` as its content.
pub fn spec(replicas: i32, config: &str) -> TenantAppSpec {
    TenantAppSpec {
        image: "nginx:1.27".into(),
        replicas: Some(replicas),
        port: 8080,
        env: BTreeMap::from([("LOG_LEVEL".into(), "info".into())]),
        config: BTreeMap::from([("app.toml".into(), config.into())]),
    }
}

/// Creates app `name` in `namespace`.
///
/// # Panics
/// When the API server rejects it.
pub async fn create(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    spec: TenantAppSpec,
) -> TenantApp {
    Api::<TenantApp>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &TenantApp::new(name, spec))
        .await
        .unwrap_or_else(|e| panic!("creating app {namespace}/{name}: {e}"))
}

/// Waits until app `namespace/name` has condition `type_` = `"True"` with `reason` for its
/// current generation, and returns it.
///
/// # Panics
/// After [`TIMEOUT`], with the last status seen.
pub async fn wait_condition(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    type_: &str,
    reason: &str,
) -> TenantApp {
    let apps: Api<TenantApp> = Api::namespaced(client.clone(), namespace);
    eventually(
        &format!("app {namespace}/{name} {type_}=True ({reason})"),
        TIMEOUT,
        || async {
            let app = apps.get(name).await.map_err(why)?;
            let status = app.status.clone().unwrap_or_default();
            let current = status.observed_generation == app.metadata.generation;
            let hit = status
                .conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == "True" && c.reason == reason);
            if hit && current {
                Ok(app)
            } else {
                Err(format!("{status:?}"))
            }
        },
    )
    .await
}

/// Waits until app `namespace/name` is `Ready` (reason `Available`).
pub async fn wait_ready(client: &kube::Client, namespace: &str, name: &str) -> TenantApp {
    wait_condition(client, namespace, name, "Ready", "Available").await
}
