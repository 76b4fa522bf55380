//! `cargo xtask bench --scenario shards`: the operator itself (`idem-operator run
//! --shards=auto`) on N Tenants with 1 replica and with 3, with the `ShardedListAndWatch`
//! gate off and on (a fresh control plane each time, the replicas running as deployed: as the
//! operator's ServiceAccount under the shipped manifests): time to all Ready (the fill starts once
//! the replicas work on a settled ring), ring changes during the fill, watch events, bytes and
//! RSS per replica; with 3, a replica killed with SIGKILL (time until its tenants, changed
//! meanwhile, are Ready again, tenants written by two replicas, tenants lost) and a 4th replica
//! joining (tenants moved, tenants written by two replicas). Writers are judged by the server's
//! record: the `reportingInstance` of the Events each write leaves on its Tenant.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use idem_operator::resources::{Tenant, TenantSpec};
use idem_runtime::shard::{Ring, fnv1a64};
use idem_tests::{ControlPlane, Options};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::dev::progress::Step;

/// Longest wait for any phase.
const PHASE_TIMEOUT: Duration = Duration::from_secs(1800);

/// One replica's figures at the end of the initial fill.
struct Replica {
    name: String,
    events: u64,
    bytes: u64,
    rss_kib: u64,
    owned: u64,
    /// Times it stopped for a new ring during the fill (`idem_shard_handovers_total`).
    handovers: u64,
}

/// A running operator process.
struct Operator {
    name: String,
    addr: SocketAddr,
    child: Child,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    crate::dev::operator::free_addr()
}

fn spawn(
    bin: &Path,
    kubeconfig: &Path,
    ns: &str,
    name: &str,
    workers: usize,
    out: &Path,
) -> anyhow::Result<Operator> {
    let addr = free_addr()?;
    let log = std::fs::File::create(out.join(format!("shards-{name}.log")))?;
    let child = idem_tests::process::dying_with_parent(bin, "KILL")
        .args([
            "run".to_string(),
            "--shards=auto".into(),
            format!("--workers={workers}"),
            format!("--metrics-addr={addr}"),
            format!("--health-addr={addr}"),
        ])
        .env("POD_NAME", name)
        .env("POD_NAMESPACE", ns)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting idem-operator")?;
    Ok(Operator {
        name: name.into(),
        addr,
        child,
    })
}

/// The operator's answer to a GET of `path`: its status line and body (empty if it does not
/// answer).
async fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return Default::default();
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut reply = String::new();
    if stream.write_all(request.as_bytes()).await.is_err()
        || stream.read_to_string(&mut reply).await.is_err()
    {
        return Default::default();
    }
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or_default();
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, body.to_owned())
}

/// The operator's `/metrics` text (empty if it does not answer).
async fn metrics(addr: SocketAddr) -> String {
    get(addr, "/metrics").await.1
}

