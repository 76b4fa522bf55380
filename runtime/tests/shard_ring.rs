//! The shard ring under a slow API server, on the real control plane: three members, one of
//! them seeing every Lease request delayed by seconds (less than the lease duration, more
//! than a round), keeps its place in the ring: no member hands over, every member keeps
//! working on the ring of three, and the slow member's Lease goes on being renewed for longer
//! than a lease duration. The test plays the manager's part of a handover
//! ([`Membership::stopped`] when told to stop), as idem-runtime's manager does.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::shard::membership::{Membership, MembershipMetrics, lease_name};
use idem_tests::faults::Faults;
use idem_tests::{create_namespace, eventually, shared, unique_name};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Api;

/// The lease duration every member writes (`leaseDurationSeconds`).
const LEASE_DURATION: Duration = idem_runtime::leader::DEFAULT_LEASE_DURATION;
/// How long each of the slow member's Lease requests waits before it is sent: more than a
/// round ([`idem_runtime::leader::DEFAULT_RETRY_PERIOD`]), less than the lease duration, and
/// short enough that a renewal and the list after it are answered within the renewal
/// deadline (its write fence stays usable).
const LATENCY: Duration = Duration::from_secs(3);
/// A longer delay, still less than the lease duration: a renewal and a list take more than
/// the renewal deadline together, so the slow member's fence runs out, but its renewals
/// still land often enough that no member drops it.
const LONG_LATENCY: Duration = Duration::from_secs(8);

/// One member of the ring and what the test reads of it.
struct Member {
    identity: &'static str,
    membership: Arc<Membership>,
    metrics: MembershipMetrics,
    manager: tokio::task::JoinHandle<()>,
}

impl Member {
    /// Joins ring `ring` in `namespace` with the client `make_client` builds (on the
    /// membership's own runtime) and plays its manager: every assignment without a ring is
    /// reported stopped at once (nothing runs here).
    fn start(
        make_client: impl FnOnce() -> kube::Client + Send + 'static,
        ring: &str,
        namespace: &str,
        identity: &'static str,
    ) -> Self {
        let metrics = MembershipMetrics::default();
        let membership = Arc::new(Membership::start_with(
            make_client,
            ring,
            namespace,
            identity,
            metrics.clone(),
        ));
        let manager = tokio::spawn({
            let membership = Arc::clone(&membership);
            async move {
                let mut rx = membership.assignments();
                loop {
                    let a = rx.borrow_and_update().clone();
                    if a.ring.is_none() {
                        membership.stopped(a.seq);
                    }
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            }
        });
        Self {
            identity,
            membership,
            metrics,
            manager,
        }
    }

    /// `Ok` when it works on a ring of `members`.
    fn working(&self, members: i64) -> Result<(), String> {
        let (working, seen) = (self.metrics.working.get(), self.metrics.members.get());
        let ring = self.membership.assignments().borrow().ring.clone();
        match ring {
            Some(r) if working == 1 && seen == members && r.members().len() as i64 == members => {
                Ok(())
            }
            _ => Err(format!(
                "{}: working {working}, members {seen}",
                self.identity
            )),
        }
    }
}

/// `Err` until every Lease of `names` shows a renewal sent at or after `until`; panics as soon
/// as a member handed over since `handovers` were read or works on a ring other than the
/// ring of three.
async fn steady(
    members: &[Member],
    handovers: &[u64],
    leases: &Api<Lease>,
    names: &[String],
    until: Timestamp,
) -> Result<(), String> {
    for (m, before) in members.iter().zip(handovers) {
        assert_eq!(
            m.metrics.handovers.get(),
            *before,
            "{} handed over while the ring should have stayed as it was",
            m.identity
        );
        if let Err(why) = m.working(3) {
            panic!("the ring changed: {why}");
        }
    }
    for name in names {
        let lease = leases
            .get(name)
            .await
            .map_err(|e| format!("reading Lease {name}: {e}"))?;
        let renewed = lease
            .spec
            .and_then(|s| s.renew_time)
            .map(|t| t.0)
            .ok_or("no renewTime")?;
        if renewed < until {
            return Err(format!(
                "Lease {name} last renewed at {renewed}, waiting for {until}"
            ));
        }
    }
    Ok(())
}

/// The members' loops run on threads of their own: while the runtime that started them
/// (this test's only thread, as a manager's runtime busy with reconciles) is blocked for
/// longer than a lease duration, every member goes on renewing and none hands over.
/// A plain Lease client of the shared control plane, built where it is called.
fn plain() -> impl FnOnce() -> kube::Client + Send + 'static {
    let config = shared().config();
    move || kube::Client::try_from(config).expect("a client")
}

