//! The shard ring under a slow API server, on the real control plane: three members, one of
//! them seeing every Lease request delayed by seconds (less than the lease duration, more
//! than a round), keeps its place in the ring: no member hands over, every member keeps
//! working on the ring of three, and the slow member's Lease goes on being renewed for longer
//! than a lease duration. And no two members ever have an open fence on a common bucket:
//! not when someone else deletes or edits a member's Lease, nor when a second process of one
//! identity starts beside a stalled first. The test plays the manager's part of a handover
//! ([`Membership::stopped`] when told to stop), as idem-runtime's manager does.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::shard::Ring;
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

/// A Lease client of the shared control plane through `faults`' layer, built where it is
/// called.
fn through(faults: &Faults) -> impl FnOnce() -> kube::Client + Send + 'static {
    let (faults, config) = (faults.clone(), shared().config());
    move || {
        faults
            .client(config)
            .expect("a client with the fault layer")
    }
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
    let slow = through(&faults);
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

// No object is written by two replicas at once: members' shares with an open fence never
// overlap, whatever others do to their Leases.

/// Whether `m` works on a ring (not refused) with its write fence open, and that ring.
fn writing(m: &Member) -> Option<Ring> {
    let a = m.membership.assignments().borrow().clone();
    match a.ring {
        Some(r) if a.refused.is_none() && m.membership.fence().is_valid() => Some(r),
        _ => None,
    }
}

/// Whether two writing members' shares overlap (an object both may write at this instant).
fn overlap(x: &Member, y: &Member) -> Option<String> {
    let (rx, ry) = (writing(x)?, writing(y)?);
    let (sx, sy) = (rx.ranges_of(x.identity), ry.ranges_of(y.identity));
    let both: Vec<usize> = sx
        .buckets()
        .filter(|b| sy.buckets().any(|c| c == *b))
        .collect();
    (!both.is_empty()).then(|| {
        format!(
            "{} (ring {:?}) and {} (ring {:?}) both have an open fence on {} common buckets",
            x.identity,
            rx.members(),
            y.identity,
            ry.members(),
            both.len()
        )
    })
}

/// Waits until the Lease `name` changes (its holder renewed it) and returns at once.
async fn just_renewed(leases: &Api<Lease>, name: &str) {
    let first = leases.get(name).await.unwrap().metadata.resource_version;
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if let Ok(Some(l)) = leases.get_opt(name).await
            && l.metadata.resource_version != first
        {
            return;
        }
    }
}

/// Someone else (an admin cleaning Leases) deletes the member Lease of c right after c
/// renewed it. c's fence, extended from its own renewals, stays open for up to a lease
/// duration: a keeps c in the ring that long (c recreates its Lease at its next renewal), and
/// never works on c's share while c may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_lease_deleted_by_someone_else_gives_no_second_writer() {
    tampered_lease("deleted", |leases, name| async move {
        leases.delete(&name, &Default::default()).await.map(|_| ())
    })
    .await;
}

/// Two processes with the same identity: a1's Lease requests stall (a dead connection, a
/// paused renewal loop) just after a good round, for longer than a round may wait
/// (`LEASE_DURATION − CLOCK_SKEW`): its renewals never land and its fence closes. a2, started
/// with the same identity, waits a whole lease duration without a renewal before it takes the
/// Lease over: it never works beside a1, and works once a1's fence has closed; a1, its
/// requests flowing again, finds its Lease taken and refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_the_same_identity_waits_for_a_stalled_first() {
    same_identity(Duration::from_secs(12), Second::TakesOver, false).await;
}

/// The same, but a1's requests are only slow: each lands within a round's wait
/// (`LEASE_DURATION − CLOCK_SKEW`), so a1 is alive and keeps its fence. a2 sees a1's Lease
/// renewed while it looks and refuses, never working beside a1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_the_same_identity_refuses_beside_a_slow_first() {
    same_identity(Duration::from_secs(9), Second::Refuses, false).await;
}

