//! A member's own Lease: the first look for another process of this identity, each
//! renewal (one replace at the resourceVersion last written), and the word that it left.

use std::collections::BTreeMap;
use std::time::Instant;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;

use super::{
    APPLIED_ANNOTATION, HANDSHAKE_POLL, INSTANCE_ANNOTATION, LEASE_DURATION, LEASE_SECONDS,
    LEFT_ANNOTATION, MEMBER_LABEL, Member, REQUEST_TIMEOUT,
};

impl Member {
    /// Writes [`LEFT_ANNOTATION`] into this replica's Lease (once nothing of it writes any
    /// more); returns the Lease's new resourceVersion.
    pub(super) async fn mark_left(&mut self) -> Result<Option<String>, kube::Error> {
        let mine = |lease: &Lease| instance_of(lease) == Some(self.instance.as_str());
        // This replica's Lease as it last wrote it; once more as read, when written since (a
        // renewal that timed out here but reached the server).
        for attempt in 0..2 {
            let mut lease = match self.own.take().filter(|own| mine(own)) {
                Some(own) => own,
                None => match self.api.get_opt(&self.name).await? {
                    Some(lease) if mine(&lease) => lease,
                    _ => return Ok(None),
                },
            };
            lease
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(LEFT_ANNOTATION.into(), self.instance.clone());
            match self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
            {
                Ok(written) => return Ok(written.metadata.resource_version),
                Err(kube::Error::Api(s)) if s.code == 409 && attempt == 0 => {}
                Err(e) => return Err(e),
            }
        }
        unreachable!("the second attempt returns")
    }

