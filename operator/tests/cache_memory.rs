//! The resident memory of the Tenant controller's child caches at 1,000 tenants, measured as
//! RSS, not estimated from JSON size.
//!
//! Run: `cargo test -p idem-operator --test cache_memory -- --ignored --nocapture`
//! (`IDEM_CACHE_TENANTS=<n>` for another fleet size). The test creates the tenants (spec
//! `full_spec(["a"])`: one namespace each, with quota, limits, owners' RoleBinding and
//! isolation policy) with the real operator and waits until all are Ready; then it starts
//! fresh processes of this test binary (probes), each running the Tenant controller's watches
//! — Tenants plus the five child kinds, selected by the operator's `managed-by` label — with a
//! no-op reconcile, and reading `VmRSS` from `/proc/self/status` before the controller starts
//! and once every watch has listed. With child caches the stores keep every child; without,
//! the same watches run and keep nothing: the difference is what the caches cost.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{Operator, TIMEOUT, eventually, install_crds, tenants};
use idem_operator::resources::{FIELD_MANAGER, Tenant};
use idem_runtime::apply::{ChildCaches, MANAGED_BY_LABEL};
use idem_runtime::controller::{Action, Attempt, Controller, ControllerConfig};
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;

const TEST: &str = "child_caches_rss_at_1000_tenants";
/// Set in a probe's environment: `on` (with child caches) or `off`.
const PROBE: &str = "IDEM_CACHE_PROBE";
/// Set in a probe's environment: the control plane's kubeconfig.
const PROBE_KUBECONFIG: &str = "IDEM_CACHE_PROBE_KUBECONFIG";
/// Probes per mode (alternating), to see the noise.
const ROUNDS: usize = 2;

/// `VmRSS` and `VmHWM` of this process, in KiB.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/self/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

async fn noop(_: Arc<Tenant>, _: Arc<()>, _: Attempt) -> Result<Action, kube::Error> {
    Ok(Action::await_change())
}

/// One probe: the Tenant controller's watches, with or without child caches; prints one
/// `PROBE` line.
async fn probe(kubeconfig: &Path, caches_on: bool) {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("client config");
    let client = kube::Client::try_from(config).expect("client");
    // Connection, TLS and the client itself are set up before the first reading.
    client.apiserver_version().await.expect("apiserver version");
    let (before, _) = rss_kib();
    let children =
        || watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}"));
    let caches = ChildCaches::new();
    let (synced_tx, mut synced) = tokio::sync::watch::channel(false);
    let mut controller = Controller::new(
        Api::<Tenant>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<Namespace>::all(client.clone()), children())
    .owns(Api::<ResourceQuota>::all(client.clone()), children())
    .owns(Api::<LimitRange>::all(client.clone()), children())
    .owns(Api::<RoleBinding>::all(client.clone()), children())
    .owns(Api::<NetworkPolicy>::all(client.clone()), children())
    .with_config(ControllerConfig {
        workers: 1,
        ..ControllerConfig::default()
    })
    .with_synced_signal(synced_tx);
    if caches_on {
        controller = controller.with_child_caches(caches.clone());
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(noop, Arc::new(()), async {
        let _ = stopped.await;
    }));
    tokio::time::timeout(TIMEOUT, synced.wait_for(|s| *s))
        .await
        .expect("watches synced in time")
        .expect("synced signal");
    let (after, hwm) = rss_kib();
    println!(
        "PROBE caches={} objects={} rss_before_kib={before} rss_after_kib={after} hwm_kib={hwm}",
        if caches_on { "on" } else { "off" },
        caches.objects(),
    );
    let _ = stop.send(());
    let _ = run.await;
}

/// Bytes of JSON of the objects the child caches hold (the earlier estimate's basis), and of
/// their `metadata.managedFields` alone.
async fn json_bytes(client: &kube::Client) -> (usize, usize) {
    let lp = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}"));
    let (mut bytes, mut managed) = (0, 0);
    macro_rules! add {
        ($k:ty) => {
            for o in Api::<$k>::all(client.clone())
                .list(&lp)
                .await
                .expect("list")
                .items
            {
                bytes += serde_json::to_vec(&o).expect("json").len();
                managed += serde_json::to_vec(&o.metadata.managed_fields)
                    .expect("json")
                    .len();
            }
        };
    }
    add!(Namespace);
    add!(ResourceQuota);
    add!(LimitRange);
    add!(RoleBinding);
    add!(NetworkPolicy);
    (bytes, managed)
}