/// What the second process of an identity must end up doing.
#[derive(PartialEq)]
enum Second {
    TakesOver,
    Refuses,
}

/// a1 and b work on the ring of two; every Lease request of a1 then waits `latency` before it
/// is sent (and with `delete`, someone deletes a1's Lease), and a2 starts with a1's identity. For 20 s no two fences may be open on a common
/// bucket; then, the requests flowing again, a2 and a1 end as `second` says.
async fn same_identity(latency: Duration, second: Second, delete: bool) {
    let client = shared().client();
    let ns = create_namespace(&client, "ring").await.unwrap();
    let ring = unique_name("dup-ring");
    let faults = Faults::new();
    let slow = through(&faults);
    let a1 = Member::start(slow, &ring, &ns, "ring-a");
    let b = Member::start(plain(), &ring, &ns, "ring-b");
    eventually("both working on the ring of two", || async {
        a1.working(2)?;
        b.working(2)
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let a_lease = lease_name(&ring, "ring-a");
    just_renewed(&leases, &a_lease).await;
    faults.latency(latency);
    if delete {
        leases
            .delete(&a_lease, &Default::default())
            .await
            .expect("deleting a1's Lease");
    }
    let a2 = Member::start(plain(), &ring, &ns, "ring-a");
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        if let Some(why) = overlap(&a1, &a2) {
            panic!(
                "{:?} after a2 started: two processes of identity ring-a write: {why}",
                started.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    faults.clear();
    let refused = |m: &Member| m.membership.assignments().borrow().refused.is_some();
    match second {
        Second::TakesOver => {
            eventually("a2 working beside b, a1 refusing", || async {
                a2.working(2)?;
                b.working(2)?;
                refused(&a1)
                    .then_some(())
                    .ok_or("a1 does not refuse".to_string())
            })
            .await;
        }
        Second::Refuses => {
            eventually("a1 working beside b, a2 refusing", || async {
                a1.working(2)?;
                b.working(2)?;
                refused(&a2)
                    .then_some(())
                    .ok_or("a2 does not refuse".to_string())
            })
            .await;
        }
    }
}

/// The same as a stalled first process, and someone also deletes its Lease right after it
/// stalled: a2 finds no Lease at start. A Lease deleted under a live holder looks like none at
/// all, so a2 waits a lease duration all the same and never works beside a1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_finding_no_lease_waits_for_a_stalled_first() {
    same_identity(Duration::from_secs(12), Second::TakesOver, true).await;
}

/// A replica leaving the ring says so only once its writes in flight ended: a write sent
/// through a client fenced by a's membership, slow on its way, has ended before b works on
/// a's share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_member_says_it_left_only_after_its_writes_in_flight() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let client = shared().client();
    let ns = create_namespace(&client, "ring").await.unwrap();
    let ring = unique_name("leave-ring");
    let a = Member::start(plain(), &ring, &ns, "ring-a");
    let b = Member::start(plain(), &ring, &ns, "ring-b");
    eventually("both working on the ring of two", || async {
        a.working(2)?;
        b.working(2)
    })
    .await;
    // a's writes: a client whose requests wait 5 s before they are sent, fenced by a's ring.
    let faults = Faults::new();
    faults.latency(Duration::from_secs(5));
    let fence = a.membership.fence();
    let writer = fence.wrap(&through(&faults)());
    let cms: Api<ConfigMap> = Api::namespaced(writer, &ns);
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "written-by-a"}
    }))
    .unwrap();
    let write = tokio::spawn(async move { cms.create(&Default::default(), &cm).await });
    eventually("a's write let through", || async {
        (fence.writes_in_flight() == 1)
            .then_some(())
            .ok_or("not in flight".to_string())
    })
    .await;
    a.manager.abort();
    let _ = a.manager.await;
    let membership = Arc::try_unwrap(a.membership).ok().expect("one owner");
    let leaving = tokio::spawn(membership.leave());
    let took_over = async {
        loop {
            let in_flight = fence.writes_in_flight() > 0;
            if b.working(1).is_ok() {
                assert!(
                    !in_flight,
                    "b works on a's share while a's write is in flight"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), took_over)
        .await
        .expect("b works on the ring of one");
    write
        .await
        .unwrap()
        .expect("a's write created its ConfigMap");
    leaving.await.unwrap();
}

/// The same with an edit instead of a deletion: someone sets c's `leaseDurationSeconds` to 1
/// (what client-go's release writes). a counts c as a member for the lease duration every
/// replica writes, as c's fence is extended by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_lease_edited_by_someone_else_gives_no_second_writer() {
    use kube::api::{Patch, PatchParams};
    tampered_lease("edited", |leases, name| async move {
        let patch = serde_json::json!({"spec": {"leaseDurationSeconds": 1}});
        let params = PatchParams::default();
        leases
            .patch(&name, &params, &Patch::Merge(&patch))
            .await
            .map(|_| ())
    })
    .await;
}

