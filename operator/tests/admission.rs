//! The CRDs' schemas and CEL rules reject bad input at admission, on the real API server.

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use idem_operator::resources;
use idem_tests::{shared, unique_name};

async fn install(client: &kube::Client) {
    for crd in resources::crds() {
        idem_tests::install_crd(client, &crd).await.unwrap();
    }
}

fn api(client: &kube::Client, kind: &str, namespace: Option<&str>) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(resources::GROUP, "v1alpha1", kind);
    let plural = format!("{}s", kind.to_lowercase());
    let ar = ApiResource::from_gvk_with_plural(&gvk, &plural);
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Creates the object and returns the API server's rejection message, or `None` if accepted.
async fn try_create(api: &Api<DynamicObject>, obj: Value) -> Option<String> {
    let obj: DynamicObject = serde_json::from_value(obj).unwrap();
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "rejections are 422 Invalid: {s:?}");
            Some(s.message)
        }
        Err(e) => panic!("unexpected error {e}"),
    }
}

fn tenant(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": name}, "spec": spec})
}

#[tokio::test]
async fn tenant_admission_accepts_good_input_and_rejects_bad_input_with_a_reason() {
    let client = shared().client();
    install(&client).await;
    let tenants = api(&client, "Tenant", None);

    let good = tenant(
        &unique_name("good"),
        json!({"owners": [{"kind": "User", "name": "alice"}, {"kind": "ServiceAccount", "name": "ci", "namespace": "tools"}],
               "namespaces": ["dev", "prod"], "quota": {"hard": {"cpu": "4", "memory": "8Gi"}}, "weight": 5}),
    );
    assert_eq!(try_create(&tenants, good).await, None);

    let cases = [
        (
            "bad-short-name",
            json!({"namespaces": ["Dev_1"]}),
            "namespaces",
        ),
        (
            "dup-namespace",
            json!({"namespaces": ["dev", "dev"]}),
            "Duplicate value",
        ),
        ("weight-zero", json!({"weight": 0}), "weight"),
        ("weight-too-big", json!({"weight": 101}), "weight"),
        (
            "sa-without-ns",
            json!({"owners": [{"kind": "ServiceAccount", "name": "ci"}]}),
            "needs a namespace",
        ),
        (
            "bad-owner-kind",
            json!({"owners": [{"kind": "Robot", "name": "r2"}]}),
            "kind",
        ),
        (
            "long-short-name",
            json!({"namespaces": ["a".repeat(33)]}),
            "namespaces",
        ),
        (
            "bad-quota",
            json!({"quota": {"hard": {"cpu": "lots"}}}),
            "must be a quantity",
        ),
    ];
    for (prefix, spec, expect) in cases {
        let message = try_create(&tenants, tenant(&unique_name(prefix), spec))
            .await
            .unwrap_or_else(|| panic!("{prefix}: accepted"));
        assert!(message.contains(expect), "{prefix}: {message}");
    }
    let dotted = format!("{}.x", unique_name("dot"));
    let message = try_create(&tenants, tenant(&dotted, json!({})))
        .await
        .expect("dotted name accepted");
    assert!(message.contains("must be a DNS label"), "{message}");
    let long = "t".repeat(31);
    let message = try_create(&tenants, tenant(&long, json!({})))
        .await
        .expect("long name accepted");
    assert!(message.contains("at most 30 characters"), "{message}");
}

#[tokio::test]
async fn tenant_app_admission_rejects_negative_replicas_and_bad_ports() {
    let client = shared().client();
    install(&client).await;
    let ns = unique_name("apps");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let apps = api(&client, "TenantApp", Some(&ns));
    let app = |name: &str, spec: Value| json!({"apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "TenantApp", "metadata": {"name": name}, "spec": spec});
    assert_eq!(
        try_create(&apps, app("ok", json!({"image": "nginx:1.27"}))).await,
        None
    );
    for (name, spec, expect) in [
        ("neg", json!({"image": "x", "replicas": -1}), "replicas"),
        ("port", json!({"image": "x", "port": 70000}), "port"),
        ("noimage", json!({"replicas": 1}), "image"),
        (
            "badkey",
            json!({"image": "x", "config": {"bad/key": "v"}}),
            "config keys",
        ),
    ] {
        let message = try_create(&apps, app(name, spec))
            .await
            .unwrap_or_else(|| panic!("{name}: accepted"));
        assert!(message.contains(expect), "{name}: {message}");
    }
}
