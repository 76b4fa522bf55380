//! The manager with a user's kind, against the real control plane: two replicas of the
//! example's `BaseTenant` manager (runtime/examples/base_tenant.rs) in sharded mode, in one
//! test process. `/readyz` is not 200 while a working replica's watches cannot sync (its CRD is
//! missing) and turns 200 once they do; together the replicas reconcile every BaseTenant to
//! Ready, each owning a share; after one shuts down gracefully (what SIGTERM does), the other
//! takes its share over and reconciles every BaseTenant's change.

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;
mod replicas;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use base_tenant::{BaseTenant, BaseTenants};
use idem_runtime::manager::{Manager, ManagerError, ManagerOptions, Reconciles};
use idem_runtime::shard::{Ring, ShardField, shard_hash};
use idem_tests::WAIT as TIMEOUT;
use idem_tests::ports::free_addr;
use idem_tests::{create_namespace, shared, unique_name};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use replicas::{all_ready, change_cpu, create_shared, eventually, gauge, get};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// BaseTenants reconciled by the two replicas.
const TENANTS: usize = 12;

/// The children of a BaseTenant: a namespace, a quota, a LimitRange and a RoleBinding.
const CHILDREN: i64 = 4;

/// The ResourceQuotas of a BaseTenant.
const QUOTAS: i64 = 1;

/// ResourceQuotas the API server sent so far, by its own counts: the objects of lists (from
/// etcd or its watch cache) and the events of watches (the objects a streaming list starts with
/// among them).
fn quotas_sent(metrics: &str) -> i64 {
    let wanted = |line: &&str| {
        line.starts_with("apiserver_watch_events_total{")
            && (line.contains("kind=\"ResourceQuota\"")
                || line.contains("resource=\"resourcequotas\""))
            || line.starts_with("apiserver_storage_list_returned_objects_total{")
                && line.contains("resource=\"resourcequotas\"")
            || line.starts_with("apiserver_cache_list_returned_objects_total{")
                && line.contains("resourcequotas")
    };
    metrics
        .lines()
        .filter(wanted)
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as i64
}

/// One replica: the example's manager, run in-process until its `stop` is sent.
struct Replica {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ManagerError>>,
}

