//! Ring membership on Leases: every replica renews a Lease of its own, labelled as a member of
//! the ring; the live Leases define the ring, and a replica works on its share of a ring only
//! once every member of that ring has acknowledged it, so no object is worked on by two
//! replicas at once. No leader and no extra component.
//!
//! Each round (every [`RETRY_PERIOD`], counted from the previous round's start) a replica
//! renews its Lease and lists the members' Leases, both at once, and computes the ring of the
//! live ones. The renewal is one request (a replace of the Lease as its last write returned
//! it; only a conflict reads it again), and each waits at most `ROUND_TIMEOUT`, the renewal
//! deadline, so a server that answers slowly but within the lease still renews it: a late
//! renewal is not a departure. A member is live while a list is sent less than
//! [`LEASE_DURATION`] (what every replica writes, whatever its Lease says now) after its Lease
//! last changed, the change dated *on this replica's clock* (client-go's leader-election
//! rule, no cross-node clock comparison; below, how a change is dated). It stays live that
//! long even when its Lease is deleted or edited by someone else meanwhile (an admin, a tool
//! cleaning Leases): its fence, extended from its own renewals, stays open that long. Only its
//! holder's own word ([`LEFT_ANNOTATION`]) ends it sooner, and a Lease counts only for the
//! holder it is named after. A list vouches for the renewal answered before
//! it was sent (the previous round's, or an earlier one), not for the one sent beside it: the
//! members' acknowledgements it shows were read after that renewal was on the server. Then:
//! - ring unchanged, running, and every other member's Lease still acknowledging it: the write
//!   fence is extended to `vouched renewal sent + LEASE_DURATION − CLOCK_SKEW` (as
//!   [`crate::leader`] does for the leader). A round whose renewal or list fails or is late
//!   leaves the controllers running with the fence running out (their writes are refused and
//!   retried with backoff) and the ring as it is: the others keep this replica in the ring
//!   until its Lease really expires, and a slow API server does not make every replica
//!   relist; the next good round resumes, or hands over if a member acknowledges another ring
//!   (it dropped this replica, or it restarted);
//! - ring changed: the fence is revoked at once (no write of this replica passes from then on)
//!   and the controllers are told to stop; once the manager reports them stopped — their
//!   reconciles cancelled, their client refusing every write for good, and every write they
//!   had sent before the fence closed answered, or abandoned when the fence's time ran out
//!   and a margin past ([`Membership::stopped`], [`crate::leader::Fence::drained`]) — the
//!   replica acknowledges the new ring by writing its version in its Lease's
//!   [`APPLIED_ANNOTATION`] (the handshake), so no write of the old ring reaches the server
//!   after the ack (short of one held on the wire past that margin);
//! - stopped: it starts its share of the ring once every live member's Lease carries that
//!   version (and the renewal the list vouches for can still open the fence), polling every
//!   [`HANDSHAKE_POLL`] meanwhile. A member that crashed stops counting once its Lease
//!   expires, and a replica wakes up for that instant rather than at its next round, so its
//!   share is taken over about `LEASE_DURATION` after its last renewal plus one handshake.
//!
//! A member that starts a ring without this replica decided so from a list that did not show
//! this replica's renewal yet, and only once every member of that ring had acknowledged it
//! and its own acknowledgement had been answered before that list was sent (a renewal's
//! answer is remembered with the ring it carried); so a list sent after this replica's
//! renewal was answered shows those acknowledgements, and this replica hands over instead of
//! extending its fence.
//!
//! When a Lease changed since the previous list, the change is placed at the `renewTime` its
//! holder wrote, but clamped into the interval in which this replica knows it happened: after
//! the previous list was sent and at most [`RETRY_PERIOD`] before this list's answer. So a
//! skewed clock moves an expiry by at most one round, and never earlier than `renewal sent +
//! LEASE_DURATION − RETRY_PERIOD`, which is past the dead holder's fence (`renewal sent +
//! LEASE_DURATION − CLOCK_SKEW`, [`CLOCK_SKEW`] > [`RETRY_PERIOD`]): no overlap.
//!
//! The loop runs on a thread of its own with a single-threaded Tokio runtime, its Lease client
//! built there ([`Membership::start_with`]): reconciles keeping the manager's runtime busy
//! do not delay a renewal or a list.
//!
//! A replica that renews its Lease but has not acknowledged a new ring keeps the others
//! waiting; a replica paused past its lease duration finds its fence closed when it wakes and
//! sees the new ring before its next write. On shutdown, once nothing of it writes any more,
//! it writes that it left ([`LEFT_ANNOTATION`]), so the others take over its share at their
//! next round, and deletes its Lease a round later. Leases unchanged for three lease
//! durations are deleted by whichever member notices (guarded by `resourceVersion`).
//!
//! Each process writes an id of its own ([`INSTANCE_ANNOTATION`]) into its Lease. Two
//! processes with the same identity would share one Lease and each work on the same share:
//! a replica that finds its Lease renewed by another process — at start (renewed by another
//! instance while it looks, for a whole lease duration unless that process wrote that it
//! left) or later (another instance's id in it) — refuses to work
//! ([`Assignment::refused`]) and stops renewing, leaving the Lease to the other.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Ring;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{oneshot, watch};

