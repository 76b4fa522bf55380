//! Leader election on a `coordination.k8s.io` Lease (client-go's `leaderelection`), opening a
//! [`Fence`] only while this replica's lease is valid by its own clock.
//!
//! Every [`LeaderElection::retry_period`] a replica runs one round of client-go's
//! `tryAcquireOrRenew`: it reads the Lease; a standby takes it over (a replace guarded by
//! `resourceVersion`) once the record has not changed for the holder's
//! `leaseDurationSeconds`, never less than its own [`LeaderElection::lease_duration`] (a record
//! edited to a short one does not shorten the wait), *as measured on the standby's clock* (no
//! cross-node clock comparison, as in client-go); the holder renews it. After each successful
//! renewal sent at `t` the holder's fence is open until `t + lease_duration − clock_skew`; it
//! is closed at once when the Lease names another holder, or when no renewal succeeded within
//! [`LeaderElection::renew_deadline`] (a renewal that meets 409 Conflict, the Lease changed
//! since it was read — perhaps by its own earlier renewal that timed out here but reached the
//! server — reads it again at the next round) — then leadership is lost for good
//! (client-go's `OnStoppedLeading`; controller-runtime's manager exits), and a new
//! [`Leadership`] must be started to compete again.
//!
//! The holder is an identity *and* a process: each [`Leadership`] writes an id of its own
//! ([`INSTANCE_ANNOTATION`]) with every acquisition and renewal, and the Lease is this
//! replica's only when it names both. Two processes given one identity (the same `--identity`
//! twice, or two pods of one host name) would otherwise both renew "their" Lease at once and
//! both lead; here the second waits as for any other holder, and says why. A replica that
//! restarted waits out its former process's lease like anyone else's.
//!
//! kube-lease-manager is not used because it exposes neither the time of its renewals
//! (needed for the fence) nor a renewal period shorter than `duration − grace`.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;

use super::fence::{Fence, FenceLayer, FenceMode};

/// client-go's default `LeaseDuration`: 15 s.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// client-go's default `RenewDeadline`: 10 s.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// client-go's default `RetryPeriod`: 2 s.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
/// Default [`LeaderElection::clock_skew`]: 5 s (the gap client-go leaves between
/// `RenewDeadline` and `LeaseDuration`).
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(5);
/// client-go's `JitterFactor`: the renew deadline must exceed `retry_period × 1.2`.
const JITTER_FACTOR: f64 = 1.2;
/// Longest wait for one Lease request (further bounded by the renew deadline).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// A configuration field is empty or zero.
    #[error("leader election: {0} must not be empty or zero")]
    Empty(&'static str),
    /// `lease_duration` is not longer than `renew_deadline` (client-go's rule).
    #[error(
        "leader election: lease duration {lease:?} must be longer than the renew deadline {renew:?}"
    )]
    LeaseNotAboveRenewDeadline {
        /// The lease duration.
        lease: Duration,
        /// The renew deadline.
        renew: Duration,
    },
    /// `renew_deadline` is not longer than `retry_period × 1.2` (client-go's rule).
    #[error(
        "leader election: renew deadline {renew:?} must be longer than 1.2 × the retry period {retry:?}"
    )]
    RenewDeadlineNotAboveRetryPeriod {
        /// The renew deadline.
        renew: Duration,
        /// The retry period.
        retry: Duration,
    },
    /// `clock_skew` is not shorter than `lease_duration`: the fence would never open.
    #[error(
        "leader election: clock skew {skew:?} must be shorter than the lease duration {lease:?}"
    )]
    SkewNotBelowLease {
        /// The clock skew.
        skew: Duration,
        /// The lease duration.
        lease: Duration,
    },
    /// Leadership was lost (the Lease names another holder, or it could not be renewed in
    /// time); the fence is closed.
    #[error("{identity} lost leadership of Lease {lease}")]
    Lost {
        /// This replica's identity.
        identity: String,
        /// `namespace/name` of the Lease.
        lease: String,
    },
}