impl Replica {
    /// Starts replica `identity` of manager `name` with its Leases in `namespace`, sharded, on
    /// the control plane of `kubeconfig`.
    fn start(kubeconfig: &Path, name: &str, namespace: &str, identity: &str) -> Self {
        let addr = free_addr();
        let options = ManagerOptions {
            kubeconfig: Some(kubeconfig.to_path_buf()),
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

    /// Objects in its child caches (`idem_shard_child_cache_objects`).
    async fn cached_children(&self) -> i64 {
        (self.metrics().await.ok())
            .and_then(|m| gauge(&m, "idem_shard_child_cache_objects"))
            .unwrap_or(-1)
    }

    /// Watch events it received (`idem_watch_events_received`).
    async fn events_received(&self) -> i64 {
        (self.metrics().await.ok())
            .and_then(|m| {
                gauge(&m, "idem_watch_events_received_total")
                    .or_else(|| gauge(&m, "idem_watch_events_received"))
            })
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sharded_replicas_share_the_base_tenants_and_one_takes_over_after_the_other_stops() {
    let client = shared().client();
    let ns = create_namespace(&client, "manager").await.unwrap();
    let name = unique_name("base-tenant");
    // Without the CRD (this test binary's control plane never had it): working replicas'
    // watches cannot sync, so they are not ready.
    let kubeconfig = shared().kubeconfig_path();
    let a = Replica::start(kubeconfig, &name, &ns, "replica-a");
    let b = Replica::start(kubeconfig, &name, &ns, "replica-b");
    a.working(2).await;
    b.working(2).await;
    a.readyz(503).await;
    b.readyz(503).await;
    base_tenant::install_crd(&client).await.unwrap();
    a.readyz(200).await;
    b.readyz(200).await;

    let names = create_shared(&client, TENANTS, &["replica-a", "replica-b"]).await;
    let total = names.len() as i64;
    eventually("every BaseTenant Ready", || all_ready(&client, &names, "1")).await;
    let (owned_a, owned_b) = shares(&a, &b, total).await;

    // Replica a stops as on SIGTERM (it leaves the ring): b takes every BaseTenant over. It
    // keeps the children of its own buckets and lists only a's: the ResourceQuotas the API
    // server sends meanwhile (lists and watches, its own counts) are a's, not all of them.
    let in_share = settle(&client, &names, &b, owned_b).await;
    let before = shared().metrics().await.unwrap();
    take_over(a, &b, total).await;
    let after = shared().metrics().await.unwrap();
    let sent = quotas_sent(&after) - quotas_sent(&before);
    println!("ResourceQuotas sent after the ring change: {sent} (a's {owned_a}, all {total})");
    assert!(
        sent <= owned_a * QUOTAS,
        "{sent} ResourceQuotas sent: more than the {} of replica-a's share",
        owned_a * QUOTAS
    );
    // The watch going on from b's store sees every change.
    deleted_quotas_come_back(&client, &in_share).await;
    change_cpu(&client, &names, "2").await;
    eventually("replica-b owning every BaseTenant", || async {
        let n = b.owned().await;
        (n == total).then_some(()).ok_or(format!("b {n}"))
    })
    .await;
    b.stop().await;
}

/// Waits until both replicas work on a share, together on all `total` BaseTenants; their
/// shares.
async fn shares(a: &Replica, b: &Replica, total: i64) -> (i64, i64) {
    let (owned_a, owned_b) = eventually("both replicas owning a share", || async {
        let (x, y) = (a.owned().await, b.owned().await);
        (x > 0 && y > 0 && x + y == total)
            .then_some((x, y))
            .ok_or(format!("a {x}, b {y}"))
    })
    .await;
    println!("owned: replica-a {owned_a}, replica-b {owned_b}");
    (owned_a, owned_b)
}

/// Waits until `b` caches the children of its `owned` BaseTenants and every quota is counted
/// by the quota controller (no status writes after this), then changes one of b's quotas and
/// waits for b to receive its event: b's store of quotas is then complete to a version after
/// every quota's last change (else its watch, going on from an earlier one, would be sent the
/// changes since as well). Returns a BaseTenant of each replica's share.
async fn settle(
    client: &Client,
    names: &[String],
    b: &Replica,
    owned_b: i64,
) -> HashMap<String, String> {
    let tenants = Api::<BaseTenant>::all(client.clone());
    eventually("replica-b caching the children of its share", || async {
        let n = b.cached_children().await;
        (n == owned_b * CHILDREN)
            .then_some(())
            .ok_or(format!("b {n}"))
    })
    .await;
    // Every quota counted by the quota controller (no status writes after this), then one of
    // b's quotas changed and its event received by b: b's store of quotas is complete to a
    // version after every quota's last change (else its watch, going on from an earlier one,
    // would be sent the changes since as well).
    let quotas = Api::<ResourceQuota>::all(client.clone());
    eventually("every quota counted", || async {
        let all = (quotas.list(&Default::default()).await).map_err(|e| e.to_string())?;
        let ours = all
            .items
            .iter()
            .filter(|q| names.contains(&q.namespace().unwrap_or_default()));
        let counted = ours
            .filter(|q| q.status.as_ref().is_some_and(|s| s.used.is_some()))
            .count();
        (counted == names.len())
            .then_some(())
            .ok_or(format!("{counted} counted"))
    })
    .await;
    let ring = Ring::new(["replica-a", "replica-b"]);
    let mut in_share = HashMap::new();
    for name in names {
        let t = tenants.get(name).await.unwrap();
        let member = ring
            .owner_of(shard_hash(&t.metadata, ShardField::Uid))
            .unwrap();
        in_share
            .entry(member.to_owned())
            .or_insert_with(|| name.clone());
    }
    let received = b.events_received().await;
    let touch = serde_json::json!({"metadata": {"annotations": {"test.idem.dev/touched": "1"}}});
    Api::<ResourceQuota>::namespaced(client.clone(), &in_share["replica-b"])
        .patch("quota", &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .unwrap();
    eventually("replica-b receiving the change", || async {
        let n = b.events_received().await;
        (n > received).then_some(()).ok_or(format!("{n}"))
    })
    .await;
    in_share
}

/// Replica `a` stops as on SIGTERM (it leaves the ring) and `b` takes every one of the `total`
/// BaseTenants over: it works on a ring of one and caches all their children.
async fn take_over(a: Replica, b: &Replica, total: i64) {
    a.stop().await;
    b.working(1).await;
    b.readyz(200).await;
    eventually(
        "replica-b caching the children of every BaseTenant",
        || async {
            let n = b.cached_children().await;
            (n == total * CHILDREN)
                .then_some(())
                .ok_or(format!("b {n}"))
        },
    )
    .await;
}

/// The quota of a BaseTenant of each former share (`in_share`), deleted, is made again.
async fn deleted_quotas_come_back(client: &Client, in_share: &HashMap<String, String>) {
    let mut deleted = Vec::new();
    for member in ["replica-a", "replica-b"] {
        let name = &in_share[member];
        let quotas = Api::<ResourceQuota>::namespaced(client.clone(), name);
        let uid = quotas.get("quota").await.unwrap().metadata.uid;
        quotas
            .delete("quota", &DeleteParams::default())
            .await
            .unwrap();
        deleted.push((quotas, uid));
    }
    for (quotas, uid) in &deleted {
        eventually("the deleted quota made again", || async {
            let now = quotas.get_opt("quota").await.map_err(|e| e.to_string())?;
            let again = now.is_some_and(|q| q.metadata.uid != *uid);
            again.then_some(()).ok_or("not yet".to_owned())
        })
        .await;
    }
}