/// Members `ring-a` (its Lease client built by `first`), `ring-b` and `ring-c` of `ring`,
/// once all three work on the ring of three.
async fn ring_of_three(
    first: impl FnOnce() -> kube::Client + Send + 'static,
    ring: &str,
    ns: &str,
) -> [Member; 3] {
    let members = [
        Member::start(first, ring, ns, "ring-a"),
        Member::start(plain(), ring, ns, "ring-b"),
        Member::start(plain(), ring, ns, "ring-c"),
    ];
    eventually("every member working on the ring of three", || async {
        members.iter().try_for_each(|m| m.working(3))
    })
    .await;
    members
}

#[tokio::test(flavor = "current_thread")]
async fn a_blocked_caller_runtime_does_not_stop_the_renewals() {
    let client = shared().client();
    let ns = create_namespace(&client, "ring").await.unwrap();
    let ring = unique_name("busy-ring");
    let members = ring_of_three(plain(), &ring, &ns).await;
    let handovers: Vec<u64> = members.iter().map(|m| m.metrics.handovers.get()).collect();
    let names: Vec<String> = members
        .iter()
        .map(|m| lease_name(&ring, m.identity))
        .collect();
    let until = Timestamp::now() + (LEASE_DURATION + Duration::from_secs(5));
    // This runtime's only thread blocks until another thread, with a runtime and a client of
    // its own, sees every Lease renewed a lease duration after the block began.
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the observer");
                runtime.block_on(async {
                    let leases: Api<Lease> = Api::namespaced(plain()(), &ns);
                    eventually(
                        "every Lease renewed a lease duration into the block",
                        || steady(&members, &handovers, &leases, &names, until),
                    )
                    .await;
                });
            })
            .join()
            .expect("the observer thread");
    });
    for m in members {
        m.manager.abort();
        let _ = m.manager.await;
        if let Ok(membership) = Arc::try_unwrap(m.membership) {
            membership.leave().await;
        }
    }
    // Leaving deleted every member's Lease.
    let leases: Api<Lease> = Api::namespaced(client, &ns);
    for name in &names {
        let left = leases.get_opt(name).await.expect("reading a member Lease");
        assert!(left.is_none(), "Lease {name} was not deleted on leave");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_lease_requests_are_slow_stays_in_the_ring() {
    slow_member_stays(LATENCY, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_lease_requests_take_most_of_a_lease_stays_in_the_ring() {
    slow_member_stays(LONG_LATENCY, false).await;
}

/// Three members; once they work on the ring of three, every Lease request of one of them
/// waits `latency` before it is sent. Until its Lease shows a renewal sent more than a lease
/// duration into the slowdown, no member may hand over or leave the ring of three; then, if
/// `fence_usable`, the slow member's write fence must be valid.
async fn slow_member_stays(latency: Duration, fence_usable: bool) {
    let client = shared().client();
    let ns = create_namespace(&client, "ring").await.unwrap();
    let ring = unique_name("slow-ring");
    // Member a's Lease client passes a fault layer that delays its requests when told to.
    let faults = Faults::new();
    let slow = {
        let (faults, config) = (faults.clone(), shared().config());
        move || {
            faults
                .client(config)
                .expect("a client with the fault layer")
        }
    };
    let members = ring_of_three(slow, &ring, &ns).await;
    let handovers: Vec<u64> = members.iter().map(|m| m.metrics.handovers.get()).collect();

    // From now on every Lease request of a waits `latency` before it is sent.
    faults.latency(latency);
    let slowed = Timestamp::now();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let a_lease = lease_name(&ring, "ring-a");
    // Until a's Lease shows a renewal sent more than a lease duration after the slowdown
    // began (so a stretch longer than a lease passed with every request slow), no member may
    // hand over or leave the ring of three.
    let until = slowed + (LEASE_DURATION + Duration::from_secs(5));
    eventually(
        "a's Lease renewed a lease duration into the slowdown",
        || {
            steady(
                &members,
                &handovers,
                &leases,
                std::slice::from_ref(&a_lease),
                until,
            )
        },
    )
    .await;
    let sent = faults.sent();
    println!("a's Lease requests sent slowly: {sent:?}");
    // The slow member's own fence stays usable: it renewed within the renewal deadline.
    assert!(
        !fence_usable || members[0].membership.fence().is_valid(),
        "a's write fence closed although its renewals were answered in time"
    );
    faults.clear();
    for m in members {
        m.manager.abort();
        let _ = m.manager.await;
        if let Ok(membership) = Arc::try_unwrap(m.membership) {
            membership.leave().await;
        }
    }
}
