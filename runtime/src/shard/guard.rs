//! A replica that is not a member of the shard ring (started without `--shards`, single or
//! leader-elected) reconciles every object: beside a running ring, every object would be
//! reconciled twice. So such a replica looks at the ring's member Leases (label
//! [`MEMBER_LABEL`]) in its Lease namespace and refuses to work while the ring is live: a
//! member Lease renewed (its `resourceVersion` changed, or it appeared) while it looks. A ring
//! whose replicas are all gone leaves Leases nobody renews: they do not count.
//!
//! A replica that finds a live ring at start waits, not ready, until no member Lease has been
//! renewed for a lease duration (say, the replicas of a Deployment switched from `--shards`
//! being replaced by rolling update); one that finds a live ring while it works stops for good.
//!
//! At start it lists the Leases once; when one was renewed within a lease duration (by its
//! `renewTime`), it looks again for two rounds to see whether it is still renewed. Then it
//! lists every [`GUARD_POLL`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use super::membership::{HANDSHAKE_POLL, MEMBER_LABEL};
use crate::leader::{
    DEFAULT_LEASE_DURATION as LEASE_DURATION, DEFAULT_RETRY_PERIOD as RETRY_PERIOD,
};

/// How often a replica outside the ring lists the ring's member Leases.
pub const GUARD_POLL: Duration = Duration::from_secs(5);

/// What the guard found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ring {
    /// Not known yet (the first lists are under way).
    Unknown,
    /// No live ring.
    None,
    /// A live ring: why this replica must not work.
    Live(String),
}

/// Watches for a live shard ring named `ring` (its Leases labelled [`MEMBER_LABEL`]`=ring`) in
/// `namespace`: [`Ring::Live`] while a member Lease changed
/// (was renewed, or appeared) within a lease duration, [`Ring::None`] once none did.
pub fn start(client: Client, namespace: &str, ring: &str) -> watch::Receiver<Ring> {
    let (tx, rx) = watch::channel(Ring::Unknown);
    let api = Api::<Lease>::namespaced(client, namespace);
    let namespace = namespace.to_string();
    let selector = format!("{MEMBER_LABEL}={ring}");
    tokio::spawn(async move {
        let lp = ListParams::default().labels(&selector);
        let mut seen: Option<Seen> = None;
        // Looks left before Leases renewed just before the start count as not renewed.
        let mut looks_left = 2u32;
        loop {
            let listed = tokio::time::timeout(RETRY_PERIOD * 2, api.list(&lp)).await;
            let leases = match listed {
                Ok(Ok(list)) => list.items,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, %namespace, "listing the shard ring's member Leases failed");
                    if *tx.borrow() == Ring::Unknown {
                        // Cannot tell (e.g. not allowed to list): do not block the start.
                        tx.send_replace(Ring::None);
                    }
                    tokio::time::sleep(GUARD_POLL).await;
                    continue;
                }
                Err(_) => {
                    tokio::time::sleep(GUARD_POLL).await;
                    continue;
                }
            };
            let at = Instant::now();
            let now: Seen = leases
                .iter()
                .filter(|l| holder(l).is_some())
                .map(|l| {
                    let rv = l.resource_version();
                    let changed = match seen.as_ref().map(|s| s.get(&l.name_any())) {
                        // First list: not seen changing (yet).
                        None => None,
                        Some(Some((before, changed))) if *before == rv => *changed,
                        // Renewed, or created, since the previous list.
                        Some(_) => Some(at),
                    };
                    (l.name_any(), (rv, changed))
                })
                .collect();
            let renewed: Vec<String> = leases
                .iter()
                .filter(|l| {
                    now.get(&l.name_any())
                        .and_then(|(_, c)| *c)
                        .is_some_and(|c| at.duration_since(c) < LEASE_DURATION)
                })
                .filter_map(|l| holder(l).map(str::to_owned))
                .collect();
            seen = Some(now);
            if !renewed.is_empty() {
                let why = format!(
                    "the shard ring's members {renewed:?} renew their Leases (label {MEMBER_LABEL}) \
                     in namespace {namespace}: this replica was started without --shards beside a \
                     running ring and would reconcile every object a second time"
                );
                if !matches!(*tx.borrow(), Ring::Live(_)) {
                    tx.send_replace(Ring::Live(why));
                }
            } else if *tx.borrow() == Ring::Unknown
                && looks_left > 0
                && leases.iter().any(recently_renewed)
            {
                looks_left -= 1;
                tokio::time::sleep(RETRY_PERIOD + HANDSHAKE_POLL).await;
                continue;
            } else if *tx.borrow() != Ring::None {
                tx.send_replace(Ring::None);
            }
            let poll = if *tx.borrow() == Ring::None {
                GUARD_POLL
            } else {
                RETRY_PERIOD + HANDSHAKE_POLL
            };
            tokio::time::sleep(poll).await;
        }
    });
    rx
}

/// Per member Lease: its resourceVersion, and when this replica saw it change.
type Seen = HashMap<String, (Option<String>, Option<Instant>)>;

fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
}

/// Whether `lease` was renewed within a lease duration by its `renewTime` (or has none, or
/// one in this replica's future).
fn recently_renewed(lease: &Lease) -> bool {
    holder(lease).is_some()
        && lease
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .and_then(|t| Duration::try_from(Timestamp::now().duration_since(t.0)).ok())
            .is_none_or(|ago| ago < LEASE_DURATION)
}