/// Waits until every operator answers `/readyz` with 200: each works on its share and its
/// caches are complete.
async fn all_ready_replicas(ops: &[&Operator]) -> anyhow::Result<()> {
    let started = Instant::now();
    for op in ops {
        while !get(op.addr, "/readyz").await.0.contains(" 200 ") {
            anyhow::ensure!(started.elapsed() < PHASE_TIMEOUT, "{} never Ready", op.name);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn spec(namespaces: &[&str]) -> anyhow::Result<TenantSpec> {
    Ok(serde_json::from_value(serde_json::json!({
        "owners": [{"kind": "User", "name": "alice"}],
        "namespaces": namespaces,
        "quota": {"hard": {"cpu": "4", "pods": "20"}},
        "isolation": true,
    }))?)
}

fn ready(t: &Tenant) -> bool {
    let Some(status) = &t.status else {
        return false;
    };
    status.observed_generation == t.metadata.generation
        && status.conditions.iter().any(|c| {
            c.type_ == "Ready"
                && c.status == "True"
                && c.observed_generation == t.metadata.generation
        })
}

/// Waits until every tenant in `names` is Ready at its current generation.
async fn all_ready(client: &Client, names: &BTreeSet<String>) -> anyhow::Result<Vec<Tenant>> {
    let started = Instant::now();
    loop {
        let list = Api::<Tenant>::all(client.clone())
            .list(&ListParams::default())
            .await?;
        let mine: Vec<Tenant> = list
            .items
            .into_iter()
            .filter(|t| names.contains(&t.name_any()))
            .collect();
        if mine.len() == names.len() && mine.iter().all(ready) {
            return Ok(mine);
        }
        anyhow::ensure!(
            started.elapsed() < PHASE_TIMEOUT,
            "tenants not Ready in time"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Per tenant uid, the replicas that left an Event on it since `since`.
async fn writers(
    client: &Client,
    since: Timestamp,
) -> anyhow::Result<BTreeMap<String, BTreeSet<String>>> {
    Ok(idem_tests::events::reporters(client, "Tenant", since).await?)
}

async fn patch_all(
    client: &Client,
    names: impl IntoIterator<Item = &String>,
    namespaces: &[&str],
) -> anyhow::Result<()> {
    let api = Api::<Tenant>::all(client.clone());
    let patch = serde_json::json!({"spec": {"namespaces": namespaces}});
    futures::stream::iter(names)
        .map(|n| {
            let api = api.clone();
            let patch = patch.clone();
            async move {
                api.patch(n, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

fn owner(members: &[&str], t: &Tenant) -> String {
    let h = fnv1a64(t.uid().unwrap_or_default().as_bytes());
    Ring::new(members.iter().copied())
        .owner_of(h)
        .unwrap_or_default()
        .to_string()
}

/// Waits until every operator reports `n` live ring members and works on that ring.
async fn members(ops: &[&Operator], n: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    for op in ops {
        while {
            let m = metrics(op.addr).await;
            metric(&m, "idem_shard_members") != n || metric(&m, "idem_shard_working") != 1
        } {
            anyhow::ensure!(
                started.elapsed() < PHASE_TIMEOUT,
                "{} never saw {n} members",
                op.name
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// Installs what `deploy/operator/` ships but the Deployment (the operator's namespace,
/// ServiceAccount, RBAC, admission policies and the FlowSchema of its Lease requests) and
/// writes a kubeconfig that acts as the operator's ServiceAccount; returns the namespace the
/// replicas run in and that kubeconfig. The replicas then run as deployed: their renewals are
/// served at the `leader-election` priority level the FlowSchema gives them, not queued with
/// the fill's writes, and their writes pass the shipped policies.
async fn as_deployed(cp: &ControlPlane, out: &Path) -> anyhow::Result<(String, PathBuf)> {
    let root = crate::generated::repo_root();
    let mut applier = crate::dev::apply::Applier::new(cp.client());
    for m in crate::dev::apply::read_dir(&root.join(crate::manifests::DIR))? {
        if m.kind() != "Deployment" {
            applier.apply(&m).await?;
        }
    }
    let kubeconfig = out.join("shards-as-operator.kubeconfig");
    crate::dev::operator::impersonating_kubeconfig(
        &kube::config::Kubeconfig::read_from(cp.kubeconfig_path())?,
        &kubeconfig,
    )?;
    Ok(("idem-system".to_owned(), kubeconfig))
}

/// Prints `line` and keeps it for the record.
fn say(lines: &mut Vec<String>, line: String) {
    println!("{line}");
    lines.push(line);
}

/// Runs one configuration and prints its figures (kept in `lines`).
#[allow(clippy::too_many_arguments)]
async fn one(
    cp: &ControlPlane,
    bin: &Path,
    gate: bool,
    replicas: usize,
    tenants: usize,
    workers: usize,
    out: &Path,
    lines: &mut Vec<String>,
) -> anyhow::Result<Vec<Replica>> {
    let client = cp.client();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
    for crd in idem_operator::resources::crds() {
        crds.patch(
            &crd.name_any(),
            &PatchParams::apply("idem-bench").force(),
            &Patch::Apply(&crd),
        )
        .await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await; // CRDs established (polled below by creates)
    let (ns, kubeconfig) = as_deployed(cp, out).await?;
    let names: Vec<String> = (0..replicas.max(3) + 1)
        .map(|i| format!("replica-{i}"))
        .collect();
    let mut ops: Vec<Operator> = Vec::new();
    for name in names.iter().take(replicas) {
        ops.push(spawn(bin, &kubeconfig, &ns, name, workers, out)?);
    }
    let label = format!(
        "gate {}, {replicas} replica(s)",
        if gate { "on" } else { "off" }
    );
    // The fill starts on a settled ring: the replicas' joins are not ring changes of the fill.
    members(&ops.iter().collect::<Vec<_>>(), replicas as u64).await?;
    let mut handovers = Vec::new();
    for op in &ops {
        handovers.push(metric(
            &metrics(op.addr).await,
            "idem_shard_handovers_total",
        ));
    }
    let step = Step::start(format!("{label}: {tenants} tenants to Ready"));
    let tenant_names: BTreeSet<String> = (0..tenants).map(|i| format!("shard-{i:05}")).collect();
    let started = Instant::now();
    let api = Api::<Tenant>::all(client.clone());
    let spec = spec(&["a"])?;
    futures::stream::iter(&tenant_names)
        .map(|n| {
            let api = api.clone();
            let t = Tenant::new(n, spec.clone());
            async move {
                loop {
                    match api.create(&PostParams::default(), &t).await {
                        Ok(_) => return Ok(()),
                        // The CRD may not be served yet.
                        Err(kube::Error::Api(s)) if s.code == 404 => {
                            tokio::time::sleep(Duration::from_millis(500)).await
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    all_ready(&client, &tenant_names).await?;
    let ready_after = started.elapsed();
    step.done("");
    // Let the last status writes' watch events arrive before reading the counters.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut figures = Vec::new();
    for (op, before) in ops.iter().zip(&handovers) {
        let m = metrics(op.addr).await;
        figures.push(Replica {
            handovers: metric(&m, "idem_shard_handovers_total").saturating_sub(*before),
            name: op.name.clone(),
            events: metric(&m, "idem_watch_events_received_total"),
            bytes: metric(&m, "idem_received_bytes_total"),
            rss_kib: rss_kib(op.child.id()),
            owned: metric(&m, "idem_shard_owned_tenants"),
        });
    }
    say(
        lines,
        format!(
            "shards, {label}: all {tenants} Ready after {:.1}s; {} ring change(s) during the fill",
            ready_after.as_secs_f64(),
            figures.iter().map(|f| f.handovers).max().unwrap_or(0)
        ),
    );
    for f in &figures {
        say(
            lines,
            format!(
                "  {}: owns {} tenants, {} watch events, {:.1} MiB received, RSS {:.1} MiB, stopped for {} new ring(s)",
                f.name,
                f.owned,
                f.events,
                f.bytes as f64 / 1048576.0,
                f.rss_kib as f64 / 1024.0,
                f.handovers
            ),
        );
    }
    if replicas == 3 {
        // A 4th replica joins: about a quarter of the tenants move, none written by two.
        let step = Step::start(format!("{label}: a 4th replica joins"));
        let mut before_join = Vec::new();
        for op in &ops {
            before_join.push(metric(&metrics(op.addr).await, "idem_received_bytes_total"));
        }
        ops.push(spawn(bin, &kubeconfig, &ns, &names[3], workers, out)?);
        members(&ops.iter().collect::<Vec<_>>(), 4).await?;
        // What the ring change cost each earlier replica: the bytes it received until every
        // replica's caches were complete again, before any tenant changes.
        all_ready_replicas(&ops.iter().collect::<Vec<_>>()).await?;
        let mut join_bytes = Vec::new();
        for (op, before) in ops.iter().zip(&before_join) {
            let now = metric(&metrics(op.addr).await, "idem_received_bytes_total");
            join_bytes.push(format!(
                "{} {:.2} MiB",
                op.name,
                now.saturating_sub(*before) as f64 / 1048576.0
            ));
        }
        let fill_bytes: u64 = figures.iter().map(|f| f.bytes).sum();
        let before: Vec<&str> = names[..3].iter().map(String::as_str).collect();
        let now: Vec<&str> = names[..4].iter().map(String::as_str).collect();
        let since = Timestamp::now();
        patch_all(&client, &tenant_names, &["a", "c"]).await?;
        let done = all_ready(&client, &tenant_names).await?;
        let w = writers(&client, since).await?;
        let moved = done
            .iter()
            .filter(|t| owner(&before, t) != owner(&now, t))
            .count();
        let twice = done
            .iter()
            .filter(|t| {
                w.get(&t.uid().unwrap_or_default())
                    .is_some_and(|s| s.len() > 1)
            })
            .count();
        let wrong = done
            .iter()
            .filter(|t| {
                w.get(&t.uid().unwrap_or_default())
                    .is_some_and(|s| !s.contains(&owner(&now, t)))
            })
            .count();
        step.done("");
        say(
            lines,
            format!(
                "  a 4th replica joins: {moved}/{tenants} tenants moved ({:.0}%, ideal 25%); {twice} written by two replicas; {wrong} written by a non-owner",
                100.0 * moved as f64 / tenants as f64
            ),
        );
        say(
            lines,
            format!(
                "  received at the join until every replica was Ready again: {} (the three received {:.1} MiB in all during the fill)",
                join_bytes.join(", "),
                fill_bytes as f64 / 1048576.0
            ),
        );
        // SIGKILL replica-0; change its tenants meanwhile; the others must take them over.
        let victims: BTreeSet<String> = done
            .iter()
            .filter(|t| owner(&now, t) == names[0])
            .map(ResourceExt::name_any)
            .collect();
        let step = Step::start(format!(
            "{label}: SIGKILL replica-0 ({} tenants)",
            victims.len()
        ));
        let since = Timestamp::now();
        let killed = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(ops[0].child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        patch_all(&client, &victims, &["a", "b"]).await?;
        members(&ops[1..].iter().collect::<Vec<_>>(), 3).await?;
        let ring_after = killed.elapsed();
        let back = all_ready(&client, &victims).await?;
        let after = killed.elapsed();
        let w = writers(&client, since).await?;
        let twice = back
            .iter()
            .filter(|t| {
                w.get(&t.uid().unwrap_or_default())
                    .is_some_and(|s| s.len() > 1)
            })
            .count();
        step.done("");
        say(
            lines,
            format!(
                "  kill -9 replica-0: survivors working on a ring of 3 after {:.1}s (lease 15 s); its {} tenants Ready again after {:.1}s; {} written by two replicas; {} lost",
                ring_after.as_secs_f64(),
                victims.len(),
                after.as_secs_f64(),
                twice,
                victims.len() - back.len()
            ),
        );
    }
    drop(ops);
    Ok(figures)
}

/// Runs the scenario: with the gate off and/or on (`gates`), 1 and 3 replicas, the operator
/// built with the `release` profile when `release` is set (as every other scenario's
/// controllers, unless `--debug`); returns the lines it printed.
///
/// # Errors
/// Build, control-plane, operator or API failures.
pub fn run(
    tenants: usize,
    workers: usize,
    gates: &[bool],
    release: bool,
    out: &Path,
) -> anyhow::Result<Vec<String>> {
    let mut lines = Vec::new();
    let profile = if release { "release" } else { "debug" };
    let step = Step::start(format!("building idem-operator ({profile})"));
    let bin: PathBuf = crate::dev::operator::build_bin_with(
        step.bar(),
        "idem-operator",
        "idem-operator",
        release,
    )?;
    step.done("");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    for &gate in gates {
        let mut single = None;
        for replicas in [1, 3] {
            let cp = ControlPlane::start_with(Options {
                service_cidr: idem_tests::LARGE_SERVICE_CIDR.to_owned(),
                feature_gates: if gate {
                    vec!["ShardedListAndWatch=true".into()]
                } else {
                    Vec::new()
                },
                ..Options::default()
            })?;
            let figures = rt.block_on(one(
                &cp, &bin, gate, replicas, tenants, workers, out, &mut lines,
            ))?;
            cp.stop();
            match (&single, figures.as_slice()) {
                (None, [one]) => single = Some((one.events, one.bytes, one.rss_kib)),
                (Some((e, b, r)), many) => {
                    for f in many {
                        say(
                            &mut lines,
                            format!(
                                "  {} ÷ the single replica: events {:.2}, bytes {:.2}, RSS {:.2}",
                                f.name,
                                f.events as f64 / (*e).max(1) as f64,
                                f.bytes as f64 / (*b).max(1) as f64,
                                f.rss_kib as f64 / (*r).max(1) as f64
                            ),
                        );
                    }
                }
                _ => {}
            }
        }
    }
    Ok(lines)
}
