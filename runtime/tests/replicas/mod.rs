//! What the tests that run replicas of the example's manager share: polling for a condition,
//! its HTTP endpoints, and whether its BaseTenants converged. Included by those tests as
//! `mod replicas;` beside `mod base_tenant;`.

use std::net::SocketAddr;

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::{Api, Client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::base_tenant::{BaseTenant, BaseTenantSpec};
use idem_runtime::shard::{Ring, ShardField, shard_hash};
use idem_tests::unique_name;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};

/// Polls a condition until it holds (the harness's own).
pub use idem_tests::eventually;

/// `GET path` on `addr`: status code and body.
pub async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut stream = (tokio::net::TcpStream::connect(addr).await).map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    (stream.write_all(request.as_bytes()).await).map_err(|e| e.to_string())?;
    let mut reply = String::new();
    (stream.read_to_string(&mut reply).await).map_err(|e| e.to_string())?;
    let (head, body) = reply.split_once("\r\n\r\n").ok_or("not HTTP")?;
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok());
    Ok((code.ok_or("no status")?, body.to_string()))
}

/// The value of gauge `name` in a `/metrics` text.
pub fn gauge(metrics: &str, name: &str) -> Option<i64> {
    (metrics.lines())
        .find(|l| l.split([' ', '{']).next() == Some(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Whether every BaseTenant in `names` is Ready at its generation with quota `cpu`.
pub async fn all_ready(client: &Client, names: &[String], cpu: &str) -> Result<(), String> {
    let tenants = Api::<BaseTenant>::all(client.clone());
    for name in names {
        let t = tenants.get(name).await.map_err(|e| e.to_string())?;
        let status = t.status.clone().unwrap_or_default();
        let ready = (status.conditions.iter()).any(|c| c.type_ == "Ready" && c.status == "True");
        if !ready || status.observed_generation != t.metadata.generation {
            return Err(format!("{name}: {status:?}"));
        }
        let quota = Api::<ResourceQuota>::namespaced(client.clone(), name);
        let quota = quota.get("quota").await.map_err(|e| e.to_string())?;
        let hard = quota.spec.and_then(|s| s.hard).unwrap_or_default();
        if hard.get("requests.cpu").map(|q| q.0.as_str()) != Some(cpu) {
            return Err(format!("{name}: quota {hard:?}"));
        }
    }
    Ok(())
}

/// Sets every BaseTenant in `names` to quota `cpu` and waits until each is Ready with it.
pub async fn change_cpu(client: &Client, names: &[String], cpu: &str) {
    let tenants = Api::<BaseTenant>::all(client.clone());
    let change = serde_json::json!({"spec": {"cpu": cpu}});
    for name in names {
        (tenants
            .patch(name, &PatchParams::default(), &Patch::Merge(&change))
            .await)
            .unwrap();
    }
    eventually("every BaseTenant Ready after the change", || {
        all_ready(client, names, cpu)
    })
    .await;
}

/// Creates BaseTenants (cpu 1) until there are at least `at_least` and each of `members` owns
/// one by the ring's hash of its uid, which the server chooses (6 uids all in one of two
/// replicas' buckets happen once in 32 runs); their names.
///
/// # Panics
/// When a create fails, or 64 uids leave a member without one.
pub async fn create_shared(client: &Client, at_least: usize, members: &[&str]) -> Vec<String> {
    let tenants = Api::<BaseTenant>::all(client.clone());
    let ring = Ring::new(members);
    let mut owners = std::collections::BTreeSet::new();
    let mut names = Vec::new();
    while names.len() < at_least || owners.len() < members.len() {
        assert!(
            names.len() < 64,
            "64 uids left a member of {members:?} without one"
        );
        let spec = BaseTenantSpec {
            owners: vec!["alice".into()],
            cpu: "1".into(),
            memory: "1Gi".into(),
        };
        let tenant = BaseTenant::new(&unique_name("bt"), spec);
        let created = tenants
            .create(&PostParams::default(), &tenant)
            .await
            .unwrap();
        owners.insert(
            ring.owner_of(shard_hash(&created.metadata, ShardField::Uid))
                .map(str::to_owned),
        );
        names.push(created.name_any());
    }
    names
}
