//! Every manifest in `examples/` is a valid Tenant or TenantApp: it deserialises into the
//! operator's types without losing a field, and the real API server accepts it with strict
//! field validation (server-side apply, dry run).

mod common;

use std::path::PathBuf;

use idem_operator::resources::{Tenant, TenantApp};
use idem_tests::shared;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams, ValidationDirective};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use serde_json::Value;

/// The example manifests (`examples/*.yaml`, the tenants, and `examples/apps/*.yaml`), sorted
/// by path, with their parsed YAML.
fn examples() -> Vec<(PathBuf, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<PathBuf> = [dir.clone(), dir.join("apps")]
        .iter()
        .flat_map(|dir| {
            std::fs::read_dir(dir)
                .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
                .map(|entry| entry.unwrap().path())
        })
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let value: Value = serde_saphyr::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
            (path, value)
        })
        .collect()
}

/// Whether every field of `written` is in `typed` with the same value (numbers and strings
/// compared as written); the typed round trip may add defaults but may not drop anything.
fn subset(written: &Value, typed: &Value, at: &str) -> Result<(), String> {
    match (written, typed) {
        (Value::Object(w), Value::Object(t)) => w.iter().try_for_each(|(k, v)| match t.get(k) {
            Some(tv) => subset(v, tv, &format!("{at}.{k}")),
            None => Err(format!("{at}.{k} is not a field of the type (dropped)")),
        }),
        (Value::Array(w), Value::Array(t)) if w.len() == t.len() => w
            .iter()
            .zip(t)
            .enumerate()
            .try_for_each(|(i, (w, t))| subset(w, t, &format!("{at}[{i}]"))),
        (w, t) if w == t => Ok(()),
        (w, t) => Err(format!("{at}: written {w}, read back {t}")),
    }
}

/// Deserialises `value` as `K` and checks the round trip keeps every written field.
fn round_trip<K: serde::de::DeserializeOwned + serde::Serialize>(
    value: &Value,
) -> Result<K, String> {
    let typed: K = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    subset(value, &serde_json::to_value(&typed).unwrap(), "")?;
    Ok(typed)
}

#[test]
fn every_example_deserialises_into_the_operators_types_without_losing_a_field() {
    let examples = examples();
    let mut tenants = Vec::new();
    let mut apps = Vec::new();
    for (path, value) in &examples {
        let file = path.display();
        match value["kind"].as_str() {
            Some("Tenant") => {
                tenants.push(round_trip::<Tenant>(value).unwrap_or_else(|e| panic!("{file}: {e}")))
            }
            Some("TenantApp") => {
                apps.push(round_trip::<TenantApp>(value).unwrap_or_else(|e| panic!("{file}: {e}")))
            }
            other => panic!("{file}: kind {other:?} is neither Tenant nor TenantApp"),
        }
        assert_eq!(value["apiVersion"], "tenancy.idem.dev/v1alpha1", "{file}");
    }
    assert!(tenants.len() >= 3, "at least three example tenants");
    assert!(!apps.is_empty(), "at least one example TenantApp");
    // Each app lives in a namespace of an example tenant.
    for app in &apps {
        let ns = app.metadata.namespace.clone().expect("an app's namespace");
        let home = tenants.iter().find(|t| {
            t.spec
                .namespaces
                .iter()
                .any(|short| t.namespace_name(short) == ns)
        });
        assert!(
            home.is_some(),
            "app {:?}: {ns} is no example tenant's namespace",
            app.metadata.name
        );
    }
}

#[test]
fn the_subset_check_catches_a_misspelled_field() {
    let value: Value = serde_saphyr::from_str(
        "apiVersion: tenancy.idem.dev/v1alpha1\nkind: Tenant\nmetadata: {name: t}\nspec:\n  namespaces: [dev]\n  isolaton: true\n",
    )
    .unwrap();
    let error = round_trip::<Tenant>(&value).unwrap_err();
    assert!(error.contains(".spec.isolaton"), "{error}");
}

#[tokio::test]
async fn the_api_server_accepts_every_example_with_strict_field_validation() {
    let client = shared().client();
    common::install_crds(&client).await;
    for (path, value) in examples() {
        let kind = value["kind"].as_str().unwrap().to_string();
        let name = value["metadata"]["name"].as_str().unwrap().to_string();
        let gvk = GroupVersionKind::gvk("tenancy.idem.dev", "v1alpha1", &kind);
        let resource =
            ApiResource::from_gvk_with_plural(&gvk, &format!("{}s", kind.to_lowercase()));
        let api: Api<DynamicObject> = match value["metadata"]["namespace"].as_str() {
            Some(ns) => {
                let namespaces: Api<k8s_openapi::api::core::v1::Namespace> =
                    Api::all(client.clone());
                if namespaces.get_opt(ns).await.unwrap().is_none() {
                    let obj = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))
                        .unwrap();
                    namespaces
                        .create(&PostParams::default(), &obj)
                        .await
                        .unwrap();
                }
                Api::namespaced_with(client.clone(), ns, &resource)
            }
            None => Api::all_with(client.clone(), &resource),
        };
        let mut params =
            PatchParams::apply("idem-examples").validation(ValidationDirective::Strict);
        params.dry_run = true;
        api.patch(&name, &params, &Patch::Apply(&value))
            .await
            .unwrap_or_else(|e| panic!("{}: rejected: {e}", path.display()));
    }
}