use crate::leader::{
    DEFAULT_CLOCK_SKEW as CLOCK_SKEW, DEFAULT_LEASE_DURATION as LEASE_DURATION,
    DEFAULT_RETRY_PERIOD as RETRY_PERIOD,
};
use crate::leader::{Fence, FenceMode};

mod lease;
mod liveness;

use lease::{Renewal, instance_id};
use liveness::Seen;

/// [`LEASE_DURATION`] in whole seconds, as written to `leaseDurationSeconds`.
const LEASE_SECONDS: u64 = LEASE_DURATION.as_secs();

/// Label of every member Lease; its value names the ring (a manager's name, e.g.
/// `idem-operator`).
pub const MEMBER_LABEL: &str = "tenancy.idem.dev/shard-ring";
/// Annotation of a member Lease: the version ([`Ring::version`]) of the last ring its holder
/// stopped for and acknowledged.
pub const APPLIED_ANNOTATION: &str = "tenancy.idem.dev/applied-ring";
/// Annotation of a member Lease: the id of the process that renews it (one per start).
pub const INSTANCE_ANNOTATION: &str = "tenancy.idem.dev/instance";
/// Annotation of a member Lease: the id of the process that left the ring, written by that
/// process once nothing of it writes any more; equal to [`INSTANCE_ANNOTATION`], the other
/// members drop its holder at once instead of when its last renewal expires.
pub const LEFT_ANNOTATION: &str = "tenancy.idem.dev/left";
/// What follows the ring's name in a member Lease's name (`<ring>-shard-<identity>`).
pub const LEASE_INFIX: &str = "-shard-";
/// Longest wait for one Lease request outside the rounds (reading the Lease at start,
/// deleting it on leave).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for a round's renewal and for its list: the renewal deadline. A renewal
/// answered later would extend the fence to an instant already past
/// (`sent + LEASE_DURATION − CLOCK_SKEW`), but one answered sooner does, however slow the
/// server: giving up earlier and sending it again would only queue it again behind the load
/// that made it slow.
const ROUND_TIMEOUT: Duration = LEASE_DURATION.saturating_sub(CLOCK_SKEW);
/// A non-live Lease unchanged for this many lease durations is deleted.
const GC_AFTER: u32 = 3;
/// How often a replica that is not working (waiting for members to acknowledge a ring) renews
/// and lists: a handshake takes one or two of these rather than of [`RETRY_PERIOD`].
pub const HANDSHAKE_POLL: Duration = Duration::from_millis(500);
/// How long after a member's predicted expiry a replica checks it, so that it has expired.
const EXPIRY_SLACK: Duration = Duration::from_millis(20);

/// Metrics of the membership loop.
#[derive(Clone, Debug, Default)]
pub struct MembershipMetrics {
    /// Live members of the ring this replica last computed.
    pub members: Gauge,
    /// Times this replica stopped working on a ring because membership changed.
    pub handovers: Counter,
    /// 1 while this replica works on an acknowledged ring, 0 while it waits.
    pub working: Gauge,
}

/// The name of `identity`'s member Lease in ring `ring`: `ring` + [`LEASE_INFIX`] + the
/// identity in lower case with characters outside `[a-z0-9.-]` replaced by `-`, cut to the 253
/// characters of a name.
pub fn lease_name(ring: &str, identity: &str) -> String {
    let cleaned: String = identity
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut name = format!("{ring}{LEASE_INFIX}{cleaned}");
    name.truncate(253);
    name.trim_end_matches(['-', '.']).to_string()
}

