//! A careless admin against two sharded replicas of the example's `BaseTenant` manager
//! (runtime/examples/base_tenant.rs), in one test process, on the real control plane: the
//! `example.idem.dev/shard-bucket` label of every tenant's namespace and quota is rewritten
//! (a bucket that does not exist, and the bucket of another owner); each is put back by the
//! owner's replica, every BaseTenant stays Ready, and a spec change afterwards is still
//! reconciled.

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use base_tenant::{BaseTenant, BaseTenantSpec, BaseTenants};
use idem_runtime::manager::{Manager, ManagerError, ManagerOptions, Reconciles};
use idem_tests::ports::free_addr;
use idem_tests::{create_namespace, shared, unique_name};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Longest wait for any condition (two cores, other builds beside the tests).
const TIMEOUT: Duration = Duration::from_secs(180);

/// BaseTenants reconciled by the two replicas.
const TENANTS: usize = 6;

/// Polls `check` every 250 ms until it returns `Ok`; panics with the last `Err` after
/// [`TIMEOUT`].
async fn eventually<T, Fut: Future<Output = Result<T, String>>>(
    what: &str,
    mut check: impl FnMut() -> Fut,
) -> T {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(why) => assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; last state: {why}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `GET path` on `addr`: status code and body.
async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
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
fn gauge(metrics: &str, name: &str) -> Option<i64> {
    (metrics.lines())
        .find(|l| l.split([' ', '{']).next() == Some(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// One replica: the example's manager, run in-process until its `stop` is sent.
struct Replica {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ManagerError>>,
}

impl Replica {
    /// Starts replica `identity` of manager `name` with its Leases in `namespace`, sharded.
    fn start(name: &str, namespace: &str, identity: &str) -> Self {
        let addr = free_addr();
        let options = ManagerOptions {
            kubeconfig: Some(shared().kubeconfig_path().to_path_buf()),
            workers: 2,
            metrics_addr: addr,
            health_addr: addr,
            leader_elect_namespace: Some(namespace.into()),
            identity: Some(identity.into()),
            shutdown_grace: Duration::from_secs(10),
            shards: true,
            ..ManagerOptions::default()
        };
        let manager = Manager::new(name, options).add(Reconciles::new(BaseTenants));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(manager.run_until(async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// Its `/metrics`.
    async fn metrics(&self) -> Result<String, String> {
        match get(self.addr, "/metrics").await? {
            (200, body) => Ok(body),
            (code, body) => Err(format!("{code} {body}")),
        }
    }

    /// Waits until it works on a ring (`idem_shard_working 1`) and has `members` members.
    async fn working(&self, members: i64) {
        eventually("the replica working on its ring", || async {
            assert!(!self.task.is_finished(), "the manager exited");
            let m = self.metrics().await?;
            match (
                gauge(&m, "idem_shard_working"),
                gauge(&m, "idem_shard_members"),
            ) {
                (Some(1), Some(n)) if n == members => Ok(()),
                other => Err(format!("working, members: {other:?}")),
            }
        })
        .await;
    }

    /// Waits until `/readyz` answers `code`.
    async fn readyz(&self, code: u16) {
        eventually(&format!("/readyz {code}"), || async {
            assert!(!self.task.is_finished(), "the manager exited");
            match get(self.addr, "/readyz").await? {
                (c, _) if c == code => Ok(()),
                (c, body) => Err(format!("{c} {body}")),
            }
        })
        .await;
    }

    /// BaseTenants in its shard (`idem_shard_owned_tenants`).
    async fn owned(&self) -> i64 {
        (self.metrics().await.ok())
            .and_then(|m| gauge(&m, "idem_shard_owned_tenants"))
            .unwrap_or(-1)
    }

    /// Graceful shutdown, as on SIGTERM; `run_until` returns `Ok`.
    async fn stop(mut self) {
        let _ = self.stop.take().expect("running").send(());
        let result = tokio::time::timeout(TIMEOUT, self.task).await;
        result
            .expect("stops in time")
            .expect("no panic")
            .expect("stops cleanly");
    }
}

/// Whether every BaseTenant in `names` is Ready at its generation with quota `cpu`.
async fn all_ready(client: &Client, names: &[String], cpu: &str) -> Result<(), String> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_shard_bucket_label_is_put_back_and_hides_no_child() {
    let client = shared().client();
    let ns = create_namespace(&client, "forge").await.unwrap();
    let name = unique_name("base-tenant");
    base_tenant::install_crd(&client).await.unwrap();
    let a = Replica::start(&name, &ns, "replica-a");
    let b = Replica::start(&name, &ns, "replica-b");
    a.working(2).await;
    b.working(2).await;
    a.readyz(200).await;
    b.readyz(200).await;

    let tenants = Api::<BaseTenant>::all(client.clone());
    let mut names = Vec::new();
    for _ in 0..TENANTS {
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
        names.push(created.name_any());
    }
    eventually("every BaseTenant Ready", || all_ready(&client, &names, "1")).await;
    eventually("both replicas owning a share", || async {
        let (x, y) = (a.owned().await, b.owned().await);
        (x > 0 && y > 0 && x + y == TENANTS as i64)
            .then_some(())
            .ok_or(format!("a {x}, b {y}"))
    })
    .await;

    const BUCKET: &str = "example.idem.dev/shard-bucket";
    let namespaces = Api::<Namespace>::all(client.clone());
    let mut expected = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let bucket: String = (namespaces.get(name).await.unwrap().metadata.labels)
            .and_then(|l| l.get(BUCKET).cloned())
            .expect("a bucket label");
        expected.push(bucket.clone());
        // A bucket that does not exist for some, another bucket (replica) for the others.
        let forged = if i % 2 == 0 {
            "999".to_owned()
        } else {
            ((bucket.parse::<u32>().unwrap() + 128) % 256).to_string()
        };
        let patch = serde_json::json!({"metadata": {"labels": {BUCKET: forged}}});
        let admin = PatchParams::default();
        namespaces
            .patch(name, &admin, &Patch::Merge(&patch))
            .await
            .unwrap();
        let quotas = Api::<ResourceQuota>::namespaced(client.clone(), name);
        quotas
            .patch("quota", &admin, &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    eventually("every forged bucket label put back", || async {
        for (name, bucket) in names.iter().zip(&expected) {
            let label = |l: Option<std::collections::BTreeMap<String, String>>| {
                l.and_then(|l| l.get(BUCKET).cloned())
            };
            let ns = label(
                namespaces
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?
                    .metadata
                    .labels,
            );
            let quotas = Api::<ResourceQuota>::namespaced(client.clone(), name);
            let q = label(
                quotas
                    .get("quota")
                    .await
                    .map_err(|e| e.to_string())?
                    .metadata
                    .labels,
            );
            if ns.as_ref() != Some(bucket) || q.as_ref() != Some(bucket) {
                return Err(format!(
                    "{name}: namespace {ns:?}, quota {q:?}, want {bucket}"
                ));
            }
        }
        Ok(())
    })
    .await;
    eventually("every BaseTenant still Ready", || {
        all_ready(&client, &names, "1")
    })
    .await;

    // A change afterwards: the children the forged labels moved are still seen and applied.
    let change = serde_json::json!({"spec": {"cpu": "2"}});
    for name in &names {
        (tenants
            .patch(name, &PatchParams::default(), &Patch::Merge(&change))
            .await)
            .unwrap();
    }
    eventually("every BaseTenant Ready after the change", || {
        all_ready(&client, &names, "2")
    })
    .await;
    a.stop().await;
    b.stop().await;
}
