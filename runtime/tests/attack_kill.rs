//! Two sharded replicas of the example `BaseTenant` binary (runtime/examples/base_tenant.rs,
//! `run --shards auto`) as processes against the real control plane; one is killed (SIGKILL:
//! no graceful stop, its member Lease is left to expire): the other takes its share over and
//! reconciles every BaseTenant's change.
//!
//! Runs the example's binary: `cargo build -p idem-runtime --example base_tenant` first.

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;
mod replicas;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use idem_tests::ports::free_addr;
use idem_tests::{create_namespace, shared, unique_name};
use replicas::{all_ready, change_cpu, create_shared, eventually, gauge, get};

/// The fewest BaseTenants reconciled by the two replicas.
const TENANTS: usize = 6;

/// One replica: the example's binary, killed when dropped.
struct Process {
    addr: SocketAddr,
    child: Child,
}

impl Process {
    fn start(name: &str, namespace: &str, identity: &str) -> Self {
        // Beside this test's binary (`<target>/debug/deps/`), wherever the target directory is.
        let exe = std::env::current_exe().unwrap();
        let binary = (exe.parent().and_then(Path::parent))
            .unwrap_or_else(|| Path::new("."))
            .join("examples/base_tenant");
        assert!(
            binary.exists(),
            "{}: run `cargo build -p idem-runtime --example base_tenant` first",
            binary.display()
        );
        let addr = free_addr();
        let health = free_addr();
        let log =
            std::fs::File::create(std::env::temp_dir().join(format!("{name}-{identity}.log")))
                .expect("log file");
        let child = Command::new(binary)
            .args(["run", "--shards", "auto", "--workers", "2"])
            .arg("--identity")
            .arg(identity)
            .arg("--leader-elect-namespace")
            .arg(namespace)
            .arg("--kubeconfig")
            .arg(shared().kubeconfig_path())
            .arg("--metrics-addr")
            .arg(addr.to_string())
            .arg("--health-addr")
            .arg(health.to_string())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the example");
        Self { addr, child }
    }

    async fn metrics(&self) -> Result<String, String> {
        match get(self.addr, "/metrics").await? {
            (200, body) => Ok(body),
            (code, body) => Err(format!("{code} {body}")),
        }
    }

    /// Waits until it works on a ring of `members` members.
    async fn working(&self, members: i64) {
        eventually("the replica working on its ring", || async {
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

    async fn owned(&self) -> i64 {
        (self.metrics().await.ok())
            .and_then(|m| gauge(&m, "idem_shard_owned_tenants"))
            .unwrap_or(-1)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_share_is_taken_over() {
    let client = shared().client();
    let ns = create_namespace(&client, "kill").await.unwrap();
    let name = unique_name("base-tenant");
    base_tenant::install_crd(&client).await.unwrap();
    let mut a = Process::start(&name, &ns, "replica-a");
    let b = Process::start(&name, &ns, "replica-b");
    a.working(2).await;
    b.working(2).await;

    let names = create_shared(&client, TENANTS, &["replica-a", "replica-b"]).await;
    let total = names.len() as i64;
    eventually("every BaseTenant Ready", || all_ready(&client, &names, "1")).await;
    eventually("both replicas owning a share", || async {
        let (x, y) = (a.owned().await, b.owned().await);
        (x > 0 && y > 0 && x + y == total)
            .then_some(())
            .ok_or(format!("a {x}, b {y}"))
    })
    .await;

    // SIGKILL: no graceful stop, the member Lease stays until it expires.
    a.child.kill().expect("kill replica-a");
    a.child.wait().expect("reap replica-a");
    let killed = tokio::time::Instant::now();
    change_cpu(&client, &names, "2").await;
    println!(
        "taken over and reconciled {:?} after the kill",
        killed.elapsed()
    );
    eventually("replica-b owning every BaseTenant", || async {
        let n = b.owned().await;
        (n == total).then_some(()).ok_or(format!("b {n}"))
    })
    .await;
}