/// What the membership tells the manager: the ring to work on, or none (stop every
/// controller now), numbered; see [`Membership::stopped`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assignment {
    /// The ring to work on; `None`: stop.
    pub ring: Option<Ring>,
    /// Increases with every new assignment.
    pub seq: u64,
    /// Why this replica must not work at all (another process renews its Lease); then `ring`
    /// is `None` for good.
    pub refused: Option<String>,
    /// Why this replica cannot join the ring for now: the API server refuses its member
    /// Lease requests (403 Forbidden: RBAC or an admission policy; e.g. it does not run as the
    /// ServiceAccount the ring's policy admits). It retries each round and is not ready
    /// meanwhile; `None` once a renewal is answered.
    pub blocked: Option<String>,
}

/// This replica's place in the ring; dropping it stops the loop without deleting the Lease.
///
/// The loop (renewals, lists, handshakes) runs on a thread of its own with a single-threaded
/// Tokio runtime, so work on the caller's runtime (reconciles, caches) cannot delay a renewal.
pub struct Membership {
    assignment: watch::Receiver<Assignment>,
    stopped: watch::Sender<u64>,
    fence: Arc<Fence>,
    /// `true`: leave the ring (delete the Lease); dropped: stop where the loop is.
    stop: watch::Sender<bool>,
    /// Closed once the loop's thread has ended, its runtime and connections gone.
    done: Option<oneshot::Receiver<()>>,
}

impl Membership {
    /// Joins ring `ring` (the value of [`MEMBER_LABEL`]) with a Lease in `namespace` held by
    /// `identity`, its requests sent with `client`.
    ///
    /// `client`'s connections are served by the runtime it was built on, so a busy runtime
    /// can still delay them; [`Membership::start_with`] builds the client on the loop's own
    /// runtime instead.
    ///
    /// # Panics
    /// When the operating system refuses a thread or a Tokio runtime for the loop.
    pub fn start(
        client: Client,
        ring: &str,
        namespace: &str,
        identity: &str,
        metrics: MembershipMetrics,
    ) -> Self {
        Self::start_with(move || client, ring, namespace, identity, metrics)
    }

    /// As [`Membership::start`], with the client built by `make_client` on the loop's own
    /// thread and runtime: its requests and connections wait for nothing on the caller's
    /// runtime (e.g. `move || builder.build()` with a [`kube::client::ClientBuilder`]).
    ///
    /// # Panics
    /// When the operating system refuses a thread or a Tokio runtime for the loop.
    pub fn start_with(
        make_client: impl FnOnce() -> Client + Send + 'static,
        ring: &str,
        namespace: &str,
        identity: &str,
        metrics: MembershipMetrics,
    ) -> Self {
        let fence = Fence::new(FenceMode::ShardMembership);
        let (tx, assignment) = watch::channel(Assignment::default());
        let (stopped, stopped_rx) = watch::channel(0);
        let (stop, stop_rx) = watch::channel(false);
        let (done_tx, done) = oneshot::channel();
        let name = lease_name(ring, identity);
        let namespace = namespace.to_string();
        let (ring, identity) = (ring.to_string(), identity.to_string());
        let loop_fence = Arc::clone(&fence);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a Tokio runtime for the shard ring");
        std::thread::Builder::new()
            .name("idem-shard-ring".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let member = Member {
                        api: Api::<Lease>::namespaced(make_client(), &namespace),
                        ring,
                        name,
                        identity,
                        instance: instance_id(),
                        fence: loop_fence,
                        assignment: tx,
                        stopped: stopped_rx,
                        claimed: false,
                        own: None,
                        metrics,
                        observed: HashMap::new(),
                        members: HashMap::new(),
                        applied: String::new(),
                        running: None,
                        last_renewal: None,
                        renewal_applied: String::new(),
                        round_started: Instant::now(),
                        previous_list: None,
                        next_expiry: None,
                    };
                    member.serve(stop_rx).await;
                });
                // Every task of the loop (the client's connections too) ends here.
                drop(runtime);
                drop(done_tx);
            })
            .expect("a thread for the shard ring");
        Self {
            assignment,
            stopped,
            fence,
            stop,
            done: Some(done),
        }
    }

    /// The write fence: valid only while this replica works on an acknowledged ring and its
    /// Lease is fresh.
    pub fn fence(&self) -> Arc<Fence> {
        Arc::clone(&self.fence)
    }

    /// The ring to work on (`Some`) or none (`None`: stop every controller now).
    pub fn assignments(&self) -> watch::Receiver<Assignment> {
        self.assignment.clone()
    }

    /// The manager reports that nothing handed out up to assignment `seq` runs any more: the
    /// controllers of every ring before it have stopped, their reconciles ended, and no write
    /// they sent is still in flight. Until then the replica does not acknowledge a new ring.
    pub fn stopped(&self, seq: u64) {
        self.stopped.send_if_modified(|s| {
            let newer = seq > *s;
            if newer {
                *s = seq;
            }
            newer
        });
    }

    /// Leaves the ring: stops the loop, closes the fence and deletes this replica's Lease so
    /// the other members take its share over at their next round (not when it refused to
    /// work: the Lease is then another process's). Returns once the loop's thread has ended.
    ///
    /// # Cancel safety
    /// Cancelled, it drops the membership: the loop stops where it is, perhaps before the
    /// Lease is deleted.
    pub async fn leave(mut self) {
        let _ = self.stop.send(true);
        if let Some(done) = self.done.take() {
            // An error only says the thread ended without a word (it always does).
            let _ = done.await;
        }
        self.fence.revoke();
    }
}

