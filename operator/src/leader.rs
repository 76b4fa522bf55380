//! Leader election on a `coordination.k8s.io` Lease, with a write fence: only the holder runs
//! controllers, and its writes are sent only while its lease is valid by its own clock.
//!
//! The algorithm is client-go's `leaderelection` (`tryAcquireOrRenew`): every
//! [`RETRY_PERIOD`] a replica reads the Lease; a standby takes it over (a replace guarded by
//! `resourceVersion`) once the record has not changed for the holder's `leaseDurationSeconds`
//! *as measured on the standby's clock* (no cross-node clock comparison); the holder renews it.
//! The holder's [`Fence`] is extended to `renewal sent + LEASE_DURATION − CLOCK_SKEW` after each
//! successful renewal and revoked at once when the Lease names another holder, when a renewal
//! is refused, or when no renewal succeeded within [`RENEW_DEADLINE`].
//! kube-lease-manager is not used because it exposes neither the time of its renewals (needed
//! for the fence) nor a renewal period shorter than `duration − grace`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;

/// The Lease's name.
pub const LEASE_NAME: &str = "idem-operator";
/// How long a Lease is valid without renewal, in seconds (client-go's leader election default
/// `LeaseDuration` is 15 s).
pub const LEASE_SECONDS: u64 = 15;
/// [`LEASE_SECONDS`] as a duration.
pub const LEASE_DURATION: Duration = Duration::from_secs(LEASE_SECONDS);
/// How often a replica reads (and the holder renews) the Lease: client-go's `RetryPeriod`
/// default, 2 s. A hijacked Lease is noticed at the next read, so within about this long.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// The holder gives up leadership when no renewal succeeded for this long (client-go's
/// `RenewDeadline` default, 10 s).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// What the fence subtracts from the lease duration for rate differences between this
/// replica's clock and the others' and for request latency: the holder stops writing
/// `CLOCK_SKEW` before a standby may take over.
pub const CLOCK_SKEW: Duration = Duration::from_secs(5);
/// Longest wait for one Lease request (a slow reply is a failed attempt).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether this replica may write: the instant until which its lease is valid by its own
/// (monotonic) clock, or none. Shared by the election loop and the client's write fence
/// ([`crate::fence`]).
#[derive(Debug, Default)]
pub struct Fence {
    valid_until: Mutex<Option<Instant>>,
    /// Writes refused because the lease was not valid.
    pub refused: Counter,
}

impl Fence {
    /// A fence that is always open: used when leader election is off.
    pub fn open() -> Arc<Self> {
        let fence = Self::default();
        *fence.lock() = Some(Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600));
        Arc::new(fence)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.valid_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// True while the lease is valid by this replica's clock.
    pub fn is_valid(&self) -> bool {
        self.lock().is_some_and(|until| Instant::now() < until)
    }

    pub(crate) fn extend(&self, until: Instant) {
        *self.lock() = Some(until);
    }

    pub(crate) fn revoke(&self) {
        *self.lock() = None;
    }
}

/// Where this replica stands in the election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Standby,
    Leader,
    /// Was leader and is no more; final.
    Lost,
}

/// A held (or awaited) leadership; dropping it stops the election loop without releasing.
pub struct Leadership {
    role: watch::Receiver<Role>,
    fence: Arc<Fence>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    api: Api<Lease>,
    identity: String,
}

impl Leadership {
    /// Starts competing for the Lease [`LEASE_NAME`] in `namespace` as `identity`; `status`
    /// is set to 1 while this replica leads (controller-runtime's
    /// `leader_election_master_status`).
    pub fn start(client: Client, namespace: &str, identity: &str, status: Gauge) -> Self {
        let api = Api::<Lease>::namespaced(client, namespace);
        let fence = Arc::new(Fence::default());
        let (role_tx, role) = watch::channel(Role::Standby);
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(elect(
            api.clone(),
            identity.to_string(),
            Arc::clone(&fence),
            role_tx,
            stop_rx,
            status,
        ));
        Self {
            role,
            fence,
            stop,
            task,
            api,
            identity: identity.to_string(),
        }
    }

    /// The write fence of this replica.
    pub fn fence(&self) -> Arc<Fence> {
        Arc::clone(&self.fence)
    }

