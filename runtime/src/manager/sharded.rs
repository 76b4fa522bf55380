//! The sharded mode's loop: the controllers run on this replica's share of each ring the
//! membership hands out, each ring with a client and a write fence of its own.

use std::sync::Arc;
use std::time::Duration;

use kube::Config;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;

use super::ManagerError;
use super::client;
use super::controllers::Shard;
use super::epoch::{Epoch, Parts, reported};
use crate::leader::{Fence, FenceMode};
use crate::shard::membership::Membership;
use crate::shard::selector::Selectors;

/// What the sharded loop needs.
pub(super) struct Sharded<'a> {
    /// To build each ring's client.
    pub(super) config: &'a Config,
    /// The membership's write fence.
    pub(super) fence: &'a Arc<Fence>,
    /// `/readyz`.
    pub(super) ready: &'a watch::Sender<bool>,
    pub(super) identity: &'a str,
    pub(super) parts: &'a Parts,
    pub(super) selectors: &'a Arc<Selectors>,
    pub(super) owned: &'a Gauge,
    pub(super) cached_children: &'a Gauge,
    /// Of which stubs.
    pub(super) cached_stubs: &'a Gauge,
}

impl Sharded<'_> {
    /// Runs the controllers on this replica's share of each ring the membership hands out,
    /// each ring with a client of its own, and returns on `shutdown` after in-flight
    /// reconciles finished.
    ///
    /// A new ring (the fence is already closed) ends the running one: its client's own fence
    /// closes for good, its controllers are cancelled and joined, and every write they sent is
    /// awaited ([`Fence::drained`]); only then is the membership told it stopped
    /// ([`Membership::stopped`]), so the acknowledgement of the new ring comes after the last
    /// write of the old one. The new controllers start, with new watches (and server-side
    /// selectors), once every member acknowledged it.
    ///
    /// `/readyz`: ready while waiting for a ring (as a standby is), unless the API server
    /// refuses its member Lease's writes ([`Assignment::blocked`](crate::shard::membership::Assignment::blocked));
    /// while working, ready while every controller's caches are synced and their watches
    /// established (as a single replica). When the membership refuses (another process renews
    /// this replica's Lease) it fails with [`ManagerError::Refused`] and the process exits.
    pub(super) async fn run(
        &self,
        membership: &Membership,
        shutdown: &mut std::pin::Pin<&mut (impl Future<Output = ()> + Send)>,
    ) -> Result<(), ManagerError> {
        let mut assignments = membership.assignments();
        loop {
            let assignment = assignments.borrow_and_update().clone();
            if let Some(why) = assignment.refused {
                // Another process renews this replica's Lease. The process exits: restarted,
                // it looks again for a lease duration, and works once the Lease is its own
                // (the other was a passing writer) or refuses again, visibly (two replicas
                // with one identity restart in turn rather than stay up doing nothing).
                let _ = self.ready.send(false);
                tracing::error!(problem = %why, "refusing to run: this replica reconciles nothing; exiting");
                return Err(ManagerError::Refused(why));
            }
            let Some(ring) = assignment.ring else {
                // Nothing of an earlier ring runs or writes any more.
                membership.stopped(assignment.seq);
                // A standby is ready, unless it cannot join at all for now.
                let _ = self.ready.send(assignment.blocked.is_none());
                tokio::select! {
                    changed = assignments.changed() => if changed.is_err() { return Ok(()) },
                    () = shutdown.as_mut() => return Ok(()),
                }
                continue;
            };
            let seq = assignment.seq;
            let ranges = ring.ranges_of(self.identity);
            tracing::info!(
                members = ring.members().len(),
                share = ranges.share(),
                "starting the controllers on this replica's shard"
            );
            self.selectors.set(Some(ranges.clone()));
            // This ring's own fence, closed for good when it ends: nothing of this ring writes
            // once a later ring opens the membership's fence again.
            let gate = Fence::counting_into(FenceMode::ShardMembership, self.fence.refused.clone());
            gate.extend(std::time::Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600));
            let client = client::fenced(
                self.config.clone(),
                Arc::clone(self.fence),
                Arc::clone(&gate),
                Arc::clone(self.selectors),
                self.parts.slots.as_ref(),
            )?;
            let (stop_tx, stop_rx) = watch::channel(false);
            let now = membership.assignments();
            let server_filtered =
                (self.selectors.server_side).load(std::sync::atomic::Ordering::Relaxed);
            let shard = Shard::new(ranges, Arc::new(move || now.borrow().seq == seq))
                .server_filtered(server_filtered);
            let epoch = self.parts.start(&client, Some(&shard), stop_rx);
            let mut epoch = epoch;
            epoch.tasks_push_readiness(self.ready.clone());
            let Epoch {
                stopped,
                tasks,
                owned,
                caches,
                ..
            } = epoch;
            let mut controllers = tokio::spawn(stopped);
            let counter = tokio::spawn({
                let (owned_gauge, cached_children, cached_stubs) = (
                    self.owned.clone(),
                    self.cached_children.clone(),
                    self.cached_stubs.clone(),
                );
                async move {
                    loop {
                        owned_gauge.set(owned.iter().map(|f| f()).sum::<usize>() as i64);
                        cached_children
                            .set(caches.iter().map(|c| c.objects()).sum::<usize>() as i64);
                        cached_stubs.set(caches.iter().map(|c| c.stubs()).sum::<usize>() as i64);
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                }
            });
            let changed = async {
                let _ = assignments.wait_for(|a| a.seq != seq).await;
            };
            let (done, reports) = tokio::select! {
                joined = &mut controllers => (true, Some(joined)),
                () = changed => {
                    tracing::info!("shard ring changed: cancelling the controllers");
                    (false, None)
                }
                () = shutdown.as_mut() => {
                    tracing::info!("shutdown requested: finishing in-flight reconciles");
                    let _ = stop_tx.send(true);
                    (true, Some((&mut controllers).await))
                }
            };
            // Nothing of this ring writes from now on; its reconciles are cancelled and
            // joined, its watches stopped, and the writes it sent before are awaited.
            gate.revoke();
            if reports.is_none() {
                controllers.abort();
                let _ = controllers.await;
            }
            for task in &tasks {
                task.abort();
            }
            for task in tasks {
                let _ = task.await;
            }
            counter.abort();
            if gate.writes_in_flight() > 0 {
                tracing::info!(
                    writes = gate.writes_in_flight(),
                    "waiting for the writes of the previous ring to end"
                );
            }
            gate.drained().await;
            tracing::info!("the controllers of the previous ring stopped");
            self.owned.set(0);
            self.cached_children.set(0);
            self.cached_stubs.set(0);
            self.selectors.set(None);
            if done {
                return match reports {
                    Some(Ok(stopped)) => reported(stopped),
                    _ => Ok(()),
                };
            }
        }
    }
}