/// How to compete for a leader Lease: which Lease, as whom, and client-go's timings.
///
/// Start it with [`LeaderElection::start`]; the returned [`Leadership`] says when this
/// replica leads ([`Leadership::acquired`]), fences a client ([`Leadership::fenced`]) and
/// stops work when leadership is lost ([`Leadership::while_leading`]).
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Name of the Lease (controller-runtime's `LeaderElectionID`).
    pub lease_name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// This replica's identity, written to `spec.holderIdentity`; unique per replica (see
    /// [`default_identity`]).
    pub identity: String,
    /// How long a Lease is valid without renewal; written as `leaseDurationSeconds`,
    /// rounded up to whole seconds. Default [`DEFAULT_LEASE_DURATION`].
    pub lease_duration: Duration,
    /// The leader gives up when no renewal succeeded for this long. Default
    /// [`DEFAULT_RENEW_DEADLINE`].
    pub renew_deadline: Duration,
    /// How often a replica reads (the leader renews) the Lease; a hijacked Lease is noticed
    /// within about this long. Default [`DEFAULT_RETRY_PERIOD`].
    pub retry_period: Duration,
    /// What the fence subtracts from the lease duration for rate differences between this
    /// replica's clock and the others' and for request latency: the leader stops writing
    /// this long before a standby may take over. Default [`DEFAULT_CLOCK_SKEW`].
    pub clock_skew: Duration,
    /// Set to 1 while this replica leads, else 0: register it as controller-runtime's
    /// `leader_election_master_status`.
    pub status: Gauge,
}

impl LeaderElection {
    /// Competes for Lease `namespace/lease_name` as `identity`, with client-go's default
    /// timings.
    pub fn new(
        lease_name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            lease_name: lease_name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
            clock_skew: DEFAULT_CLOCK_SKEW,
            status: Gauge::default(),
        }
    }

    /// Checks client-go's rules (`NewLeaderElector`) and that the fence can open.
    ///
    /// # Errors
    /// [`LeaderError::Empty`], [`LeaderError::LeaseNotAboveRenewDeadline`],
    /// [`LeaderError::RenewDeadlineNotAboveRetryPeriod`], [`LeaderError::SkewNotBelowLease`].
    pub fn validate(&self) -> Result<(), LeaderError> {
        for (field, empty) in [
            ("lease_name", self.lease_name.is_empty()),
            ("namespace", self.namespace.is_empty()),
            ("identity", self.identity.is_empty()),
            ("lease_duration", self.lease_duration.is_zero()),
            ("renew_deadline", self.renew_deadline.is_zero()),
            ("retry_period", self.retry_period.is_zero()),
        ] {
            if empty {
                return Err(LeaderError::Empty(field));
            }
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(LeaderError::LeaseNotAboveRenewDeadline {
                lease: self.lease_duration,
                renew: self.renew_deadline,
            });
        }
        if self.renew_deadline.as_secs_f64() <= self.retry_period.as_secs_f64() * JITTER_FACTOR {
            return Err(LeaderError::RenewDeadlineNotAboveRetryPeriod {
                renew: self.renew_deadline,
                retry: self.retry_period,
            });
        }
        if self.clock_skew >= self.lease_duration {
            return Err(LeaderError::SkewNotBelowLease {
                skew: self.clock_skew,
                lease: self.lease_duration,
            });
        }
        Ok(())
    }

    /// Starts competing (a background task; `client` only reads and writes the Lease and
    /// need not be fenced).
    ///
    /// # Errors
    /// When the configuration is invalid ([`LeaderElection::validate`]).
    pub fn start(self, client: Client) -> Result<Leadership, LeaderError> {
        self.validate()?;
        let api = Api::<Lease>::namespaced(client, &self.namespace);
        let fence = Fence::new(FenceMode::LeaderElection);
        let (role_tx, role) = watch::channel(Role::Standby);
        let (stop, stop_rx) = watch::channel(false);
        let config = Arc::new(self);
        let instance: Arc<str> = instance_id().into();
        let task = tokio::spawn(elect(
            api.clone(),
            Arc::clone(&config),
            Arc::clone(&instance),
            Arc::clone(&fence),
            role_tx,
            stop_rx,
        ));
        Ok(Leadership {
            role,
            fence,
            stop,
            task,
            api,
            config,
            instance,
        })
    }

    /// Longest wait for one Lease request.
    fn request_timeout(&self) -> Duration {
        REQUEST_TIMEOUT.min(self.renew_deadline)
    }

    /// `leaseDurationSeconds`: the lease duration rounded up, so a standby never takes over
    /// before the fence of the holder closed.
    fn lease_seconds(&self) -> i32 {
        let d = self.lease_duration;
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// A default identity: the host name (in a pod, the pod's name) and the process id.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}

/// Where this replica stands in the election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Standby,
    Leader,
    /// Was leader and is no more; final.
    Lost,
}

