//! `Options` of a control plane change what really starts: the service range the API server
//! allocates from, the number of kwok nodes, and the feature gates it is given.

use idem_tests::{ControlPlane, Error, LARGE_SERVICE_CIDR, Options};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, PostParams};

/// A Service asking for `cluster_ip`, which lies outside the default /24.
fn service(name: &str, cluster_ip: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": { "clusterIP": cluster_ip, "ports": [{ "port": 80 }] },
    }))
    .unwrap()
}

const OUTSIDE_SLASH_24: &str = "10.0.200.10";

#[tokio::test(flavor = "multi_thread")]
async fn a_large_service_range_and_more_nodes_are_what_the_cluster_gets() {
    let root = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(Options {
        run_root: root.path().to_path_buf(),
        service_cidr: LARGE_SERVICE_CIDR.into(),
        nodes: 3,
        ..Options::default()
    })
    .unwrap();
    let client = cp.client();
    let nodes = Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(nodes.items.len(), 3);
    let svc = Api::<Service>::namespaced(client, "default")
        .create(&PostParams::default(), &service("wide", OUTSIDE_SLASH_24))
        .await
        .expect("10.0.200.10 is inside 10.0.0.0/16");
    let ip = svc.spec.and_then(|s| s.cluster_ip);
    assert_eq!(ip.as_deref(), Some(OUTSIDE_SLASH_24));
    drop(cp);

    // The default /24 refuses the same address.
    let cp = idem_tests::shared();
    let err = Api::<Service>::namespaced(cp.client(), "default")
        .create(&PostParams::default(), &service("narrow", OUTSIDE_SLASH_24))
        .await
        .expect_err("10.0.200.10 is outside 10.0.0.0/24");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422),
        "{err}"
    );
}

#[test]
fn feature_gates_reach_the_api_server() {
    let root = tempfile::tempdir().unwrap();
    let err = ControlPlane::start_with(Options {
        run_root: root.path().to_path_buf(),
        feature_gates: vec!["NoSuchGateOfIdem=true".into()],
        ..Options::default()
    })
    .expect_err("the API server refuses an unknown feature gate");
    match err {
        Error::NotReady {
            component, tail, ..
        } => {
            assert_eq!(component, "kube-apiserver");
            assert!(tail.contains("NoSuchGateOfIdem"), "{tail}");
        }
        other => panic!("expected the API server to fail: {other}"),
    }
}