/// The state of the membership loop.
struct Member {
    api: Api<Lease>,
    /// The ring's name (the value of [`MEMBER_LABEL`]).
    ring: String,
    name: String,
    identity: String,
    /// This process's id in its Lease ([`INSTANCE_ANNOTATION`]).
    instance: String,
    fence: Arc<Fence>,
    assignment: watch::Sender<Assignment>,
    /// The last assignment whose controllers the manager reports stopped.
    stopped: watch::Receiver<u64>,
    /// Whether this process has written its Lease (and its instance id) once.
    claimed: bool,
    /// This replica's Lease as its last write returned it: the next renewal replaces it at
    /// that resourceVersion in one request (a conflict means someone else wrote it).
    own: Option<Lease>,
    metrics: MembershipMetrics,
    /// Per Lease name: its last resourceVersion and when (this replica's clock) it changed.
    observed: HashMap<String, (Option<String>, Instant)>,
    /// Per member (holder identity): its last renewal seen and its acknowledgement, kept
    /// after its Lease is gone or edited until that renewal expires.
    members: HashMap<String, Seen>,
    /// The ring version this replica acknowledged last.
    applied: String,
    /// The ring version it works on.
    running: Option<String>,
    /// When the last renewal that was answered was sent.
    last_renewal: Option<Instant>,
    /// The ring version that renewal carried as this replica's acknowledgement: a ring is
    /// started only from a list sent after its acknowledgement was on the server.
    renewal_applied: String,
    /// When the current (or last) round started.
    round_started: Instant,
    /// When the previous list of the member Leases was sent.
    previous_list: Option<Instant>,
    /// The earliest instant at which a live member's Lease expires if it is not renewed.
    next_expiry: Option<Instant>,
}

impl Member {
    /// Runs the loop until [`Membership::leave`] (then leaves the ring) or until the
    /// [`Membership`] is dropped (then stops where it is, the Lease kept).
    async fn serve(self, stop: watch::Receiver<bool>) {
        let mut dropped = stop.clone();
        tokio::select! {
            () = self.run_and_leave(stop) => {}
            () = async { while dropped.changed().await.is_ok() {} } => {}
        }
    }