/// a and c work on the ring of two; three times, right after c renewed its Lease, `tamper`
/// does something to it (`what`), and for 6 s a and c never have an open fence on a common
/// bucket.
async fn tampered_lease<F, Fut>(what: &str, tamper: F)
where
    F: Fn(Api<Lease>, String) -> Fut,
    Fut: Future<Output = Result<(), kube::Error>>,
{
    let client = shared().client();
    let ns = create_namespace(&client, "ring").await.unwrap();
    let ring = unique_name("tamper-ring");
    let a = Member::start(plain(), &ring, &ns, "ring-a");
    let c = Member::start(plain(), &ring, &ns, "ring-c");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let c_lease = lease_name(&ring, "ring-c");
    for trial in 0..3 {
        eventually("both working on the ring of two", || async {
            a.working(2)?;
            c.working(2)
        })
        .await;
        just_renewed(&leases, &c_lease).await;
        tamper(leases.clone(), c_lease.clone())
            .await
            .unwrap_or_else(|e| panic!("c's Lease not {what}: {e}"));
        let done = std::time::Instant::now();
        while done.elapsed() < Duration::from_secs(6) {
            if let Some(why) = overlap(&a, &c) {
                panic!(
                    "trial {trial}, {:?} after c's Lease was {what}: two writers: {why}",
                    done.elapsed()
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        println!("trial {trial}: no overlap seen");
    }
}

/// A replica started without `--shards` beside a live ring: its guard's first list of the
/// member Leases fails once (a 500, a 429 at start-up). That tells nothing: the guard lists
/// again and finds the ring live, so the manager never starts beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_whose_first_list_fails_still_finds_a_live_ring() {
    use idem_runtime::shard::guard;
    use idem_tests::faults::Schedule;
    let client = shared().client();
    let ns = create_namespace(&client, "ring").await.unwrap();
    let ring = unique_name("guard-ring");
    let a = Member::start(plain(), &ring, &ns, "ring-a");
    eventually("a working on the ring of one", || async { a.working(1) }).await;
    let faults = Faults::new();
    faults.server_errors(Schedule::Next(1));
    let guard_client = faults.client(shared().config()).unwrap();
    let mut seen = guard::start(guard_client, &ns, &ring);
    let first = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let r = seen.borrow_and_update().clone();
            if r != guard::Ring::Unknown {
                return r;
            }
            seen.changed().await.unwrap();
        }
    })
    .await
    .expect("the guard decided");
    assert!(
        matches!(first, guard::Ring::Live(_)),
        "the guard said {first:?} while ring-a works on the ring"
    );
}

