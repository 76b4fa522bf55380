//! Sharded replicas on the real control plane, beyond the ring itself (`sharding.rs`):
//! `/readyz` of a sharded replica follows its controllers' watches (not ready while the Tenant
//! CRD is deleted, ready again once it is back), and a replica that would reconcile what a
//! running ring already does refuses to work — no reconcile, an error in its log naming the
//! problem: one started without `--shards` beside a live ring (until the ring is gone; ready
//! meanwhile, as a standby) or that works or stands by (`--leader-elect`) when a ring comes alive (it watches the ring's Leases: idle, it lists
//! none; it exits with an error), and a second one with the identity of a running member (it exits
//! with an error). One test at a time: one deletes a CRD, and each
//! runs a ring of its own (in a namespace of its own).

mod common;

use std::time::Duration;

use common::process::OperatorProcess;
use common::{Operator, TIMEOUT, eventually, http_get, install_crds, tenants, why};
use idem_operator::resources::Tenant;
use idem_tests::{create_namespace, shared, unique_name};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{Api, DeleteParams};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The value of gauge `name` in a `/metrics` text.
fn gauge(metrics: &str, name: &str) -> Option<String> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map(|v| v.trim().to_string())
}

/// A replica process with the manifest's args (`--shards=auto`) and `--identity=identity`;
/// `shards: false` drops `--shards` (one replica that does everything).
fn replica(ns: &str, log_name: &str, identity: &str, shards: bool) -> OperatorProcess {
    let identity = identity.to_string();
    OperatorProcess::spawn_with(shared().kubeconfig_path(), ns, log_name, move |args| {
        args.into_iter()
            .filter(|a| a != "--leader-elect" && !a.starts_with("--shards"))
            .chain(shards.then(|| "--shards=auto".to_string()))
            .chain([format!("--identity={identity}"), "--workers=2".into()])
            .collect()
    })
}

/// Waits until `r` works on a ring (`idem_shard_working 1`) and is ready.
async fn wait_working(r: &mut OperatorProcess) {
    eventually(
        &format!("{} working and ready", r.name),
        TIMEOUT,
        || async {
            let m = r.metrics().await.unwrap_or_default();
            let working = gauge(&m, "idem_shard_working");
            let ready = r.ready().await;
            (working.as_deref() == Some("1") && ready)
                .then_some(())
                .ok_or(format!("working {working:?}, ready {ready}"))
        },
    )
    .await;
}

/// Waits until `r` either logged a refusal or became ready and reconciled (a Tenant exists);
/// returns its log.
async fn refusal_or_work(r: &OperatorProcess) -> String {
    eventually(
        &format!("{} to refuse or to work", r.name),
        TIMEOUT,
        || async {
            let log = std::fs::read_to_string(&r.log).unwrap_or_default();
            if log.contains("refusing") {
                return Ok(log);
            }
            if r.ready().await && r.reconciles("tenant").await > 0 {
                return Ok(log);
            }
            Err(r.log_tail())
        },
    )
    .await
}