/// A running election: held or awaited leadership. Dropping it stops the election loop
/// without releasing the Lease (as a crash would: a standby takes over once it expires).
pub struct Leadership {
    role: watch::Receiver<Role>,
    fence: Arc<Fence>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    api: Api<Lease>,
    config: Arc<LeaderElection>,
    instance: Arc<str>,
}

impl Leadership {
    /// The write fence of this replica: open only while it leads.
    pub fn fence(&self) -> Arc<Fence> {
        Arc::clone(&self.fence)
    }

    /// A [`FenceLayer`] for kube's `ClientBuilder::with_layer` (put it under the retry layer
    /// so every attempt is checked).
    pub fn layer(&self) -> FenceLayer {
        self.fence.layer()
    }

    /// `client` with its writes fenced ([`Fence::wrap`]): give it to the controllers.
    pub fn fenced(&self, client: &Client) -> Client {
        self.fence.wrap(client)
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.config.identity
    }

    /// True while this replica leads and its lease is valid by its own clock.
    pub fn is_leader(&self) -> bool {
        *self.role.borrow() == Role::Leader && self.fence.is_valid()
    }

    /// Resolves once this replica holds the Lease.
    ///
    /// # Errors
    /// [`LeaderError::Lost`] when leadership was lost already (or the election stopped).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn acquired(&self) -> Result<(), LeaderError> {
        let mut rx = self.role.clone();
        match rx.wait_for(|r| *r != Role::Standby).await.map(|r| *r) {
            Ok(Role::Leader) => Ok(()),
            _ => Err(self.lost_error()),
        }
    }

    /// Resolves when leadership is lost after being held (the fence is closed by then), or
    /// when the election loop stopped.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) {
        let mut rx = self.role.clone();
        let _ = rx.wait_for(|r| *r == Role::Lost).await;
    }

    /// Runs `work` (e.g. the controllers, on a [`Leadership::fenced`] client) until it
    /// completes, or until leadership is lost: then `work` is dropped at once — in-flight
    /// reconciles are cancelled with no grace period, as controller-runtime's manager stops
    /// when it loses the lease — and [`LeaderError::Lost`] is returned.
    ///
    /// # Errors
    /// [`LeaderError::Lost`] when leadership is lost first.
    ///
    /// # Cancel safety
    /// Cancel safe (dropping it drops `work`).
    pub async fn while_leading<T>(&self, work: impl Future<Output = T>) -> Result<T, LeaderError> {
        tokio::select! {
            out = work => Ok(out),
            () = self.lost() => Err(self.lost_error()),
        }
    }

    fn lost_error(&self) -> LeaderError {
        LeaderError::Lost {
            identity: self.config.identity.clone(),
            lease: format!("{}/{}", self.config.namespace, self.config.lease_name),
        }
    }

    /// Stops the election loop and, if this replica still holds a valid lease, clears the
    /// holder so a standby takes over at its next round (client-go's `ReleaseOnCancel`), once
    /// every write the fence let through has ended ([`Fence::drained`]): a reconcile cancelled
    /// at shutdown may have left one in flight, and the standby must not write beside it.
    /// Failures are logged, not returned: the lease then expires by itself, as it does when
    /// those writes do not end within the request timeout.
    pub async fn release(mut self) {
        let _ = self.stop.send(true);
        let _ = (&mut self.task).await;
        if !self.fence.is_valid() {
            return;
        }
        self.fence.revoke();
        if self.fence.writes_in_flight() > 0 {
            tracing::info!(
                writes = self.fence.writes_in_flight(),
                "waiting for the writes in flight before releasing the leader Lease"
            );
        }
        let drained = tokio::time::timeout(self.config.request_timeout(), self.fence.drained());
        if drained.await.is_err() {
            tracing::warn!("writes still in flight: the leader Lease is left to expire");
            return;
        }
        self.config.status.set(0);
        let name = self.config.lease_name.clone();
        let identity = self.config.identity.clone();
        let result = tokio::time::timeout(self.config.request_timeout(), async {
            let Some(mut lease) = self.api.get_opt(&name).await? else {
                return Ok(());
            };
            if instance_of(&lease) != Some(&*self.instance) {
                return Ok(());
            }
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(identity.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            self.api
                .replace(&name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        })
        .await;
        match result {
            Ok(Ok(())) => tracing::info!(%identity, lease = %name, "released the leader Lease"),
            Ok(Err(e)) => tracing::warn!(error = %e, "could not release the leader Lease"),
            Err(_) => tracing::warn!("releasing the leader Lease timed out"),
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Annotation of the leader Lease: the id of the process that holds it (one per
/// [`Leadership`]; the same key as the shard ring's member Leases).
pub const INSTANCE_ANNOTATION: &str = "tenancy.idem.dev/instance";

/// An id of this election, different for every [`Leadership`]: the process id, the start time
/// and a count.
fn instance_id() -> String {
    static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{nanos:x}-{n}", std::process::id())
}

/// The process id in the leader Lease ([`INSTANCE_ANNOTATION`]).
fn instance_of(lease: &Lease) -> Option<&str> {
    (lease.metadata.annotations.as_ref())?
        .get(INSTANCE_ANNOTATION)
        .map(String::as_str)
}

/// The last version of the Lease record seen, and when (by this replica's clock).
struct Observed {
    resource_version: Option<String>,
    at: Instant,
}

/// The election loop: one attempt every retry period until stopped or leadership is lost.
async fn elect(
    api: Api<Lease>,
    config: Arc<LeaderElection>,
    instance: Arc<str>,
    fence: Arc<Fence>,
    role: watch::Sender<Role>,
    mut stop: watch::Receiver<bool>,
) {
    let identity = &config.identity;
    let mut observed: Option<Observed> = None;
    let mut last_renewal: Option<Instant> = None;
    let mut said_twin = false;
    loop {
        let sent = Instant::now();
        let attempt = tokio::time::timeout(
            config.request_timeout(),
            try_acquire_or_renew(&api, &config, &instance, &mut observed),
        )
        .await
        .unwrap_or(Err(Attempt::Failed("the request timed out".into())));
        let leading = *role.borrow() == Role::Leader;
        match attempt {
            Ok(()) => {
                fence.extend(sent + config.lease_duration - config.clock_skew);
                last_renewal = Some(sent);
                if !leading {
                    tracing::info!(%identity, lease = %config.lease_name, "acquired the leader Lease");
                    config.status.set(1);
                    let _ = role.send(Role::Leader);
                }
            }
            Err(Attempt::HeldBy(holder)) if !leading => {
                if holder == *identity && !said_twin {
                    said_twin = true;
                    tracing::error!(
                        %identity,
                        "another process holds the leader Lease under this replica's identity: \
                         give every replica an identity of its own; this one waits as a standby"
                    );
                }
            }
            Err(Attempt::Conflict) if !leading => {}
            Err(Attempt::HeldBy(holder)) => {
                fence.revoke();
                config.status.set(0);
                tracing::error!(%identity, %holder, "the leader Lease is held by another replica");
                let _ = role.send(Role::Lost);
                return;
            }
            Err(attempt) => {
                if let Attempt::Failed(e) = &attempt {
                    tracing::warn!(%identity, error = %e, "leader election attempt failed");
                } else {
                    tracing::info!(%identity, "the leader Lease changed since it was read: reading it again");
                }
                if leading && last_renewal.is_none_or(|t| t.elapsed() >= config.renew_deadline) {
                    fence.revoke();
                    config.status.set(0);
                    tracing::error!(%identity, "could not renew the leader Lease in time");
                    let _ = role.send(Role::Lost);
                    return;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(config.retry_period) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Why an attempt did not leave this replica holding the Lease.
enum Attempt {
    /// Another replica holds a Lease that has not expired (or won the race to write it).
    HeldBy(String),
    /// The API call failed.
    Failed(String),
    /// The write met 409 Conflict: the Lease changed since this round read it.
    Conflict,
}

/// One round of client-go's `tryAcquireOrRenew`.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    config: &LeaderElection,
    instance: &str,
    observed: &mut Option<Observed>,
) -> Result<(), Attempt> {
    let (name, identity) = (config.lease_name.as_str(), config.identity.as_str());
    let now = MicroTime(Timestamp::now());
    let fresh = |acquire_time: MicroTime, transitions: i32| LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(config.lease_seconds()),
        acquire_time: Some(acquire_time),
        renew_time: Some(now.clone()),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    };
    let failed = |e: kube::Error| Attempt::Failed(e.to_string());
    let Some(mut lease) = api.get_opt(name).await.map_err(failed)? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: Some([(INSTANCE_ANNOTATION.into(), instance.into())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(fresh(now.clone(), 0)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(Attempt::HeldBy("unknown".into())),
            Err(e) => Err(failed(e)),
        };
    };
    let rv = lease.metadata.resource_version.clone();
    if observed.as_ref().is_none_or(|o| o.resource_version != rv) {
        *observed = Some(Observed {
            resource_version: rv,
            at: Instant::now(),
        });
    }
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    // Ours only when it names this process too: another process given the same identity
    // holds it otherwise.
    let mine = holder.as_deref() == Some(identity) && instance_of(&lease) == Some(instance);
    if let Some(other) = holder.as_ref().filter(|_| !mine) {
        // Never shorter than our own lease duration: a record edited by hand to a short one
        // (or 0) must not let a standby take over while the holder's fence may still be open.
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64)
            .max(config.lease_duration);
        let since = observed.as_ref().map_or(Duration::ZERO, |o| o.at.elapsed());
        if since < duration {
            return Err(Attempt::HeldBy(other.clone()));
        }
    }
    let transitions = spec.lease_transitions.unwrap_or(0);
    (lease.metadata.annotations.get_or_insert_default())
        .insert(INSTANCE_ANNOTATION.into(), instance.into());
    lease.spec = Some(if mine {
        fresh(spec.acquire_time.unwrap_or(now.clone()), transitions)
    } else {
        fresh(now.clone(), transitions + 1)
    });
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(()),
        // The Lease changed since it was read: by another replica, or by this one's own
        // renewal that timed out here but reached the server late. The next round reads whose
        // it is.
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Attempt::Conflict),
        Err(e) => Err(failed(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_go_rules_are_checked() {
        let ok = LeaderElection::new("l", "ns", "me");
        ok.validate().unwrap();
        assert_eq!(ok.lease_seconds(), 15);
        let mut e = ok.clone();
        e.identity.clear();
        assert!(matches!(e.validate(), Err(LeaderError::Empty("identity"))));
        let mut e = ok.clone();
        e.renew_deadline = e.lease_duration;
        assert!(matches!(
            e.validate(),
            Err(LeaderError::LeaseNotAboveRenewDeadline { .. })
        ));
        let mut e = ok.clone();
        e.retry_period = Duration::from_secs(9);
        assert!(matches!(
            e.validate(),
            Err(LeaderError::RenewDeadlineNotAboveRetryPeriod { .. })
        ));
        let mut e = ok.clone();
        e.clock_skew = e.lease_duration;
        assert!(matches!(
            e.validate(),
            Err(LeaderError::SkewNotBelowLease { .. })
        ));
        let mut e = ok;
        e.lease_duration = Duration::from_millis(2500);
        e.renew_deadline = Duration::from_secs(2);
        e.retry_period = Duration::from_secs(1);
        e.clock_skew = Duration::from_secs(1);
        assert_eq!(
            e.lease_seconds(),
            3,
            "rounded up, never below the fence's duration"
        );
    }
}
