//! Waiting for a starting control plane: the API server's `/readyz`, then the `default`
//! namespace and ServiceAccount (the controller-manager works) and Ready kwok nodes.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use kube::api::{Api, PostParams};

use crate::controlplane::KWOK_NODE_ANNOTATION;
use crate::error::{Error, Result};
use crate::process::Process;

/// How long the API server may take to answer `/readyz` with `ok` (seen: ~3 s).
pub const APISERVER_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the rest (default ServiceAccount, Ready nodes) may take after that (seen: ~3 s).
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(200);

/// GETs a non-resource path (e.g. `/readyz`, `/metrics`) and returns the body.
pub(crate) async fn get_text(client: &kube::Client, path: &str) -> Result<String> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Ok(client.request_text(req).await?)
}

/// An error if any process has exited.
fn check_alive(procs: &mut [Process]) -> Result<()> {
    for p in procs.iter_mut() {
        if let Some(status) = p.exited() {
            return Err(p.not_ready(format!("it exited with {status}")));
        }
    }
    Ok(())
}

fn timed_out(procs: &[Process], name: &str, what: &str, timeout: Duration) -> Error {
    match procs.iter().find(|p| p.name() == name) {
        Some(p) => p.not_ready(format!("{what} after {} s", timeout.as_secs())),
        None => Error::Kubeconfig(format!("{name} is not running")),
    }
}

/// Waits until `/readyz` says `ok`.
pub(crate) async fn apiserver(config: &kube::Config, procs: &mut [Process]) -> Result<()> {
    let client = kube::Client::try_from(config.clone())?;
    let deadline = tokio::time::Instant::now() + APISERVER_TIMEOUT;
    loop {
        check_alive(procs)?;
        if get_text(&client, "/readyz")
            .await
            .is_ok_and(|body| body.trim() == "ok")
        {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(timed_out(
                procs,
                "kube-apiserver",
                "/readyz not ok",
                APISERVER_TIMEOUT,
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Registers `nodes` kwok nodes and waits for them to be Ready and for the `default`
/// namespace and its `default` ServiceAccount.
pub(crate) async fn cluster(
    config: &kube::Config,
    nodes: u32,
    procs: &mut [Process],
) -> Result<()> {
    let client = kube::Client::try_from(config.clone())?;
    let node_api: Api<Node> = Api::all(client.clone());
    for i in 0..nodes {
        let node = fake_node(&format!("kwok-node-{i}"));
        match node_api.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let deadline = tokio::time::Instant::now() + CLUSTER_TIMEOUT;
    let ns: Api<Namespace> = Api::all(client.clone());
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    loop {
        check_alive(procs)?;
        let has_default = ns.get_opt("default").await.ok().flatten().is_some();
        let has_sa = sa.get_opt("default").await.ok().flatten().is_some();
        let ready = match node_api.list(&Default::default()).await {
            Ok(list) => list.items.iter().filter(|n| is_ready(n)).count() as u32,
            Err(_) => 0,
        };
        if has_default && has_sa && ready >= nodes {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            let (name, what) = if ready < nodes {
                ("kwok", format!("{ready} of {nodes} nodes Ready"))
            } else {
                (
                    "kube-controller-manager",
                    "no default ServiceAccount".to_string(),
                )
            };
            return Err(timed_out(procs, name, &what, CLUSTER_TIMEOUT));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether a Node has condition `Ready=True`.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A Node that kwok manages (annotation `kwok.x-k8s.io/node: fake`), with room for 110 pods.
/// No taint: workloads schedule onto it without tolerations.
fn fake_node(name: &str) -> Node {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": { KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0" },
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "status": {
            "allocatable": { "cpu": "32", "memory": "256Gi", "pods": "110" },
            "capacity": { "cpu": "32", "memory": "256Gi", "pods": "110" },
        },
    }))
    .expect("a valid Node")
}