/// `r` refused: the error names the problem, its readiness is `ready` (a replica waiting for
/// a ring to go is ready, as a standby is, so that a rolling update goes on) and it reconciled
/// nothing, even after a new Tenant was reconciled by the ring beside it.
async fn assert_refused(
    client: &kube::Client,
    r: &OperatorProcess,
    log: &str,
    problem: &str,
    ready: bool,
) {
    assert!(
        log.contains("refusing") && log.contains(problem),
        "{} did not refuse naming {problem:?}:\n{}",
        r.name,
        r.log_tail()
    );
    assert!(
        log.contains("ERROR"),
        "logged as an error:\n{}",
        r.log_tail()
    );
    let name = unique_name("guard");
    tenants::create(client, &name, tenants::full_spec(&["x"])).await;
    tenants::wait_ready(client, &name).await;
    assert_eq!(r.ready().await, ready, "{} readiness", r.name);
    assert_eq!(r.reconciles("tenant").await, 0, "{} reconciled", r.name);
    assert_eq!(r.reconciles("tenantapp").await, 0, "{} reconciled", r.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_replica_is_not_ready_while_a_watch_is_not_established() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let ns = create_namespace(&client, "ring-ready").await.unwrap();
    let mut operator = Operator::spawn_configured(Duration::from_secs(600), None, |o| {
        o.shards = true;
        o.leader_elect_namespace = Some(ns.clone());
        o.identity = Some("ready-a".into());
    });
    operator.wait_ready().await;
    let addr = operator.addr;
    eventually("working on a ring", TIMEOUT, || async {
        let (_, m) = http_get(addr, "/metrics").await?;
        let working = gauge(&m, "idem_shard_working");
        let ready = http_get(addr, "/readyz").await?.0 == 200;
        (working.as_deref() == Some("1") && ready)
            .then_some(())
            .ok_or(format!("working {working:?}, ready {ready}"))
    })
    .await;

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(Tenant::crd_name(), &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Tenant CRD gone", TIMEOUT, || async {
        match crds.get_opt(Tenant::crd_name()).await.map_err(why)? {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
    eventually(
        "/readyz to fail while the Tenant CRD is missing",
        TIMEOUT,
        || async {
            match http_get(addr, "/readyz").await? {
                (503, _) => Ok(()),
                (code, body) => Err(format!("{code} {body}")),
            }
        },
    )
    .await;
    install_crds(&client).await;
    eventually("/readyz to pass once the CRD is back", TIMEOUT, || async {
        match http_get(addr, "/readyz").await? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_shards_waits_while_a_ring_is_live() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let ns = create_namespace(&client, "ring-single").await.unwrap();
    let mut member = replica(&ns, "ring-member", "ring-member", true);
    wait_working(&mut member).await;
    let before = unique_name("guard");
    tenants::create(&client, &before, tenants::full_spec(&["x"])).await;
    tenants::wait_ready(&client, &before).await;
    let single = replica(&ns, "single", "single", false);
    let log = refusal_or_work(&single).await;
    assert_refused(
        &client,
        &single,
        &log,
        "without --shards beside a running ring",
        true,
    )
    .await;
    assert!(member.ready().await, "the ring's member stays ready");
    // Once the ring is gone (its member killed: its Lease is no longer renewed), the replica
    // works.
    drop(member);
    eventually(
        "the single replica working once the ring is gone",
        TIMEOUT,
        || async {
            let (ready, reconciles) = (single.ready().await, single.reconciles("tenant").await);
            (ready && reconciles > 0)
                .then_some(())
                .ok_or(format!("ready {ready}, {reconciles} reconciles"))
        },
    )
    .await;
}

/// Lease lists the API server served (every scope: the replica's guard lists in its namespace).
async fn lease_lists() -> u64 {
    let text = shared().metrics().await.expect("apiserver /metrics");
    idem_tests::metrics::requests(&text, "LIST", "coordination.k8s.io", "leases")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_working_replica_without_shards_watches_for_a_ring_and_stops_when_one_comes_alive() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let ns = create_namespace(&client, "ring-watch").await.unwrap();
    let single = replica(&ns, "watching", "watching", false);
    let name = unique_name("guard");
    tenants::create(&client, &name, tenants::full_spec(&["x"])).await;
    eventually("the single replica working", TIMEOUT, || async {
        let (ready, reconciles) = (single.ready().await, single.reconciles("tenant").await);
        (ready && reconciles > 0)
            .then_some(())
            .ok_or(format!("ready {ready}, {reconciles} reconciles"))
    })
    .await;
    // Idle, it lists no Lease: it watches them (a guard that polled would list every 5 s).
    let before = lease_lists().await;
    tokio::time::sleep(Duration::from_secs(16)).await;
    let idle = lease_lists().await - before;
    assert!(
        idle <= 1,
        "{idle} Lease lists in 16 s of an idle replica outside a ring\n{}",
        single.log_tail()
    );
    // A ring coming alive beside it is seen: the replica cancels its work and exits with an
    // error naming the problem (restarted, it would wait as at start).
    let mut single = single;
    let member = replica(&ns, "watch-member", "watch-member", true);
    exits_naming_the_ring(&mut single).await;
    let mut member = member;
    wait_working(&mut member).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_with_a_members_identity_refuses_to_work() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let ns = create_namespace(&client, "ring-dup").await.unwrap();
    let mut first = replica(&ns, "dup-first", "dup", true);
    wait_working(&mut first).await;
    let before = unique_name("guard");
    tenants::create(&client, &before, tenants::full_spec(&["x"])).await;
    tenants::wait_ready(&client, &before).await;
    let mut second = replica(&ns, "dup-second", "dup", true);
    let log = refusal_or_work(&second).await;
    assert_refused(
        &client,
        &second,
        &log,
        "two replicas have the same identity",
        false,
    )
    .await;
    // It exits with an error (restarted, it would look again), rather than stay up idle.
    exited_with_error(&mut second).await;
    // The first keeps its Lease and its work.
    wait_working(&mut first).await;
    assert!(first.exited().is_none(), "{}", first.log_tail());
}

/// A replica with `--leader-elect` (no `--shards`) and `--identity=identity`.
fn elected(ns: &str, log_name: &str, identity: &str) -> OperatorProcess {
    let identity = identity.to_string();
    OperatorProcess::spawn_with(shared().kubeconfig_path(), ns, log_name, move |args| {
        args.into_iter()
            .filter(|a| a != "--leader-elect" && !a.starts_with("--shards"))
            .chain([
                "--leader-elect".to_string(),
                format!("--identity={identity}"),
                "--workers=2".into(),
            ])
            .collect()
    })
}

/// Waits until `r` exits; it must have failed. Returns its log.
async fn exited_with_error(r: &mut OperatorProcess) -> String {
    let what = format!("{} to exit", r.name);
    let status = eventually(&what, TIMEOUT, || {
        let status = r.exited();
        let tail = r.log_tail();
        async move { status.ok_or(tail) }
    })
    .await;
    assert!(
        !status.success(),
        "{} exited successfully:\n{}",
        r.name,
        r.log_tail()
    );
    std::fs::read_to_string(&r.log).unwrap_or_default()
}

/// Waits until `r` exits with an error naming the live ring beside it.
async fn exits_naming_the_ring(r: &mut OperatorProcess) {
    let log = exited_with_error(r).await;
    assert!(
        log.contains("refusing to run on")
            && log.contains("without --shards beside a running ring"),
        "{}",
        r.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_and_its_standby_both_exit_when_a_ring_comes_alive() {
    let _serial = SERIAL.lock().await;
    let client = shared().client();
    install_crds(&client).await;
    let ns = create_namespace(&client, "ring-elect").await.unwrap();
    let mut a = elected(&ns, "elect-a", "elect-a");
    let mut b = elected(&ns, "elect-b", "elect-b");
    eventually("one leader and one ready standby", TIMEOUT, || async {
        let (la, lb) = (a.is_leader().await, b.is_leader().await);
        let (ra, rb) = (a.ready().await, b.ready().await);
        (ra && rb
            && matches!(
                (la, lb),
                (Some(true), Some(false)) | (Some(false), Some(true))
            ))
        .then_some(())
        .ok_or(format!("leaders {la:?} {lb:?}, ready {ra} {rb}"))
    })
    .await;
    let member = replica(&ns, "elect-member", "elect-member", true);
    // The standby, not only the leader, leaves: restarted, it would wait for the ring to go
    // (staying up, it would never work again).
    exits_naming_the_ring(&mut a).await;
    exits_naming_the_ring(&mut b).await;
    let mut member = member;
    wait_working(&mut member).await;
}
