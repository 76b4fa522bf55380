//! A replica that is not a member of the shard ring (started without `--shards`, single or
//! leader-elected) reconciles every object: beside a running ring, every object would be
//! reconciled twice. So such a replica looks at the ring's member Leases (label
//! [`MEMBER_LABEL`]) in its Lease namespace and refuses to work while the ring is live: a
//! member Lease renewed (its `resourceVersion` changed, or it appeared) while it looks. A ring
//! whose replicas are all gone leaves Leases nobody renews: they do not count.
//!
//! A replica that finds a live ring at start waits until no member Lease has been renewed for
//! a lease duration (say, the replicas of a Deployment switched from `--shards` being replaced
//! by rolling update: it is ready meanwhile, as a standby is, or the update would wait for it
//! forever while the ring it waits on is never replaced); one that finds a live ring while it
//! works or stands by stops every reconcile and exits (restarted, it waits as at start).
//!
//! At start it lists the Leases once; when one was renewed within a lease duration (by its
//! `renewTime`), it looks again for two rounds to see whether it is still renewed. Then, with
//! no live ring, it watches the member Leases from that list and lists again only when one
//! appears, changes or goes (an idle guard sends no request but the watch's reconnection);
//! where it may not watch, it lists every [`GUARD_POLL`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use super::membership::{HANDSHAKE_POLL, MEMBER_LABEL};
use crate::leader::{
    DEFAULT_LEASE_DURATION as LEASE_DURATION, DEFAULT_RETRY_PERIOD as RETRY_PERIOD,
};

/// How often a replica outside the ring lists the ring's member Leases when it cannot watch
/// them, or after a failed list.
pub const GUARD_POLL: Duration = Duration::from_secs(5);

/// The longest wait between two lists the API server refused (403): the wait doubles from
/// [`GUARD_POLL`] up to this, so a replica not allowed to list Leases there costs a request
/// every few minutes, not every few seconds.
pub const GUARD_REFUSED_MAX: Duration = Duration::from_secs(300);

/// How long to wait before listing again after the `refused`-th refused list in a row (1 for
/// the first).
fn refused_poll(refused: u32) -> Duration {
    let doublings = refused.saturating_sub(1).min(16);
    GUARD_POLL
        .saturating_mul(1 << doublings)
        .min(GUARD_REFUSED_MAX)
}

/// How long one watch of the member Leases lasts before the server ends it and it is
/// started again from the last resourceVersion seen (no list).
const WATCH_TIMEOUT_SECS: u32 = 290;

/// How long to wait before the next list: [`HANDSHAKE_POLL`] while the ring is not known
/// yet (the start waits for it), else `poll`.
fn unknown_or(tx: &watch::Sender<Ring>, poll: Duration) -> Duration {
    if *tx.borrow() == Ring::Unknown {
        HANDSHAKE_POLL
    } else {
        poll
    }
}

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
        // Whether the member Leases may be watched (until a watch is refused).
        let mut watchable = true;
        // Lists refused (403) in a row: said once, looked at again less and less often.
        let mut refused = 0u32;
        loop {
            let listed = tokio::time::timeout(RETRY_PERIOD * 2, api.list(&lp)).await;
            let (leases, version) = match listed {
                Ok(Ok(list)) => {
                    if refused > 0 {
                        tracing::info!(%namespace, "the shard ring's member Leases may be listed now: the guard against a running ring is on");
                        refused = 0;
                    }
                    (list.items, list.metadata.resource_version)
                }
                Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
                    if refused == 0 {
                        tracing::warn!(
                            error = %s.message,
                            %namespace,
                            "this replica may not list the Leases of its Lease namespace \
                             (--leader-elect-namespace; default the pod's, else the kubeconfig context's): it cannot \
                             tell whether a shard ring is running beside it, and works as if \
                             none were; grant it list and watch on leases there, or name the \
                             namespace where it may (looked at again less and less often)"
                        );
                    }
                    refused = refused.saturating_add(1);
                    if *tx.borrow() == Ring::Unknown {
                        // Cannot tell for good (not allowed to list): do not block the start.
                        tx.send_replace(Ring::None);
                    }
                    tokio::time::sleep(refused_poll(refused)).await;
                    continue;
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, %namespace, "listing the shard ring's member Leases failed");
                    // A transient failure (a 500, a 429 at start-up) tells nothing: still
                    // unknown, looked at again soon.
                    tokio::time::sleep(unknown_or(&tx, GUARD_POLL)).await;
                    continue;
                }
                Err(_) => {
                    tokio::time::sleep(unknown_or(&tx, GUARD_POLL)).await;
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
            if *tx.borrow() != Ring::None {
                tokio::time::sleep(RETRY_PERIOD + HANDSHAKE_POLL).await;
            } else if let (true, Some(version)) = (watchable, version) {
                watchable = until_changed(&api, &selector, version).await;
                if !watchable {
                    tokio::time::sleep(GUARD_POLL).await;
                }
            } else {
                tokio::time::sleep(GUARD_POLL).await;
            }
        }
    });
    rx
}

/// Watches the Leases labelled `selector` from resourceVersion `version` until one is added,
/// modified or deleted, or the watch cannot go on from there (then the caller lists again);
/// a watch the server ends on its timeout starts again from the last version seen. `false`
/// when watching is refused (403 or 405: the caller polls with lists instead).
async fn until_changed(api: &Api<Lease>, selector: &str, mut version: String) -> bool {
    let wp = WatchParams {
        bookmarks: true,
        ..WatchParams::default()
            .labels(selector)
            .timeout(WATCH_TIMEOUT_SECS)
    };
    loop {
        let stream = match api.watch(&wp, &version).await {
            Ok(stream) => stream,
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 405 => {
                tracing::warn!(error = %s.message, "the shard ring's member Leases may not be watched: listing them every few seconds instead");
                return false;
            }
            Err(e) => {
                tracing::debug!(error = %e, "watching the shard ring's member Leases failed");
                tokio::time::sleep(GUARD_POLL).await;
                return true;
            }
        };
        futures::pin_mut!(stream);
        loop {
            match stream.next().await {
                Some(Ok(WatchEvent::Bookmark(b))) => version = b.metadata.resource_version,
                Some(Ok(
                    WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_),
                )) => {
                    return true;
                }
                // Too old a version (410 Gone) or a broken stream: list again.
                Some(Ok(WatchEvent::Error(_)) | Err(_)) => return true,
                // Ended by the server's timeout: watch on from the last version.
                None => break,
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_list_is_tried_again_less_and_less_often_up_to_a_bound() {
        let waits: Vec<u64> = (1..=9).map(|n| refused_poll(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(refused_poll(u32::MAX), GUARD_REFUSED_MAX);
    }
}
