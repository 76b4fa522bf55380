//! A key of ours removed from a map another manager shares (it added a key of its own) is
//! restored and named every time, in this process and by a new applier (after a restart):
//! a ConfigMap's `data` and a Secret's from `stringData`, with one key of ours or two, created
//! or applied to since. With one key, the removal leaves our entry holding the map alone
//! (`f:data: {}`), which is not ownership of the whole map.

use idem_runtime::TenantKey;
use idem_runtime::apply::{Applier, DesiredChildren, Owner};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::common::*;

fn secret(keys: serde_json::Value) -> DesiredChildren {
    let child: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds"}, "type": "Opaque",
        "stringData": keys}))
    .unwrap();
    let mut d = DesiredChildren::new();
    d.add(&child).expect("add");
    d
}

async fn go(kind: &str, keys: serde_json::Value, change: bool) {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let client = client();
    ensure_crd(&client).await;
    let ns = namespace(&client, "silent").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(TenantKey::new(&ns))).expect("owner");
    let mk = |keys: serde_json::Value| {
        if kind == "Secret" {
            secret(keys)
        } else {
            let child: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "creds"},
            "data": keys}))
            .unwrap();
            let mut d = DesiredChildren::new();
            d.add(&child).expect("add");
            d
        }
    };
    let desired = mk(keys.clone());
    let get = || {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            if kind == "Secret" {
                serde_json::to_value(
                    Api::<Secret>::namespaced(client, &ns)
                        .get("creds")
                        .await
                        .unwrap(),
                )
                .unwrap()
            } else {
                serde_json::to_value(
                    Api::<ConfigMap>::namespaced(client, &ns)
                        .get("creds")
                        .await
                        .unwrap(),
                )
                .unwrap()
            }
        }
    };
    let patch = |p: Patch<serde_json::Value>| {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            let pp = PatchParams {
                field_manager: Some("kubectl-patch".into()),
                ..PatchParams::default()
            };
            if kind == "Secret" {
                Api::<Secret>::namespaced(client, &ns)
                    .patch("creds", &pp, &p)
                    .await
                    .unwrap();
            } else {
                Api::<ConfigMap>::namespaced(client, &ns)
                    .patch("creds", &pp, &p)
                    .await
                    .unwrap();
            }
        }
    };
    let applier = Applier::new(client.clone());
    applier.reconcile(&owner, &desired).await.expect("create");
    if change {
        let mut other = keys.clone();
        other["accessKey"] = json!("OTHER");
        applier.reconcile(&owner, &mk(other)).await.expect("change");
        applier
            .reconcile(&owner, &desired)
            .await
            .expect("change back");
    }
    patch(Patch::Merge(json!({"data": {"extra": "eA=="}}))).await;
    let r = applier.reconcile(&owner, &desired).await.expect("pass");
    assert!(
        r.repaired.is_empty(),
        "another manager's key is not drift: {r:?}"
    );
    let mut paths_all = vec![];
    // Three removals repaired by the same applier, a fourth by a new one.
    for round in 1..=4 {
        let fresh = round == 4;
        patch(Patch::Json::<serde_json::Value>(
            serde_json::from_value(json!([{"op": "remove", "path": "/data/accessKey"}])).unwrap(),
        ))
        .await;
        let r = if fresh {
            Applier::new(client.clone())
        } else {
            applier.clone()
        }
        .reconcile(&owner, &desired)
        .await
        .expect("repair");
        let paths: Vec<String> = r
            .repaired
            .iter()
            .flat_map(|r| r.drift.iter().map(|d| d.path.clone()))
            .collect();
        let live = get().await;
        assert!(
            live["data"]["accessKey"].is_string(),
            "round {round} not restored"
        );
        paths_all.push(paths);
    }
    for p in &paths_all {
        assert_eq!(
            p,
            &vec![".data.accessKey".to_string()],
            "{kind} {paths_all:?}"
        );
    }
}

#[tokio::test]
async fn secret_one_key_created() {
    go("Secret", json!({"accessKey": "AKIA"}), false).await;
}

#[tokio::test]
async fn secret_one_key_applied_since() {
    go("Secret", json!({"accessKey": "AKIA"}), true).await;
}

#[tokio::test]
async fn secret_two_keys_created() {
    go(
        "Secret",
        json!({"accessKey": "AKIA", "secretKey": "s3cr3t"}),
        false,
    )
    .await;
}

#[tokio::test]
async fn secret_two_keys_applied_since() {
    go(
        "Secret",
        json!({"accessKey": "AKIA", "secretKey": "s3cr3t"}),
        true,
    )
    .await;
}

#[tokio::test]
async fn configmap_one_key_created() {
    go("ConfigMap", json!({"accessKey": "AKIA"}), false).await;
}

#[tokio::test]
async fn configmap_one_key_applied_since() {
    go("ConfigMap", json!({"accessKey": "AKIA"}), true).await;
}

#[tokio::test]
async fn configmap_two_keys_created() {
    go(
        "ConfigMap",
        json!({"accessKey": "AKIA", "secretKey": "s3cr3t"}),
        false,
    )
    .await;
}

#[tokio::test]
async fn configmap_two_keys_applied_since() {
    go(
        "ConfigMap",
        json!({"accessKey": "AKIA", "secretKey": "s3cr3t"}),
        true,
    )
    .await;
}
