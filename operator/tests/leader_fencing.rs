//! A deposed leader does not write, judged by the API server's own request
//! counters. This binary has a control plane of its own and runs one operator process at a
//! time, so every write to the kinds only the operator writes is that process's.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::process::OperatorProcess;
use common::tenants::{self, full_spec, quantities};
use common::{TIMEOUT, install_crds};
use idem_operator::NAME as LEASE_NAME;
use idem_runtime::leader::DEFAULT_LEASE_DURATION as LEASE_DURATION;
use idem_runtime::leader::DEFAULT_RENEW_DEADLINE;
use idem_tests::{create_namespace, shared, unique_name};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use nix::sys::signal::Signal;

/// Write requests (every mutating verb) to what only the operator writes, per
/// `verb group/resource/subresource`, from the API server's `apiserver_request_total`:
/// namespaces, ResourceQuotas, LimitRanges, NetworkPolicies, RoleBindings (no subresource) and
/// the status of Tenants and TenantApps. (The controller-manager writes only subresources of
/// the core kinds; the test writes Leases and Tenants themselves.)
async fn operator_writes() -> BTreeMap<String, u64> {
    let text = shared().metrics().await.expect("the API server's /metrics");
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split("\",")
                .filter_map(|p| p.split_once('='))
                .find(|(key, _)| key.trim() == k)
                .map(|(_, v)| v.trim_matches('"').to_string())
                .unwrap_or_default()
        };
        let (verb, group, resource, sub) = (
            label("verb"),
            label("group"),
            label("resource"),
            label("subresource"),
        );
        if !idem_tests::metrics::WRITE_VERBS.contains(&verb.as_str()) {
            continue;
        }
        let ours = matches!(
            (group.as_str(), resource.as_str(), sub.as_str()),
            ("", "namespaces" | "resourcequotas" | "limitranges", "")
                | ("networking.k8s.io", "networkpolicies", "")
                | ("rbac.authorization.k8s.io", "rolebindings", "")
                | ("tenancy.idem.dev", _, "status")
        );
        if ours {
            let v: f64 = value.trim().parse().unwrap_or(0.0);
            *out.entry(format!("{verb} {group}/{resource}/{sub}"))
                .or_default() += v as u64;
        }
    }
    out
}

/// Another holder takes the Lease: what a replica that wrongly believes the Lease expired, or
/// a standby after a long pause of the leader, does. Valid for an hour.
async fn hijack(client: &kube::Client, ns: &str) {
    let leases = Api::<Lease>::namespaced(client.clone(), ns);
    let mut lease = leases.get(LEASE_NAME).await.expect("the Lease exists");
    let spec = lease.spec.get_or_insert_default();
    spec.holder_identity = Some("intruder".into());
    spec.lease_duration_seconds = Some(3600);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    leases
        .replace(LEASE_NAME, &PostParams::default(), &lease)
        .await
        .expect("hijacking the Lease");
}

async fn start_leader(client: &kube::Client, ns: &str, name: &str) -> OperatorProcess {
    let mut op = OperatorProcess::spawn_leader_elect(ns, name);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while op.is_leader().await != Some(true) {
        if let Some(status) = op.exited() {
            panic!("{name} exited ({status}):\n{}", op.log_tail());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} did not lead"
        );
        tokio::time::sleep(common::POLL).await;
    }
    let holder = Api::<Lease>::namespaced(client.clone(), ns)
        .get(LEASE_NAME)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some(name));
    op
}

/// Waits for the process to exit and returns how long that took from `since`.
async fn wait_exit(op: &mut OperatorProcess, since: Instant) -> Duration {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = op.exited() {
            break status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the deposed leader did not exit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        !status.success(),
        "losing leadership is an error exit: {status}"
    );
    since.elapsed()
}

