//! Who counts as a live member of the ring: each Lease's last change dated on this replica's
//! clock, the member kept live for a lease duration after it whatever happens to its Lease,
//! unless its holder wrote that it left.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Preconditions};

use super::lease::{instance_of, left};
use super::{
    APPLIED_ANNOTATION, CLOCK_SKEW, GC_AFTER, LEASE_DURATION, Member, REQUEST_TIMEOUT,
    RETRY_PERIOD, Ring, lease_name,
};

impl Member {
    /// The ring of live members (this replica included), each member's acknowledged ring,
    /// and the members whose Lease this list did not show as a live member's (their
    /// acknowledgement is the last seen), from `leases` listed at `list_sent`; deletes Leases
    /// unchanged for [`GC_AFTER`] lease durations and sets [`Member::next_expiry`].
    ///
    /// A member is live for [`LEASE_DURATION`] after the last change of its Lease, whatever
    /// happens to the Lease meanwhile: its fence, extended from its own answered renewals,
    /// stays open that long, so a Lease deleted, edited (its `leaseDurationSeconds`, its
    /// holder, its label) or being deleted by someone else does not end its membership
    /// sooner. Only its holder's own word does ([`left`]). A Lease counts only for the
    /// holder it is named after ([`lease_name`]): a copy under another name is nobody's.
    pub(super) async fn live(
        &mut self,
        leases: &[Lease],
        list_sent: Instant,
    ) -> (Ring, BTreeMap<String, String>, BTreeSet<String>) {
        let now = Instant::now();
        let previous_list = self.previous_list.replace(list_sent);
        self.next_expiry = None;
        for member in self.members.values_mut() {
            member.listed = false;
        }
        let mut seen = Vec::new();
        let mut dead = Vec::new();
        for lease in leases {
            let Some(name) = lease.metadata.name.clone() else {
                continue;
            };
            seen.push(name.clone());
            let rv = lease.metadata.resource_version.clone();
            let renewed_at = lease.spec.as_ref().and_then(|s| s.renew_time.clone());
            let changed_at = match (self.observed.get(&name), previous_list) {
                (Some((before, at)), _) if *before == rv => *at,
                // Changed since the previous list: when, by its holder's renewTime.
                (Some(_), Some(previous)) => {
                    changed_at(now, previous, renewed_at.map(|t| t.0), Timestamp::now())
                }
                // First seen: now (client-go's rule).
                _ => now,
            };
            self.observed.insert(name.clone(), (rv.clone(), changed_at));
            if name == self.name {
                continue;
            }
            if list_sent.saturating_duration_since(changed_at) >= LEASE_DURATION * GC_AFTER {
                dead.push((name, rv));
                continue;
            }
            let holder = (lease.spec.as_ref())
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty() && lease_name(&self.ring, h) == name);
            let Some(holder) = holder else {
                continue;
            };
            let instance = instance_of(lease).map(str::to_owned);
            if left(lease)
                && (self.members.get(&holder))
                    .is_none_or(|m| m.instance.is_none() || m.instance == instance)
            {
                // Its holder left: nothing of it writes any more.
                self.members.remove(&holder);
                continue;
            }
            if lease.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let ack = (lease.metadata.annotations.as_ref())
                .and_then(|a| a.get(APPLIED_ANNOTATION))
                .cloned();
            let member = self.members.entry(holder).or_insert(Seen {
                changed_at,
                instance: None,
                ack: None,
                listed: true,
            });
            member.changed_at = member.changed_at.max(changed_at);
            member.instance = instance;
            member.ack = ack;
            member.listed = true;
        }
        self.observed.retain(|n, _| seen.contains(n));
        for (name, rv) in dead {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: rv,
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            let deleted = tokio::time::timeout(REQUEST_TIMEOUT, self.api.delete(&name, &dp)).await;
            if let Ok(Ok(_)) = deleted {
                tracing::info!(lease = %name, "deleted a dead member's Lease");
            }
        }
        let mut members = vec![self.identity.clone()];
        let mut acks = BTreeMap::new();
        let mut unseen = BTreeSet::new();
        let mut next_expiry = None::<Instant>;
        self.members.retain(|holder, m| {
            // Unchanged at least until this list was sent (the server answered it later): a
            // slow list does not add its own latency to a member's silence.
            if list_sent.saturating_duration_since(m.changed_at) >= LEASE_DURATION {
                return false;
            }
            let expiry = m.changed_at + LEASE_DURATION;
            next_expiry = Some(next_expiry.map_or(expiry, |e| e.min(expiry)));
            members.push(holder.clone());
            if let Some(ack) = &m.ack {
                acks.insert(holder.clone(), ack.clone());
            }
            if !m.listed {
                unseen.insert(holder.clone());
            }
            true
        });
        self.next_expiry = next_expiry;
        (Ring::new(members), acks, unseen)
    }
}

