//! The local control plane is a real Kubernetes: the verb-idempotence table of the design,
//! garbage collection, namespace deletion, scheduling onto kwok nodes, CRDs with a status
//! subresource, and write counts read from the API server's own `/metrics`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use idem_tests::{metrics, shared};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A fresh namespace for one test.
async fn namespace(client: &Client, prefix: &str) -> String {
    idem_tests::create_namespace(client, prefix).await.unwrap()
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn status_code(err: kube::Error) -> u16 {
    match err {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API status error, got {other:?}"),
    }
}

/// Polls `check` every 200 ms until it is true or [`TIMEOUT`] passes.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn server_side_apply_twice_leaves_resource_version_unchanged() {
    let client = shared().client();
    let ns = namespace(&client, "ssa").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    let pp = PatchParams::apply("idem-test").force();
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
    let first = api.patch("c", &pp, &Patch::Apply(&cm)).await.unwrap();
    let second = api.patch("c", &pp, &Patch::Apply(&cm)).await.unwrap();
    assert_eq!(first.resource_version(), second.resource_version());
    // A real change does move it: the check above can fail.
    let changed = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "2"}});
    let third = api.patch("c", &pp, &Patch::Apply(&changed)).await.unwrap();
    assert_ne!(second.resource_version(), third.resource_version());
}

#[tokio::test]
async fn post_put_delete_and_optimistic_concurrency_behave_as_the_table_says() {
    let client = shared().client();
    let ns = namespace(&client, "verbs").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    let pp = PostParams::default();
    let created = api
        .create(&pp, &config_map("c", &[("a", "1")]))
        .await
        .unwrap();

    // POST is not idempotent: 409 AlreadyExists.
    let err = api
        .create(&pp, &config_map("c", &[("a", "1")]))
        .await
        .unwrap_err();
    assert_eq!(status_code(err), 409);

    // PUT with the current resourceVersion works; replaying the same body with the now stale
    // resourceVersion is a 409 Conflict (optimistic concurrency).
    let mut update = created.clone();
    update.data = Some(BTreeMap::from([("a".into(), "2".into())]));
    let updated = api.replace("c", &pp, &update).await.unwrap();
    let err = api.replace("c", &pp, &update).await.unwrap_err();
    assert_eq!(status_code(err), 409);

    // PUT without a resourceVersion is idempotent: twice gives the same object.
    let mut unconditional = updated.clone();
    unconditional.metadata.resource_version = None;
    let once = api.replace("c", &pp, &unconditional).await.unwrap();
    let twice = api.replace("c", &pp, &unconditional).await.unwrap();
    assert_eq!(once.data, twice.data);
    assert_eq!(once.resource_version(), twice.resource_version());

    // DELETE of a missing object is 404: already done.
    api.delete("c", &DeleteParams::default()).await.unwrap();
    let err = api.delete("c", &DeleteParams::default()).await.unwrap_err();
    assert_eq!(status_code(err), 404);
}

#[tokio::test]
async fn strategic_merge_is_idempotent_but_json_patch_add_is_not() {
    let client = shared().client();
    let ns = namespace(&client, "patch").await;
    let api: Api<Deployment> = Api::namespaced(client, &ns);
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "d"}},
            "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {"containers": [{"name": "main", "image": "example/app:1"}]},
            },
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &deploy).await.unwrap();
    let container_env = |d: &Deployment| {
        d.spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .env
            .clone()
            .unwrap_or_default()
            .len()
    };

    // Strategic merge keys containers by name and env by name: applying twice is one entry.
    let smp = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "main", "env": [{"name": "A", "value": "1"}]}
    ]}}}});
    let pp = PatchParams::default();
    api.patch("d", &pp, &Patch::Strategic(&smp)).await.unwrap();
    let after = api.patch("d", &pp, &Patch::Strategic(&smp)).await.unwrap();
    assert_eq!(container_env(&after), 1);

    // A JSON patch `add` to the end of a list appends each time: two entries.
    let add: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {"name": "B", "value": "2"}}
    ]))
    .unwrap();
    api.patch("d", &pp, &Patch::<()>::Json(add.clone()))
        .await
        .unwrap();
    let after = api.patch("d", &pp, &Patch::<()>::Json(add)).await.unwrap();
    assert_eq!(container_env(&after), 3, "A once, B twice");
}

