//! Leader election against the real control plane, two electors in one process: only one
//! leads, the standby's fenced client cannot write, and the standby takes over when the leader
//! releases the Lease or crashes (never before the crashed leader's fence closed); a stolen
//! Lease stops the leader and closes its fence. Short timings (a 4 s lease) keep it quick.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::namespace;
use idem_runtime::leader::{Fence, FenceError, LeaderElection, LeaderError, Leadership};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

const LEASE: &str = "runtime-test";
const TIMEOUT: Duration = Duration::from_secs(90);

fn election(ns: &str, identity: &str) -> LeaderElection {
    let mut e = LeaderElection::new(LEASE, ns, identity);
    e.lease_duration = Duration::from_secs(4);
    e.renew_deadline = Duration::from_secs(3);
    e.retry_period = Duration::from_millis(500);
    e.clock_skew = Duration::from_secs(1);
    e
}

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Starts `a` and `b` and returns them as `(leader, standby)` once one of them leads.
async fn one_leads(client: &Client, ns: &str) -> (Leadership, Leadership) {
    let a = election(ns, "replica-a").start(client.clone()).unwrap();
    let b = election(ns, "replica-b").start(client.clone()).unwrap();
    let a_won = within("a leader", async {
        tokio::select! {
            r = a.acquired() => { r.unwrap(); true }
            r = b.acquired() => { r.unwrap(); false }
        }
    })
    .await;
    if a_won { (a, b) } else { (b, a) }
}

async fn lease(client: &Client, ns: &str) -> Lease {
    Api::<Lease>::namespaced(client.clone(), ns)
        .get(LEASE)
        .await
        .unwrap()
}

fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref()?.holder_identity.clone()
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
}

/// Creates ConfigMap `name` through `client`; the fence's error when it was refused.
async fn create(client: &Client, ns: &str, name: &str) -> Result<(), String> {
    let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
    match api.create(&PostParams::default(), &config_map(name)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Service(e)) => match e.downcast_ref::<FenceError>() {
            Some(fence @ FenceError::NotLeader { .. }) => Err(fence.to_string()),
            _ => panic!("not a leader-election refusal: {e}"),
        },
        Err(e) => panic!("creating {name}: {e}"),
    }
}

async fn exists(client: &Client, ns: &str, name: &str) -> bool {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .is_some()
}