    /// Runs the loop; once told to leave, closes the fence and deletes the Lease (unless this
    /// replica refused to work: the Lease is then another process's).
    async fn run_and_leave(mut self, mut stop: watch::Receiver<bool>) {
        self.run(stop.clone()).await;
        if stop.wait_for(|s| *s).await.is_err() {
            return;
        }
        self.fence.revoke();
        if self.assignment.borrow().refused.is_some() {
            return;
        }
        // Nothing of this replica writes once its writes in flight ended.
        self.fence.drained().await;
        // The others drop this replica at their next round once they read that it left;
        // one that does not read it before the Lease is gone waits for its last renewal to
        // expire instead.
        let marked = tokio::time::timeout(REQUEST_TIMEOUT, self.mark_left()).await;
        let precondition = match marked {
            // Another process's Lease now: not this replica's to delete.
            Ok(Ok(None)) => return,
            Ok(Ok(rv)) => {
                tokio::time::sleep(RETRY_PERIOD + HANDSHAKE_POLL).await;
                Some(Preconditions {
                    resource_version: rv,
                    uid: None,
                })
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not write that this replica left the ring");
                None
            }
            Err(_) => {
                tracing::warn!("writing that this replica left the ring timed out");
                None
            }
        };
        let dp = DeleteParams {
            preconditions: precondition,
            ..DeleteParams::default()
        };
        let deleted = tokio::time::timeout(REQUEST_TIMEOUT, self.api.delete(&self.name, &dp)).await;
        match deleted {
            Ok(Ok(_)) => tracing::info!(lease = %self.name, "left the shard ring"),
            Ok(Err(e)) => tracing::warn!(error = %e, "could not delete the member Lease"),
            Err(_) => tracing::warn!("deleting the member Lease timed out"),
        }
    }

