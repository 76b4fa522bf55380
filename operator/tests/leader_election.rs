//! Leader election on the real control plane with two operator processes run as the
//! generated Deployment runs them, with `--leader-elect` in place of its `--shards=auto`: both replicas are Ready (readiness does not depend on
//! leadership, so the Deployment is Available and a rolling update can proceed), exactly one
//! leads and reconciles, and when the leader dies without releasing the Lease the standby
//! takes over once it expires.

mod common;

use std::time::Duration;

use common::process::OperatorProcess;
use common::tenants::{self, full_spec};
use common::{eventually, install_crds};
use idem_operator::NAME as LEASE_NAME;

/// The Lease's `leaseDurationSeconds` every replica writes.
const LEASE_SECONDS: u64 = idem_runtime::leader::DEFAULT_LEASE_DURATION.as_secs();
use idem_tests::{create_namespace, shared, unique_name};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use nix::sys::signal::Signal;

async fn holder(client: &kube::Client, ns: &str) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(LEASE_NAME)
        .await
        .ok()??;
    lease.spec?.holder_identity
}

/// Waits until both replicas are Ready and exactly one is the leader (by its own metric and
/// by the Lease); returns `(leader, standby)` indices.
async fn both_ready_one_leader(
    client: &kube::Client,
    ns: &str,
    replicas: &mut [OperatorProcess; 2],
) -> (usize, usize) {
    let deadline = tokio::time::Instant::now() + common::TIMEOUT;
    loop {
        for r in replicas.iter_mut() {
            if let Some(status) = r.exited() {
                panic!("{} exited ({status}):\n{}", r.name, r.log_tail());
            }
        }
        let mut state = Vec::new();
        for r in replicas.iter() {
            state.push((r.ready().await, r.is_leader().await));
        }
        let holder = holder(client, ns).await;
        let leaders: Vec<usize> = (0..2).filter(|&i| state[i].1 == Some(true)).collect();
        if let ([(true, Some(_)), (true, Some(_))], [l]) = (&state[..], &leaders[..])
            && holder.as_deref() == Some(replicas[*l].name.as_str())
        {
            return (*l, 1 - *l);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not both Ready with one leader: (ready, leader) {state:?}, Lease holder {holder:?}"
        );
        tokio::time::sleep(common::POLL).await;
    }
}

/// Waits until `replica` has counted a finished Tenant reconcile.
async fn reconciled(replica: &OperatorProcess, who: &str) {
    eventually(
        &format!("{who} to count a Tenant reconcile"),
        common::TIMEOUT,
        || async {
            match replica.reconciles("tenant").await {
                0 => Err(format!("{} counts none", replica.name)),
                _ => Ok(()),
            }
        },
    )
    .await;
}

#[tokio::test]
async fn two_replicas_are_ready_one_leads_and_the_standby_takes_over() {
    let client = shared().client();
    install_crds(&client).await;
    let ns = create_namespace(&client, "lease").await.unwrap();

    let mut replicas = [
        OperatorProcess::spawn_leader_elect(&ns, "idem-operator-a"),
        OperatorProcess::spawn_leader_elect(&ns, "idem-operator-b"),
    ];
    let (leader, standby) = both_ready_one_leader(&client, &ns, &mut replicas).await;

    let first = unique_name("led-a");
    tenants::create(&client, &first, full_spec(&["x"])).await;
    tenants::wait_ready(&client, &first).await;
    // A reconcile writes the status before it returns and is counted: wait for the count.
    reconciled(&replicas[leader], "the leader").await;
    assert_eq!(
        replicas[standby].reconciles("tenant").await,
        0,
        "the standby reconciled"
    );
    assert!(
        replicas[standby].ready().await,
        "the standby stays Ready while the leader works"
    );

    // The leader dies without releasing the Lease; the standby takes over after it expires.
    replicas[leader].signal(Signal::SIGKILL);
    let second = unique_name("led-b");
    tenants::create(&client, &second, full_spec(&["y"])).await;
    let new_leader = replicas[standby].name.clone();
    let deadline = Duration::from_secs(LEASE_SECONDS * 4 + 30);
    eventually("the standby to hold the Lease", deadline, || async {
        match holder(&client, &ns).await {
            Some(h) if h == new_leader => Ok(()),
            other => Err(format!("holder {other:?}")),
        }
    })
    .await;
    tenants::wait_ready(&client, &second).await;
    reconciled(&replicas[standby], "the new leader").await;
    assert!(replicas[standby].ready().await);
}
