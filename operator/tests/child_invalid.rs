//! A TenantApp admitted by an older CRD (one without today's rule against config keys `.` and
//! `..x`: an upgrade keeps what it admitted) whose ConfigMap the API server refuses with 422:
//! the app is `Stalled` with reason `ChildInvalid` and the server's message at once, the
//! operator does not retry it while the spec stays, and it converges once the spec changes.
//! A Deployment another writer made invalid beside our fields is recreated as desired.

mod common;

use std::time::Duration;

use common::{Operator, TIMEOUT, apps, eventually, install_crds, tenants, why};
use idem_operator::resources::{self, TenantApp};
use idem_operator::tenant_app::desired::config_map_name;
use idem_tests::shared;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// One test at a time: one installs an older TenantApp CRD, and each runs an operator.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The config key rule of an older TenantApp CRD: ConfigMap key characters only.
const OLD_CONFIG_RULE: &str = r"self.all(k, size(k) <= 253 && k.matches(r'^[-._a-zA-Z0-9]+$'))";

/// Installs the CRDs, then the TenantApp CRD with [`OLD_CONFIG_RULE`] instead of today's.
async fn install_older_tenant_app_crd(client: &kube::Client) {
    install_crds(client).await;
    let crd = resources::crds()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some("tenantapps.tenancy.idem.dev"))
        .unwrap();
    let mut crd = serde_json::to_value(crd).unwrap();
    let rules = crd
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/config/x-kubernetes-validations")
        .and_then(Value::as_array_mut)
        .expect("config has CEL rules");
    rules[0]["rule"] = json!(OLD_CONFIG_RULE);
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(
            "tenantapps.tenancy.idem.dev",
            &PatchParams::apply("idem-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
}

/// The sum of the samples of counter `name` for `controller` in an operator's `/metrics`.
fn counter(metrics: &str, name: &str, controller: &str) -> u64 {
    let label = format!("controller=\"{controller}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

#[tokio::test]
async fn a_child_the_api_server_refuses_stalls_the_app_until_its_spec_changes() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_older_tenant_app_crd(&client).await;
    let operator = Operator::start(Duration::from_secs(600)).await;
    let ns = tenants::ready_apps_namespace(&client, "inv").await;
    let apps_api: Api<TenantApp> = Api::namespaced(client.clone(), &ns);
    let mut spec = apps::spec(0, "x");
    spec.config.insert("..".into(), "x".into());
    // The older CRD takes effect once the API server has loaded it.
    eventually("the older CRD admitting config key '..'", TIMEOUT, || {
        let (apps_api, spec) = (&apps_api, &spec);
        async move {
            apps_api
                .create(&PostParams::default(), &TenantApp::new("web", spec.clone()))
                .await
                .map(|_| ())
                .map_err(why)
        }
    })
    .await;

    let app = apps::wait_condition(&client, &ns, "web", "Stalled", "ChildInvalid").await;
    let stalled = app
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Stalled"))
        .unwrap();
    let message = &stalled.message;
    assert!(
        message.contains(&format!("ConfigMap/{ns}/{}", config_map_name("web")))
            && message.contains("422 Invalid")
            && message.contains("'..'"),
        "the child and the server's reason: {message}"
    );
    assert!(!message.contains('\n'), "one line: {message:?}");

    // Another app converging meanwhile: the operator is working, and it does not retry `web`.
    apps::create(&client, &ns, "ok", apps::spec(0, "y")).await;
    apps::wait_ready(&client, &ns, "ok").await;
    // A reconcile is counted after it returns, and its two counters one after the other:
    // read until they agree.
    let (terminal, errors) = eventually("the terminal errors counted", TIMEOUT, || async {
        let metrics = operator.metrics().await;
        let terminal = counter(
            &metrics,
            "controller_runtime_terminal_reconcile_errors_total",
            "tenantapp",
        );
        let errors = counter(
            &metrics,
            "controller_runtime_reconcile_errors_total",
            "tenantapp",
        );
        match (terminal, errors) {
            (t, e) if t >= 1 && e == t => Ok((t, e)),
            (t, e) => Err(format!("{t} terminal errors, {e} errors")),
        }
    })
    .await;
    // The first pass, and at most a couple more for its other children's events.
    assert!((1..=3).contains(&terminal), "{terminal} terminal errors");
    assert_eq!(errors, terminal, "no error retried with backoff");
    let again = apps_api.get("web").await.unwrap();
    assert_eq!(again.status, app.status, "still stalled, status unchanged");

    // The owner fixes the spec: the app converges.
    apps_api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"config": {"..": null}}})),
        )
        .await
        .unwrap();
    apps::wait_ready(&client, &ns, "web").await;
    let config = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get(&config_map_name("web"))
        .await
        .unwrap();
    assert_eq!(
        config.data.unwrap_or_default().keys().collect::<Vec<_>>(),
        ["app.toml"]
    );
    operator.stop().await;
}

#[tokio::test]
async fn a_deployment_another_writer_made_invalid_beside_our_fields_is_recreated_as_desired() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let operator = Operator::start(Duration::from_secs(600)).await;
    let ns = tenants::ready_apps_namespace(&client, "priv").await;
    apps::create(&client, &ns, "web", apps::spec(0, "x")).await;
    apps::wait_ready(&client, &ns, "web").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let before = deployments.get("web").await.unwrap();
    // Another writer: privileged, and replicas changed (ours to repair). Valid as they wrote
    // it (their escalation setting); our apply of `allowPrivilegeEscalation: false` beside
    // their `privileged: true` is not.
    let theirs = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "app",
            "securityContext": {"privileged": true, "allowPrivilegeEscalation": true}}]}}}
    });
    deployments
        .patch(
            "web",
            &PatchParams::apply("intruder").force(),
            &Patch::Apply(&theirs),
        )
        .await
        .unwrap();
    eventually("the Deployment recreated as desired", TIMEOUT, || async {
        let now = deployments.get("web").await.map_err(why)?;
        let privileged = now
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|p| p.containers[0].security_context.as_ref())
            .and_then(|c| c.privileged);
        let replicas = now.spec.as_ref().and_then(|s| s.replicas);
        (now.metadata.uid != before.metadata.uid && privileged.is_none() && replicas == Some(0))
            .then_some(())
            .ok_or(format!(
                "uid {:?}, privileged {privileged:?}, replicas {replicas:?}",
                now.metadata.uid
            ))
    })
    .await;
    apps::wait_ready(&client, &ns, "web").await;
    operator.stop().await;
}