    async fn run(&mut self, mut stop: watch::Receiver<bool>) {
        // The member Leases as they are before the wait below: a Lease first seen counts as
        // just changed, so one that does not change while this replica waits is a dead
        // member's by its first round, not a live member's for a lease duration more.
        let observed = tokio::select! {
            observed = self.observe() => observed,
            _ = stop.wait_for(|s| *s) => return,
        };
        if let Err(e) = observed {
            tracing::warn!(error = %e, "listing the member Leases failed");
        }
        let checked = tokio::select! {
            checked = self.renewed_by_another() => checked,
            _ = stop.wait_for(|s| *s) => return,
        };
        match checked {
            Ok(lease) => self.own = lease,
            Err(why) => {
                self.refuse(why);
                return;
            }
        }
        let mut stopped = self.stopped.clone();
        loop {
            stopped.borrow_and_update();
            if let Err(why) = self.round().await {
                self.refuse(why);
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(self.next_wait()) => {}
                // The manager stopped a ring: acknowledge the next one now.
                Ok(()) = stopped.changed(), if self.running.is_none() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// The wait before the next round: [`HANDSHAKE_POLL`] while not working, else
    /// [`RETRY_PERIOD`] or until just after the next member's Lease expires, if earlier. The
    /// period counts from the start of the round that just ended, so a round slowed by the
    /// server does not also delay the next renewal by a whole period.
    fn next_wait(&self) -> Duration {
        let period = if self.running.is_none() {
            HANDSHAKE_POLL
        } else {
            RETRY_PERIOD
        };
        let wait = period.saturating_sub(self.round_started.elapsed());
        if self.running.is_none() {
            return wait;
        }
        self.next_expiry
            .map(|t| t.saturating_duration_since(Instant::now()) + EXPIRY_SLACK)
            .map_or(wait, |d| d.min(wait))
    }

    /// Stops for good: the fence closes, the controllers stop, and the Lease is left alone.
    fn refuse(&mut self, why: String) {
        self.fence.revoke();
        self.running = None;
        self.metrics.working.set(0);
        tracing::error!(identity = %self.identity, problem = %why,
            "refusing to work on the shard ring: this replica reconciles nothing and exits");
        self.assignment.send_modify(|a| {
            a.ring = None;
            a.seq += 1;
            a.refused = Some(why);
        });
    }

    /// Notes whether the API server refuses this replica's member Lease requests, and why
    /// ([`Assignment::blocked`]); says so once per reason, not every round.
    fn block(&self, why: Option<String>) {
        if self.assignment.borrow().blocked == why {
            return;
        }
        match &why {
            Some(why) => tracing::error!(identity = %self.identity, lease = %self.name,
                problem = %why,
                "the API server refuses this replica's member Lease requests: it cannot join \
                 the shard ring and is not ready (does it run as the ServiceAccount its rbac \
                 objects bind? it tries again every round)"),
            None => tracing::info!(identity = %self.identity, "member Lease written again"),
        }
        self.assignment.send_modify(|a| a.blocked = why);
    }

    /// Stops working: the fence closes before the controllers are told to stop.
    fn stop_working(&mut self, why: &str) {
        if self.running.take().is_some() {
            self.fence.revoke();
            self.metrics.handovers.inc();
            self.metrics.working.set(0);
            tracing::info!(identity = %self.identity, why, "stopping work on the shard ring");
            self.assignment.send_modify(|a| {
                a.ring = None;
                a.seq += 1;
            });
        }
    }

    /// While working: closes the fence once the last answered renewal is too old to keep it
    /// open (it would run out by itself; this says so in the log).
    fn fence_if_late(&self) {
        if self.running.is_some()
            && self
                .last_renewal
                .is_none_or(|t| t.elapsed() >= LEASE_DURATION - CLOCK_SKEW)
        {
            self.fence.revoke();
            tracing::warn!(identity = %self.identity, "member Lease not renewed in time: writes fenced");
        }
    }

    /// Whether the manager reports stopped every ring handed out so far.
    fn previous_ring_stopped(&self) -> bool {
        *self.stopped.borrow() >= self.assignment.borrow().seq
    }

    /// Lists the member Leases and notes when each changed ([`Member::live`]), before this
    /// replica joins.
    async fn observe(&mut self) -> Result<(), String> {
        let sent = Instant::now();
        let params = ListParams::default().labels(&format!("{MEMBER_LABEL}={}", self.ring));
        let leases = match tokio::time::timeout(REQUEST_TIMEOUT, self.api.list(&params)).await {
            Ok(Ok(list)) => list.items,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("timed out".into()),
        };
        self.live(&leases, sent).await;
        Ok(())
    }

    /// One round; `Err(why)` when another process renews this replica's Lease.
    ///
    /// The renewal and the list go out together, so a slow server costs one request's
    /// latency a round, not two. What this list can vouch for is the renewal answered before
    /// it was sent (the previous round's, or an earlier one): its members' acknowledgements
    /// are read after that renewal was on the server, so the fence is extended from that
    /// renewal's send time, never from this round's.
    async fn round(&mut self) -> Result<(), String> {
        let sent = Instant::now();
        self.round_started = sent;
        // The latest renewal answered before this list is sent.
        let vouched = self.last_renewal;
        let vouched_applied = self.renewal_applied.clone();
        // What this round's renewal carries (the acknowledgement changes only further down).
        let carried = self.applied.clone();
        let params = ListParams::default().labels(&format!("{MEMBER_LABEL}={}", self.ring));
        let api = self.api.clone();
        let list = async move { api.list(&params).await };
        let (renewal, listed) = tokio::join!(
            tokio::time::timeout(ROUND_TIMEOUT, self.renew()),
            tokio::time::timeout(ROUND_TIMEOUT, list),
        );
        // Whether the server refuses this replica's Lease requests (403), when this round can
        // tell: `Some(None)` once a renewal is answered.
        let mut refused = None;
        match renewal {
            Ok(Ok(())) => {
                self.last_renewal = Some(sent);
                self.renewal_applied = carried;
                refused = Some(None);
            }
            Ok(Err(Renewal::Taken(why))) => return Err(why),
            Ok(Err(Renewal::Failed(kube::Error::Api(s)))) if s.code == 403 => {
                refused = Some(Some(s.message));
            }
            Ok(Err(Renewal::Failed(e))) => {
                tracing::warn!(error = %e, "renewing the member Lease failed")
            }
            Err(_) => tracing::warn!("renewing the member Lease timed out"),
        }
        if let Ok(Err(kube::Error::Api(s))) = &listed
            && s.code == 403
        {
            refused = Some(Some(s.message.clone()));
        }
        if let Some(refused) = refused {
            self.block(refused);
        }
        let leases = match listed {
            Ok(Ok(list)) => list.items,
            other => {
                match other {
                    // Said once, by `block`.
                    Ok(Err(kube::Error::Api(s))) if s.code == 403 => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "listing the member Leases failed"),
                    _ => tracing::warn!("listing the member Leases timed out"),
                }
                // The fence runs out by itself (it was extended from an older renewal). The
                // controllers keep running, their writes refused: restarting them would relist
                // everything on a server that is already slow. Work resumes when a later round
                // finds the same ring acknowledged by every member (below).
                self.fence_if_late();
                return Ok(());
            }
        };
        // The first round's list vouches for no renewal: the next one does.
        let Some(vouched) = vouched else {
            return Ok(());
        };
        // The fence may stay open until the renewal the list vouches for, plus the lease
        // duration, less the clock skew allowed for (the leader's rule).
        let fence_until = vouched + LEASE_DURATION - CLOCK_SKEW;
        let fresh = Instant::now() < fence_until;
        let (ring, acks, unseen) = self.live(&leases, sent).await;
        self.metrics.members.set(ring.members().len() as i64);
        let version = ring.version();
        let moved_on: Vec<&String> = ring
            .members()
            .iter()
            .filter(|m| **m != self.identity && acks.get(*m) != Some(&version))
            .collect();
        if self.running.as_deref() == Some(version.as_str()) {
            // Every other member still acknowledges this ring: none can be working on another
            // one (a member starts a ring only after all its members' acknowledgements, which
            // this list, sent after the renewal it vouches for was answered, would show).
            // Otherwise one of them restarted or dropped this replica while its Lease was not
            // renewed: hand over.
            if moved_on.is_empty() {
                if fresh {
                    self.fence.extend(fence_until);
                } else {
                    self.fence_if_late();
                }
                return Ok(());
            }
            self.stop_working("a member acknowledges another ring");
        }
        self.stop_working("ring membership changed");
        if self.applied != version {
            // No write of the previous ring may reach the server after the acknowledgement.
            if !self.previous_ring_stopped() {
                tracing::info!(ring = %version, "waiting for the controllers of the previous ring to stop");
                return Ok(());
            }
            self.applied.clone_from(&version);
            tracing::info!(ring = %version, members = ?ring.members(), "acknowledging a new ring");
            let ack_sent = Instant::now();
            match tokio::time::timeout(ROUND_TIMEOUT, self.renew()).await {
                Ok(Ok(())) => {
                    self.last_renewal = Some(ack_sent);
                    self.renewal_applied.clone_from(&version);
                }
                Ok(Err(Renewal::Taken(why))) => return Err(why),
                Ok(Err(Renewal::Failed(e))) => {
                    tracing::warn!(error = %e, "writing the ring acknowledgement failed")
                }
                Err(_) => tracing::warn!("writing the ring acknowledgement timed out"),
            }
            return Ok(());
        }
        // An acknowledgement kept from a Lease that is gone says the member still works on
        // that ring (it may not write another one's share before a list shows it): it never
        // starts a ring.
        let mut waiting = moved_on;
        let unacknowledged: Vec<&String> = (ring.members().iter())
            .filter(|m| unseen.contains(*m) && !waiting.contains(m))
            .collect();
        waiting.extend(unacknowledged);
        if waiting.is_empty() && !self.previous_ring_stopped() {
            tracing::info!(ring = %version, "waiting for the controllers of the previous ring to stop");
        } else if waiting.is_empty() && !fresh {
            tracing::info!(ring = %version, "acknowledged by every member, but this replica's Lease is not fresh");
        } else if waiting.is_empty() && vouched_applied != version {
            // Its own acknowledgement may not be on the server yet (it failed or is late): a
            // member it dropped could still find every member acknowledging the old ring and
            // keep working. Start once a list sent after the acknowledgement was answered.
            tracing::info!(ring = %version, "waiting for this replica's acknowledgement to be answered");
        } else if waiting.is_empty() {
            tracing::info!(ring = %version, members = ?ring.members(), "working on the ring");
            self.fence.extend(fence_until);
            self.running = Some(version);
            self.metrics.working.set(1);
            self.assignment.send_modify(|a| {
                a.ring = Some(ring);
                a.seq += 1;
            });
        } else {
            tracing::info!(ring = %version, ?waiting, "waiting for members to acknowledge the ring");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_valid_object_names() {
        assert_eq!(
            lease_name("idem-operator", "idem-operator-7f9c-x2"),
            "idem-operator-shard-idem-operator-7f9c-x2"
        );
        assert_eq!(
            lease_name("idem-operator", "Host_Name:42"),
            "idem-operator-shard-host-name-42"
        );
        assert!(lease_name("r", &"a".repeat(400)).len() <= 253);
        assert_eq!(lease_name("base-tenant", "x_"), "base-tenant-shard-x");
    }
}