/// What a replica knows of another member.
pub(super) struct Seen {
    /// When its Lease last changed (this replica's clock; see [`changed_at`]).
    changed_at: Instant,
    /// Its process ([`INSTANCE_ANNOTATION`](super::INSTANCE_ANNOTATION)) then.
    instance: Option<String>,
    /// The ring it acknowledged then ([`APPLIED_ANNOTATION`]).
    ack: Option<String>,
    /// Whether the last list showed its Lease as a live member's (not gone, not being
    /// deleted): else `ack` is only what it last said.
    listed: bool,
}

/// When a Lease seen changed at `now` (answer to this list) changed, given that the previous
/// list, sent at `previous`, did not show the change: its holder's `renewed` (`renewTime`, by
/// the holder's wall clock) read on this replica's wall clock `wall_now`, clamped into
/// `[max(previous, now − RETRY_PERIOD), now]`, the interval this replica knows it lies in
/// (narrowed to one round, so a skewed clock costs at most one round of accuracy and cannot
/// place it earlier). Without `renewed`, or with a `renewed` in this replica's future, `now`.
// The earliest expiry `changed_at` can give is past a dead holder's fence.
const _: () = assert!(RETRY_PERIOD.as_millis() < CLOCK_SKEW.as_millis());

fn changed_at(
    now: Instant,
    previous: Instant,
    renewed: Option<Timestamp>,
    wall_now: Timestamp,
) -> Instant {
    let earliest = previous.max(now.checked_sub(RETRY_PERIOD).unwrap_or(now));
    let Some(renewed) = renewed else {
        return now;
    };
    let Ok(ago) = Duration::try_from(wall_now.duration_since(renewed)) else {
        return now;
    };
    now.checked_sub(ago)
        .unwrap_or(earliest)
        .max(earliest)
        .min(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_placed_at_its_renew_time_within_what_this_replica_saw() {
        let now = Instant::now() + Duration::from_secs(60);
        let wall = Timestamp::from_second(1_000_000).unwrap();
        let secs = |s: f64| Duration::from_secs_f64(s);
        let ago = |s: f64| wall - secs(s);
        // Renewed 0.7 s ago, previous list 2 s ago: 0.7 s ago.
        assert_eq!(
            changed_at(now, now - secs(2.0), Some(ago(0.7)), wall),
            now - secs(0.7)
        );
        // Before the previous list (a clock behind): no earlier than the previous list.
        assert_eq!(
            changed_at(now, now - secs(1.5), Some(ago(9.0)), wall),
            now - secs(1.5)
        );
        // A slow round: no earlier than one RETRY_PERIOD before this answer.
        assert_eq!(
            changed_at(now, now - secs(7.0), Some(ago(6.0)), wall),
            now - RETRY_PERIOD
        );
        // A renewTime in the future (a clock ahead) or none: now.
        assert_eq!(
            changed_at(now, now - secs(2.0), Some(wall + secs(3.0)), wall),
            now
        );
        assert_eq!(changed_at(now, now - secs(2.0), None, wall), now);
    }
}