/// A replica that joins beside the Lease of a member that died (its Lease never changes
/// again) counts it dead by its first round: it watched the Lease unchanged for the lease
/// duration it waits before joining. It never works on a ring with the dead member (which
/// would keep every live member waiting for that member's acknowledgement for a lease
/// duration more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_replica_counts_a_lease_unchanged_while_it_waited_as_dead() {
    use idem_runtime::shard::membership::MEMBER_LABEL;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use kube::api::PostParams;
    let client = shared().client();
    let ns = create_namespace(&client, "ring").await.unwrap();
    let ring = unique_name("dead-ring");
    // The Lease a member left when it was killed: renewed just now, never again.
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let dead = Lease {
        metadata: ObjectMeta {
            name: Some(lease_name(&ring, "ring-dead")),
            labels: Some([(MEMBER_LABEL.to_owned(), ring.clone())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("ring-dead".into()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    leases
        .create(&PostParams::default(), &dead)
        .await
        .expect("creating the dead member's Lease");
    let a = Member::start(plain(), &ring, &ns, "ring-a");
    let mut most = 0;
    let started = std::time::Instant::now();
    loop {
        most = most.max(a.metrics.members.get());
        if a.working(1).is_ok() {
            break;
        }
        assert!(
            started.elapsed() < 4 * LEASE_DURATION,
            "ring-a never worked alone: {:?}",
            a.working(1)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        most, 1,
        "ring-a counted the dead member's Lease, unchanged since before it started, as live"
    );
    a.manager.abort();
}

/// A replica whose member Lease requests the API server refuses (403: here RBAC lets it do
/// nothing, then read Leases, not write them) says why in its assignment (`blocked`; the
/// manager is not ready meanwhile) instead of counting as a standby, and joins once it may
/// write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_may_not_write_its_lease_is_blocked_until_it_may() {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::api::PostParams;
    let client = shared().client();
    let ns = create_namespace(&client, "ring").await.unwrap();
    let ring = unique_name("blocked-ring");
    let user = unique_name("lease-reader");
    let grant = |name: &str, verbs: &[&str]| {
        let (client, ns, user, name) = (client.clone(), ns.clone(), user.clone(), name.to_owned());
        let verbs: Vec<String> = verbs.iter().map(|v| v.to_string()).collect();
        async move {
            let meta = ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            };
            let role = Role {
                metadata: meta.clone(),
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec!["coordination.k8s.io".into()]),
                    resources: Some(vec!["leases".into()]),
                    verbs,
                    ..PolicyRule::default()
                }]),
            };
            Api::<Role>::namespaced(client.clone(), &ns)
                .create(&PostParams::default(), &role)
                .await
                .expect("creating the Role");
            let binding = RoleBinding {
                metadata: meta,
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name,
                },
                subjects: Some(vec![Subject {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "User".into(),
                    name: user,
                    ..Subject::default()
                }]),
            };
            Api::<RoleBinding>::namespaced(client, &ns)
                .create(&PostParams::default(), &binding)
                .await
                .expect("creating the RoleBinding");
        }
    };
    let as_user = {
        let (config, user) = (shared().config(), user.clone());
        move || {
            let mut config = config;
            config.auth_info.impersonate = Some(user);
            kube::Client::try_from(config).expect("a client")
        }
    };
    let a = Member::start(as_user, &ring, &ns, "ring-a");
    let blocked = |verb: &'static str| {
        let a = &a;
        move || async move {
            let assignment = a.membership.assignments().borrow().clone();
            match &assignment.blocked {
                Some(why) if why.contains(verb) && assignment.ring.is_none() => Ok(()),
                _ => Err(format!("{assignment:?}")),
            }
        }
    };
    eventually(
        "ring-a blocked: it may not read its Lease",
        blocked("cannot get"),
    )
    .await;
    grant("lease-reader", &["get", "list", "watch"]).await;
    eventually(
        "ring-a blocked: it may not write its Lease",
        blocked("cannot create"),
    )
    .await;
    assert_eq!(a.metrics.working.get(), 0);
    grant("lease-writer", &["create", "update", "patch", "delete"]).await;
    eventually("ring-a working once it may write its Lease", || async {
        a.working(1)?;
        match a.membership.assignments().borrow().blocked.clone() {
            None => Ok(()),
            Some(why) => Err(format!("still blocked: {why}")),
        }
    })
    .await;
    a.manager.abort();
}