    /// At start: `Err(why)` when this replica's Lease is renewed by another process while
    /// this one looks (another replica runs with the same identity); else the Lease as last
    /// read (`None`: absent), which the first renewal replaces only at that resourceVersion
    /// (or creates), so a renewal landing after the look is found, not overwritten.
    ///
    /// A Lease of another process, or no Lease (one deleted by someone else under a live
    /// holder looks the same), is taken once it is known that nothing of another process
    /// writes any more: at once when that process wrote that it left ([`LEFT_ANNOTATION`]);
    /// else once a read sent a whole [`LEASE_DURATION`] after the first read was answered
    /// still shows it unchanged (or absent). That process's fence, extended from a renewal
    /// sent before that first answer, has closed by then, whatever the clocks of the two nodes
    /// say: a process that stopped renewing (a crash, or its Lease requests stalled) is waited
    /// for as long as its fence may stay open. So a replica's first start waits a lease
    /// duration, and so does a restart after a crash.
    pub(super) async fn renewed_by_another(&self) -> Result<Option<Lease>, String> {
        let get = || async {
            match tokio::time::timeout(REQUEST_TIMEOUT, self.api.get_opt(&self.name)).await {
                Ok(Ok(lease)) => {
                    self.block(None);
                    Ok(lease)
                }
                Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
                    let why = s.message.clone();
                    self.block(Some(s.message));
                    Err(why)
                }
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("timed out".to_string()),
            }
        };
        let first = loop {
            match get().await {
                Ok(lease) => break lease,
                Err(e) => {
                    // A refusal is said once, by `block`.
                    if self.assignment.borrow().blocked.is_none() {
                        tracing::warn!(error = %e, "reading the member Lease failed");
                    }
                    tokio::time::sleep(HANDSHAKE_POLL).await;
                }
            }
        };
        if first
            .as_ref()
            .is_some_and(|l| instance_of(l) == Some(self.instance.as_str()) || left(l))
        {
            return Ok(first);
        }
        let deadline = Instant::now() + LEASE_DURATION;
        tracing::info!(lease = %self.name,
            instance = first.as_ref().and_then(instance_of).unwrap_or("none"),
            "waiting a lease duration for any other process of this identity to renew its Lease or leave");
        let version = |l: &Option<Lease>| l.as_ref().map(|l| l.metadata.resource_version.clone());
        loop {
            tokio::time::sleep(HANDSHAKE_POLL).await;
            let sent = Instant::now();
            let Ok(now) = get().await else {
                continue;
            };
            if version(&now) != version(&first) {
                match &now {
                    Some(lease) if !left(lease) => {
                        return Err(format!(
                            "member Lease {} is renewed by another process with identity {} \
                             (instance {}): two replicas have the same identity",
                            self.name,
                            self.identity,
                            instance_of(lease).unwrap_or("unknown")
                        ));
                    }
                    // Left by its process, or deleted: nothing of it renews.
                    Some(_) => return Ok(now),
                    None => {}
                }
            }
            if sent >= deadline {
                return Ok(now);
            }
        }
    }

    /// Creates or renews this replica's Lease, carrying [`Member::applied`] and this
    /// process's id; [`Renewal::Taken`] once another process's id is in it.
    ///
    /// One request while nobody else wrote the Lease: a replace of [`Member::own`] at its
    /// resourceVersion. Only a conflict (someone wrote it: another process, or this one's
    /// earlier renewal that timed out here but reached the server) or a missing Lease reads it
    /// again and writes once more.
    pub(super) async fn renew(&mut self) -> Result<(), Renewal> {
        if let Some(own) = self.own.clone() {
            match self.write(Some(own)).await {
                Err(Renewal::Failed(kube::Error::Api(s))) if s.code == 409 || s.code == 404 => {
                    self.own = None;
                }
                other => return other,
            }
        }
        let existing = self.api.get_opt(&self.name).await?;
        // Written by another process since this one last wrote it, or (before the first
        // write) since this one looked at it at start: taken. A Lease without any process id
        // was not written by a replica (someone stripped the annotation); one that its
        // process left is free.
        if let Some(lease) = &existing
            && instance_of(lease).is_some_and(|other| other != self.instance)
            && (self.claimed || !left(lease))
        {
            return Err(Renewal::Taken(format!(
                "member Lease {} was renewed by another process with identity {} (instance {}): \
                 two replicas have the same identity",
                self.name,
                self.identity,
                instance_of(lease).unwrap_or("unknown")
            )));
        }
        self.write(existing).await
    }

    /// Writes this replica's Lease over `existing` (as read, or as last written), or creates
    /// it; keeps what the server returned in [`Member::own`].
    async fn write(&mut self, existing: Option<Lease>) -> Result<(), Renewal> {
        let now = MicroTime(Timestamp::now());
        let mut lease = existing.clone().unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        lease
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(MEMBER_LABEL.into(), self.ring.clone());
        lease
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(APPLIED_ANNOTATION.into(), self.applied.clone());
        let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(INSTANCE_ANNOTATION.into(), self.instance.clone());
        annotations.remove(LEFT_ANNOTATION);
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            spec.acquire_time = Some(now.clone());
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(LEASE_SECONDS as i32);
        spec.renew_time = Some(now);
        let written = match existing {
            None => self.api.create(&PostParams::default(), &lease).await?,
            Some(_) => {
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await?
            }
        };
        self.own = Some(written);
        self.claimed = true;
        Ok(())
    }
}

/// Why a renewal did not happen.
pub(super) enum Renewal {
    /// Another process renews this replica's Lease.
    Taken(String),
    /// The request failed.
    Failed(kube::Error),
}

impl From<kube::Error> for Renewal {
    fn from(e: kube::Error) -> Self {
        Self::Failed(e)
    }
}

/// Whether the process that renews `lease` wrote that it left the ring
/// ([`LEFT_ANNOTATION`] equal to [`INSTANCE_ANNOTATION`]).
pub(super) fn left(lease: &Lease) -> bool {
    let annotations = lease.metadata.annotations.as_ref();
    let get = |key: &str| annotations.and_then(|a| a.get(key));
    get(LEFT_ANNOTATION).is_some_and(|l| Some(l) == get(INSTANCE_ANNOTATION))
}

/// The process id in a member Lease ([`INSTANCE_ANNOTATION`]).
pub(super) fn instance_of(lease: &Lease) -> Option<&str> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(INSTANCE_ANNOTATION)
        .map(String::as_str)
}

/// An id of this process, different for every start: its pid and start time.
pub(super) fn instance_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos:x}", std::process::id())
}