/// Runs a probe process of this binary and returns its `PROBE` line's numbers:
/// (objects, rss before, rss after, hwm).
fn run_probe(caches_on: bool) -> (u64, u64, u64, u64) {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            TEST,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PROBE, if caches_on { "on" } else { "off" })
        .env(PROBE_KUBECONFIG, shared().kubeconfig_path())
        .output()
        .expect("probe process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "probe failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.find("PROBE caches=").map(|i| &l[i..]))
        .unwrap_or_else(|| panic!("no PROBE line in {stdout}"));
    let num = |key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} in {line}"))
    };
    println!("{line}");
    (
        num("objects"),
        num("rss_before_kib"),
        num("rss_after_kib"),
        num("hwm_kib"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: creates 1,000 tenants (minutes); run with --ignored --nocapture"]
async fn child_caches_rss_at_1000_tenants() {
    if let Ok(mode) = std::env::var(PROBE) {
        let kubeconfig = std::env::var(PROBE_KUBECONFIG).expect("probe kubeconfig");
        return probe(Path::new(&kubeconfig), mode == "on").await;
    }
    let n: usize = std::env::var("IDEM_CACHE_TENANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let client = shared().client();
    install_crds(&client).await;
    let operator = Operator::start(Duration::from_secs(3600)).await;
    let prefix = unique_name("mem");
    let started = std::time::Instant::now();
    for i in 0..n {
        tenants::create(
            &client,
            &format!("{prefix}-{i}"),
            tenants::full_spec(&["a"]),
        )
        .await;
    }
    let api: Api<Tenant> = Api::all(client.clone());
    eventually(&format!("{n} tenants Ready"), TIMEOUT * 5, || async {
        let ready = api
            .list(&ListParams::default())
            .await
            .map_err(common::why)?
            .items
            .iter()
            .filter(|t| {
                tenants::condition(t, "Ready")
                    .is_some_and(|c| c.status == "True" && c.reason == "Reconciled")
            })
            .count();
        if ready >= n {
            Ok(())
        } else {
            Err(format!("{ready} of {n} Ready"))
        }
    })
    .await;
    println!("{n} tenants Ready after {:.0?}", started.elapsed());
    operator.stop().await;

    let (bytes, managed) = json_bytes(&client).await;
    let mut on = Vec::new();
    let mut off = Vec::new();
    for _ in 0..ROUNDS {
        off.push(run_probe(false));
        on.push(run_probe(true));
    }
    let objects = on[0].0;
    // The Namespace, quota, LimitRange, two RoleBindings (owners', readers') and the
    // NetworkPolicy of the one namespace of `full_spec`: the kinds the probe caches.
    assert_eq!(
        objects as usize,
        6 * n,
        "every child of every tenant is cached"
    );
    let growth = |v: &[(u64, u64, u64, u64)]| {
        v.iter().map(|p| p.2.saturating_sub(p.1)).sum::<u64>() / v.len() as u64
    };
    let (grow_on, grow_off) = (growth(&on), growth(&off));
    println!(
        "{n} tenants, {objects} cached children, {bytes} B of JSON ({:.1} MB, {managed} B of it \
         managedFields): RSS growth to synced {grow_on} KiB with caches, {grow_off} KiB without; caches cost ≈ {} KiB ({:.1} MB, {} B per child)",
        bytes as f64 / 1e6,
        grow_on.saturating_sub(grow_off),
        grow_on.saturating_sub(grow_off) as f64 * 1024.0 / 1e6,
        grow_on.saturating_sub(grow_off) * 1024 / objects.max(1),
    );
    assert!(
        grow_on > grow_off,
        "holding {objects} objects costs memory: {on:?} vs {off:?}"
    );
}