#[tokio::test]
async fn a_deposed_leader_sends_no_write_after_the_hijack_is_observable() {
    let client = shared().client();
    install_crds(&client).await;
    let ns = create_namespace(&client, "fence").await.unwrap();

    // 1. A leader that was paused (SIGSTOP) for longer than its lease while another holder
    //    took the Lease and the tenants changed: when it resumes, its lease is invalid by its
    //    own clock, so it must not send a single write (the issue saw a stale quota apply, a
    //    create and four status writes), and it must exit.
    let mut op = start_leader(&client, &ns, "idem-operator-a").await;
    let first = unique_name("fence-a");
    tenants::create(&client, &first, full_spec(&["x"])).await;
    tenants::wait_ready(&client, &first).await;

    // More tenants for it to hold in its caches. It is paused once they are all Ready, not in
    // the middle of their writes: a client-side fence checks each write before it is handed to
    // the HTTP connection, so a write checked just before SIGSTOP (e.g. waiting for a new
    // connection's TLS handshake) is sent when the process resumes — an inherent window of the
    // requests already in flight, which no client-side check can close. What must not happen
    // is what the issue saw: work *started* after the pause (the quota change and the new
    // tenant below arrive by watch after the resume) reaching the server.
    let busy: Vec<String> = (0..4)
        .map(|i| unique_name(&format!("fence-busy{i}")))
        .collect();
    for name in &busy {
        tenants::create(&client, name, full_spec(&["p", "q", "r"])).await;
    }
    for name in &busy {
        tenants::wait_ready(&client, name).await;
    }
    op.signal(Signal::SIGSTOP);
    let paused = Instant::now();
    hijack(&client, &ns).await;
    let patch = serde_json::json!({"spec": {"quota": {"hard": quantities(&[("pods", "7")])}}});
    tenants::api(&client)
        .patch(&first, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let second = unique_name("fence-b");
    tenants::create(&client, &second, full_spec(&["y"])).await;
    // The scenario, not a synchronisation: the pause outlasts the lease, as when a standby
    // takes over from a stopped leader.
    tokio::time::sleep(LEASE_DURATION.saturating_sub(paused.elapsed())).await;
    let before = operator_writes().await;
    op.signal(Signal::SIGCONT);
    let resumed = Instant::now();
    wait_exit(&mut op, resumed).await;
    let log = op.log_tail();
    assert_eq!(
        operator_writes().await,
        before,
        "the paused leader wrote after resuming without a valid lease:\n{log}"
    );
    let ns_api = Api::<Namespace>::all(client.clone());
    assert!(
        ns_api
            .get_opt(&format!("{second}-y"))
            .await
            .unwrap()
            .is_none(),
        "the deposed leader created a namespace"
    );

    // 2. A running leader notices a hijacked Lease at its next renewal, about one retry
    //    period, cancels its reconciles and exits; after that, no write. Bounded here by the
    //    renew deadline (what a leader that cannot renew waits at most), which leaves a loaded
    //    machine room for the exit and stays below the lease duration another replica waits.
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    leases
        .delete(LEASE_NAME, &Default::default())
        .await
        .unwrap();
    let mut op = start_leader(&client, &ns, "idem-operator-b").await;
    tenants::wait_ready(&client, &second).await;
    hijack(&client, &ns).await;
    let hijacked = Instant::now();
    // Work the deposed leader would otherwise do.
    let third = unique_name("fence-c");
    tenants::create(&client, &third, full_spec(&["z"])).await;
    let noticed = wait_exit(&mut op, hijacked).await;
    eprintln!("the hijack was noticed (and the process exited) after {noticed:?}");
    assert!(
        noticed < DEFAULT_RENEW_DEADLINE,
        "the hijack was noticed only after {noticed:?} (renew deadline \
         {DEFAULT_RENEW_DEADLINE:?}):\n{}",
        op.log_tail()
    );
    let after_exit = operator_writes().await;
    drop(op);
    assert_eq!(operator_writes().await, after_exit);
}
