//! The shard ring's handover on the real control plane: a replica acknowledges a new ring only
//! after every write of the old one has ended. A write let through the member fence just
//! before the ring changes, delayed on its way to the server (an injected latency) and whose
//! caller is cancelled (as a reconcile is at a ring change), is on the server before the
//! replica's Lease acknowledges the new ring. The test plays the manager's part of the
//! handover ([`Membership::stopped`] once the fence is drained), as
//! idem-runtime's manager does after joining the old ring's controllers.

mod common;

use std::time::Duration;

use common::{TIMEOUT, eventually, why};
use idem_runtime::shard::membership::{
    APPLIED_ANNOTATION, Membership, MembershipMetrics, lease_name,
};
use idem_tests::faults::Faults;
use idem_tests::{create_namespace, shared};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};

/// What a manager does for `membership`: reports every assignment without a ring stopped,
/// once `drained` (the old ring's writes ended) resolves.
fn manage(membership: std::sync::Arc<Membership>, drained: bool) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut rx = membership.assignments();
        loop {
            let a = rx.borrow_and_update().clone();
            if a.ring.is_none() {
                if drained {
                    membership.fence().drained().await;
                }
                membership.stopped(a.seq);
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    })
}

fn applied(lease: Option<Lease>) -> Option<String> {
    lease?
        .metadata
        .annotations?
        .get(APPLIED_ANNOTATION)
        .cloned()
        .filter(|v| !v.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_ring_is_acknowledged_only_after_the_old_rings_writes_reached_the_server() {
    let client = shared().client();
    let ns = create_namespace(&client, "handover").await.unwrap();
    let a = std::sync::Arc::new(Membership::start(
        client.clone(),
        idem_operator::NAME,
        &ns,
        "ho-a",
        MembershipMetrics::default(),
    ));
    let _manager_a = manage(std::sync::Arc::clone(&a), true);
    let mut assigned = a.assignments();
    tokio::time::timeout(TIMEOUT, assigned.wait_for(|x| x.ring.is_some()))
        .await
        .expect("a ring of one in time")
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let first = applied(
        leases
            .get_opt(&lease_name(idem_operator::NAME, "ho-a"))
            .await
            .unwrap(),
    )
    .expect("the first ring acknowledged");

    // A write through the member fence, 6 s on its way to the server; its caller cancelled.
    let faults = Faults::new();
    faults.latency(Duration::from_secs(6));
    let slow = a.fence().wrap(&faults.client(shared().config()).unwrap());
    let configmaps: Api<ConfigMap> = Api::namespaced(slow, &ns);
    let cm: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "slow"}})).unwrap();
    let write = tokio::spawn(async move { configmaps.create(&PostParams::default(), &cm).await });
    eventually("the write let through", TIMEOUT, || async {
        (a.fence().writes_in_flight() == 1)
            .then_some(())
            .ok_or_else(|| format!("{} in flight", a.fence().writes_in_flight()))
    })
    .await;
    write.abort();

    // A second member joins: the ring changes.
    let b = std::sync::Arc::new(Membership::start(
        client.clone(),
        idem_operator::NAME,
        &ns,
        "ho-b",
        MembershipMetrics::default(),
    ));
    let _manager_b = manage(std::sync::Arc::clone(&b), false);
    let plain: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let acked = eventually("a's Lease acknowledging the new ring", TIMEOUT, || async {
        let lease = leases
            .get_opt(&lease_name(idem_operator::NAME, "ho-a"))
            .await
            .map_err(why)?;
        match applied(lease) {
            Some(v) if v != first => Ok(v),
            other => Err(format!("applied {other:?}")),
        }
    })
    .await;
    let landed = plain.get_opt("slow").await.unwrap();
    assert!(
        landed.is_some(),
        "ring {acked} acknowledged while a write of the old ring was still on its way"
    );
    // And the handover completes: both work on the new ring.
    for m in [&a, &b] {
        let mut rx = m.assignments();
        tokio::time::timeout(TIMEOUT, rx.wait_for(|x| x.ring.is_some()))
            .await
            .expect("working on the new ring in time")
            .unwrap();
    }
    assert_eq!(a.fence().writes_in_flight(), 0);
}