#[tokio::test]
async fn one_of_two_leads_the_standby_is_fenced_and_takes_over_on_release() {
    let client = idem_tests::shared().client();
    let ns = namespace(&client, "elect").await;
    let (leader, standby) = one_leads(&client, &ns).await;
    let (led, stood) = (leader.fenced(&client), standby.fenced(&client));

    // Only one leads, by its own view, its gauge and the Lease, while the leader renews
    // twice more.
    let first = lease(&client, &ns).await;
    assert_eq!(holder(&first).as_deref(), Some(leader.identity()));
    let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    let mut seen = vec![renewed(&first)];
    within("two renewals", async {
        while seen.len() < 3 {
            let now = lease(&client, &ns).await;
            assert_eq!(holder(&now).as_deref(), Some(leader.identity()));
            assert!(!standby.is_leader(), "both lead");
            if renewed(&now) != *seen.last().unwrap() {
                seen.push(renewed(&now));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(leader.is_leader());
    assert!(leader.fence().is_valid() && !standby.fence().is_valid());

    // The leader's fenced client writes; the standby's is refused before the request is
    // sent, and reads still pass.
    create(&led, &ns, "by-leader").await.unwrap();
    let refused = create(&stood, &ns, "by-standby").await.unwrap_err();
    assert!(refused.contains("holds no valid leader lease"), "{refused}");
    assert!(!exists(&client, &ns, "by-standby").await);
    assert!(
        exists(&stood, &ns, "by-leader").await,
        "reads pass the fence"
    );
    assert_eq!(standby.fence().refused.get(), 1);

    // The leader releases the Lease: the standby takes over at its next round, long before
    // the lease would have expired, and its (same) fenced client now writes.
    let released = Instant::now();
    let old = leader.fence();
    leader.release().await;
    assert!(!old.is_valid(), "a released leader's fence is closed");
    within("the standby to lead", standby.acquired())
        .await
        .unwrap();
    eprintln!("taken over {:?} after the release", released.elapsed());
    assert_eq!(
        holder(&lease(&client, &ns).await).as_deref(),
        Some(standby.identity())
    );
    create(&stood, &ns, "by-new-leader").await.unwrap();
    let refused = create(&led, &ns, "by-old-leader").await.unwrap_err();
    assert!(refused.contains("leader lease"), "{refused}");
    standby.release().await;
}

/// Another holder takes the Lease for an hour (what a replica that wrongly thinks it expired,
/// or an admin, does).
async fn steal(client: &Client, ns: &str) {
    let leases = Api::<Lease>::namespaced(client.clone(), ns);
    let mut lease = leases.get(LEASE).await.unwrap();
    let spec = lease.spec.get_or_insert_default();
    spec.holder_identity = Some("intruder".into());
    spec.lease_duration_seconds = Some(3600);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    leases
        .replace(LEASE, &PostParams::default(), &lease)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_crashed_leader_is_replaced_after_its_fence_closed_and_a_stolen_lease_stops_the_leader() {
    let client = idem_tests::shared().client();
    let ns = namespace(&client, "elect-crash").await;
    let (leader, standby) = one_leads(&client, &ns).await;
    let config = election(&ns, "x");

    // The leader crashes (its loop stops, nothing is released): the standby waits for the
    // lease to expire by its own clock, and by then the crashed leader's fence is closed.
    let crashed: Arc<Fence> = leader.fence();
    let crashed_client = leader.fenced(&client);
    drop(leader);
    let dropped = Instant::now();
    within("the standby to lead", standby.acquired())
        .await
        .unwrap();
    let took = dropped.elapsed();
    eprintln!("taken over {took:?} after the crash");
    assert!(
        !crashed.is_valid(),
        "two fences open at once: the standby took over before the crashed leader's fence closed"
    );
    assert!(
        took >= config.lease_duration - 2 * config.retry_period,
        "taken over after {took:?}, before the lease could have expired"
    );
    assert!(create(&crashed_client, &ns, "by-crashed").await.is_err());
    let led = standby.fenced(&client);
    create(&led, &ns, "by-survivor").await.unwrap();

    // The Lease is stolen: the leader notices within about a retry period, closes its fence
    // and stops the work it ran while leading.
    let work = standby.while_leading(std::future::pending::<()>());
    steal(&client, &ns).await;
    let lost = within("the stolen Lease noticed", work).await;
    assert!(matches!(lost, Err(LeaderError::Lost { .. })), "{lost:?}");
    assert!(!standby.is_leader());
    assert!(!standby.fence().is_valid());
    let refused = create(&led, &ns, "after-theft").await.unwrap_err();
    assert!(refused.contains("leader lease"), "{refused}");
    assert!(!exists(&client, &ns, "after-theft").await);
    assert!(
        standby.acquired().await.is_err(),
        "a lost leadership is final"
    );
}

/// An administrator edits the held Lease's `leaseDurationSeconds` down to 1: the standby
/// still waits the lease duration it was configured with before it takes the Lease, so it
/// never leads while the leader renews (here every 2.5 s: the edited record stands unchanged
/// for over 2 s, four of the standby's rounds).
#[tokio::test]
async fn a_lease_edited_to_a_short_duration_does_not_let_the_standby_take_over() {
    let client = idem_tests::shared().client();
    let ns = namespace(&client, "elect-edit").await;
    let mut slow = election(&ns, "replica-a");
    slow.retry_period = Duration::from_millis(2500);
    slow.renew_deadline = Duration::from_millis(3500);
    let leader = slow.start(client.clone()).unwrap();
    within("a leader", leader.acquired()).await.unwrap();
    let standby = election(&ns, "replica-b").start(client.clone()).unwrap();
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let until = Instant::now() + Duration::from_secs(6);
    let mut edits = 0;
    while Instant::now() < until {
        // After each renewal (the holder's, with its duration), the duration cut to 1 s.
        let mut l = lease(&client, &ns).await;
        let spec = l.spec.get_or_insert_with(Default::default);
        if spec.lease_duration_seconds != Some(1) {
            spec.lease_duration_seconds = Some(1);
            if leases
                .replace(LEASE, &PostParams::default(), &l)
                .await
                .is_ok()
            {
                edits += 1;
            }
        }
        assert!(!standby.is_leader(), "the standby took an edited Lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(edits >= 2, "edited {edits} times");
    assert!(leader.is_leader() && !standby.is_leader());
    assert_eq!(
        holder(&lease(&client, &ns).await).as_deref(),
        Some(leader.identity())
    );
    leader.release().await;
    standby.release().await;
}

#[tokio::test]
async fn two_processes_given_one_identity_do_not_both_lead() {
    let client = idem_tests::shared().client();
    let ns = namespace(&client, "twins").await;
    let first = election(&ns, "twin").start(client.clone()).unwrap();
    within("the first to lead", first.acquired()).await.unwrap();
    let second = election(&ns, "twin").start(client.clone()).unwrap();

    // The same identity in the Lease, but not the second's process: it waits as for any other
    // holder while the first renews, past a whole lease duration (4 s; a renewal every 0.5 s).
    let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    let mut seen = vec![renewed(&lease(&client, &ns).await)];
    within("eleven renewals", async {
        while seen.len() < 12 {
            let now = lease(&client, &ns).await;
            assert!(!second.is_leader(), "both lead");
            assert!(first.is_leader(), "the first lost the Lease");
            if renewed(&now) != *seen.last().unwrap() {
                seen.push(renewed(&now));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(first.fence().is_valid() && !second.fence().is_valid());

    // The first releases the Lease: the second takes it over.
    first.release().await;
    within("the second to lead", second.acquired())
        .await
        .unwrap();
    second.release().await;
}
