//! A replica that is not a member of the shard ring (started without `--shards`, single or
//! leader-elected) reconciles every object: beside a running ring, every object would be
//! reconciled twice. So such a replica looks at the ring's member Leases (label
//! [`MEMBER_LABEL`]) in its Lease namespace and refuses to work while the ring is live: a
//! member Lease renewed (its `resourceVersion` changed, or it appeared) while it looks. A ring
//! whose replicas are all gone leaves Leases nobody renews: they do not count.
//!
//! At start it lists the Leases once; when one was renewed within a lease duration (by its
//! `renewTime`), it looks again for two rounds to see whether it is still renewed. Then it
//! lists every [`GUARD_POLL`].

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use super::membership::{HANDSHAKE_POLL, MEMBER_LABEL};
use crate::leader::{LEASE_DURATION, RETRY_PERIOD};

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

/// Watches for a live shard ring in `namespace`; a [`Ring::Live`] is final.
pub fn start(client: Client, namespace: &str) -> watch::Receiver<Ring> {
    let (tx, rx) = watch::channel(Ring::Unknown);
    let api = Api::<Lease>::namespaced(client, namespace);
    let namespace = namespace.to_string();
    tokio::spawn(async move {
        let lp = ListParams::default().labels(MEMBER_LABEL);
        let mut seen: Option<HashMap<String, Option<String>>> = None;
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
            let now: HashMap<String, Option<String>> = leases
                .iter()
                .filter(|l| holder(l).is_some())
                .map(|l| (l.name_any(), l.resource_version()))
                .collect();
            let renewed: Vec<String> = match &seen {
                Some(before) => leases
                    .iter()
                    .filter(|l| {
                        let name = l.name_any();
                        now.contains_key(&name) && before.get(&name) != Some(&l.resource_version())
                    })
                    .filter_map(|l| holder(l).map(str::to_owned))
                    .collect(),
                None => Vec::new(),
            };
            if !renewed.is_empty() {
                let why = format!(
                    "the shard ring's members {renewed:?} renew their Leases (label {MEMBER_LABEL}) \
                     in namespace {namespace}: this replica was started without --shards beside a \
                     running ring and would reconcile every object a second time"
                );
                tx.send_replace(Ring::Live(why));
                return;
            }
            seen = Some(now);
            if *tx.borrow() == Ring::Unknown {
                if looks_left > 0 && leases.iter().any(recently_renewed) {
                    looks_left -= 1;
                    tokio::time::sleep(RETRY_PERIOD + HANDSHAKE_POLL).await;
                    continue;
                }
                tx.send_replace(Ring::None);
            }
            tokio::time::sleep(GUARD_POLL).await;
        }
    });
    rx
}

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