    /// Resolves once this replica holds the Lease.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn acquired(&mut self) {
        let _ = self.role.wait_for(|r| *r == Role::Leader).await;
    }

    /// Resolves when leadership is lost after being held (the fence is already revoked then).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) {
        let mut rx = self.role.clone();
        let _ = rx.wait_for(|r| *r == Role::Lost).await;
    }

    /// Stops the election loop and, if this replica still holds a valid lease, clears the
    /// holder so a standby takes over at once (client-go's `ReleaseOnCancel`).
    pub async fn release(mut self) {
        let _ = self.stop.send(true);
        let _ = (&mut self.task).await;
        if !self.fence.is_valid() {
            return;
        }
        self.fence.revoke();
        let result = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let Some(mut lease) = self.api.get_opt(LEASE_NAME).await? else {
                return Ok(());
            };
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            self.api
                .replace(LEASE_NAME, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        })
        .await;
        match result {
            Ok(Ok(())) => tracing::info!("released the leader Lease"),
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

/// The last version of the Lease record seen, and when (by this replica's clock).
struct Observed {
    resource_version: Option<String>,
    at: Instant,
}

/// The election loop: one attempt every [`RETRY_PERIOD`] until stopped or leadership is lost.
async fn elect(
    api: Api<Lease>,
    identity: String,
    fence: Arc<Fence>,
    role: watch::Sender<Role>,
    mut stop: watch::Receiver<bool>,
    status: Gauge,
) {
    let mut observed: Option<Observed> = None;
    let mut last_renewal: Option<Instant> = None;
    loop {
        let sent = Instant::now();
        let attempt = tokio::time::timeout(
            REQUEST_TIMEOUT,
            try_acquire_or_renew(&api, &identity, &mut observed),
        )
        .await
        .unwrap_or(Err(Attempt::Failed("the request timed out".into())));
        let leading = *role.borrow() == Role::Leader;
        match attempt {
            Ok(()) => {
                fence.extend(sent + LEASE_DURATION - CLOCK_SKEW);
                last_renewal = Some(sent);
                if !leading {
                    tracing::info!(%identity, "acquired the leader Lease");
                    status.set(1);
                    let _ = role.send(Role::Leader);
                }
            }
            Err(Attempt::HeldBy(holder)) if leading => {
                fence.revoke();
                status.set(0);
                tracing::error!(%identity, %holder, "the leader Lease is held by another replica");
                let _ = role.send(Role::Lost);
                return;
            }
            Err(Attempt::HeldBy(_)) => {}
            Err(Attempt::Failed(e)) => {
                tracing::warn!(%identity, error = %e, "leader election attempt failed");
                if leading && last_renewal.is_none_or(|t| t.elapsed() >= RENEW_DEADLINE) {
                    fence.revoke();
                    status.set(0);
                    tracing::error!(%identity, "could not renew the leader Lease in time");
                    let _ = role.send(Role::Lost);
                    return;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RETRY_PERIOD) => {}
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
}

/// One round of client-go's `tryAcquireOrRenew`.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    identity: &str,
    observed: &mut Option<Observed>,
) -> Result<(), Attempt> {
    let now = MicroTime(Timestamp::now());
    let fresh = |acquire_time: MicroTime, transitions: i32| LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(LEASE_SECONDS as i32),
        acquire_time: Some(acquire_time),
        renew_time: Some(now.clone()),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    };
    let failed = |e: kube::Error| Attempt::Failed(e.to_string());
    let Some(mut lease) = api.get_opt(LEASE_NAME).await.map_err(failed)? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(LEASE_NAME.into()),
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
    let mine = holder.as_deref() == Some(identity);
    if let Some(other) = holder.as_ref().filter(|_| !mine) {
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        let since = observed.as_ref().map_or(Duration::ZERO, |o| o.at.elapsed());
        if since < duration {
            return Err(Attempt::HeldBy(other.clone()));
        }
    }
    let transitions = spec.lease_transitions.unwrap_or(0);
    lease.spec = Some(if mine {
        fresh(spec.acquire_time.unwrap_or(now.clone()), transitions)
    } else {
        fresh(now.clone(), transitions + 1)
    });
    match api
        .replace(LEASE_NAME, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Attempt::HeldBy(
            "another replica (the Lease changed since it was read)".into(),
        )),
        Err(e) => Err(failed(e)),
    }
}