#[tokio::test]
async fn garbage_collector_deletes_owned_objects_and_namespaces_finish_deleting() {
    let client = shared().client();
    let ns = namespace(&client, "gc").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let owner = api
        .create(&PostParams::default(), &config_map("owner", &[]))
        .await
        .unwrap();
    let mut child = config_map("child", &[]);
    child.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "owner".into(),
            uid: owner.uid().unwrap(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
    ]);
    api.create(&PostParams::default(), &child).await.unwrap();
    api.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    eventually("the garbage collector to delete the child", || async {
        api.get_opt("child").await.unwrap().is_none()
    })
    .await;

    let namespaces: Api<Namespace> = Api::all(client);
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the namespace to finish deleting", || async {
        namespaces.get_opt(&ns).await.unwrap().is_none()
    })
    .await;
}

#[tokio::test]
async fn a_deployment_of_three_replicas_becomes_available_on_kwok_nodes() {
    let client = shared().client();
    let ns = namespace(&client, "deploy").await;
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "example/web:1"}]},
            },
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &deploy).await.unwrap();
    eventually("3 available replicas", || async {
        let d = api.get("web").await.unwrap();
        d.status.and_then(|s| s.available_replicas) == Some(3)
    })
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, &ns);
    let list = pods.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 3);
    for pod in list.items {
        let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        assert!(node.starts_with("kwok-node-"), "scheduled onto {node:?}");
    }
}

/// A custom resource defined in Rust, to prove CRDs from kube's derive work end to end.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "harness.idem.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
pub struct WidgetSpec {
    /// Desired size.
    pub size: i32,
}

/// Widget's status.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct WidgetStatus {
    /// Last size seen.
    pub seen: i32,
}

async fn install_widget_crd(client: &Client) {
    idem_tests::install_crd(client, &Widget::crd())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_crd_from_a_rust_type_is_established_and_its_status_round_trips() {
    let client = shared().client();
    install_widget_crd(&client).await;
    let ns = namespace(&client, "crd").await;
    let api: Api<Widget> = Api::namespaced(client, &ns);
    let w = api
        .create(
            &PostParams::default(),
            &Widget::new("w", WidgetSpec { size: 3 }),
        )
        .await
        .unwrap();
    assert_eq!(w.metadata.generation, Some(1));
    let status = json!({"status": {"seen": 3}});
    api.patch_status("w", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let back = api.get("w").await.unwrap();
    assert_eq!(back.status.map(|s| s.seen), Some(3));
    // The status subresource does not bump the generation; the spec does.
    assert_eq!(back.metadata.generation, Some(1));
}

#[tokio::test]
async fn write_counts_in_metrics_change_by_exactly_the_writes_made() {
    let cp = shared();
    let client = cp.client();
    install_widget_crd(&client).await;
    let ns = namespace(&client, "count").await;
    let api: Api<Widget> = Api::namespaced(client, &ns);
    let resource = "widgets";
    let group = "harness.idem.dev";
    // Other tests in this binary also write widgets; this one is alone on its own name
    // prefix but the metric is per resource, so compare deltas around a quiet window by
    // retrying until no foreign write lands inside it.
    for attempt in 0..5 {
        let before = cp.metrics().await.unwrap();
        let pp = PostParams::default();
        let name = format!("m{attempt}");
        api.create(&pp, &Widget::new(&name, WidgetSpec { size: 1 }))
            .await
            .unwrap(); // POST
        let ssa = PatchParams::apply("idem-test").force();
        let body =
            json!({"apiVersion": "harness.idem.dev/v1", "kind": "Widget", "spec": {"size": 2}});
        api.patch(&name, &ssa, &Patch::Apply(&body)).await.unwrap(); // APPLY
        api.patch(&name, &ssa, &Patch::Apply(&body)).await.unwrap(); // APPLY (no-op, still a request)
        let _ = api.get(&name).await.unwrap(); // a read: not counted
        api.delete(&name, &DeleteParams::default()).await.unwrap(); // DELETE
        let after = cp.metrics().await.unwrap();
        let delta = |verb: &str| {
            metrics::requests(&after, verb, group, resource)
                - metrics::requests(&before, verb, group, resource)
        };
        let writes =
            metrics::writes(&after, group, resource) - metrics::writes(&before, group, resource);
        // The other tests here create (POST), read (GET), write the status (PATCH) of widgets
        // and delete a namespace (DELETECOLLECTION of its widgets); this one sends no PATCH,
        // PUT or DELETECOLLECTION. Any of theirs in the window: measure again.
        let foreign = delta("POST") != 1
            || delta("GET") != 1
            || ["PATCH", "PUT", "DELETECOLLECTION"]
                .iter()
                .any(|verb| delta(verb) != 0);
        if !foreign {
            assert_eq!(
                (delta("APPLY"), delta("DELETE")),
                (2, 1),
                "APPLY is counted per apply, even a no-op; DELETE once"
            );
            assert_eq!(writes, 4, "POST + 2×APPLY + DELETE");
            return;
        }
    }
    panic!("another writer kept touching widgets; could not measure a quiet window");
}
