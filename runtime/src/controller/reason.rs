//! Why a reconcile runs: the object changed, a child changed, a requeue, a resync or a retry
//! after an error, as noted by whatever queued the key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::key::ObjectKey;

/// Why a reconcile runs; given to the reconcile in
/// [`Attempt::reason`](super::Attempt::reason) and logged in its tracing span.
///
/// When several triggers merge into one reconcile (the queue deduplicates keys), the last one
/// noted wins; a dispatch at [`Priority::Resync`](crate::queue::Priority::Resync) is
/// [`Reason::Resync`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The primary object was created or changed (or listed for the first time).
    ObjectChanged,
    /// An owned child (or another watched trigger) changed.
    ChildChanged,
    /// The previous reconcile asked for a requeue ([`Action::requeue`](super::Action::requeue)).
    Requeue,
    /// The tenant its namespace names changed (a `tenant = namespace_label("...")` kind: the
    /// namespace gained, lost or changed the label, or was deleted).
    NamespaceChanged,
    /// The periodic anti-entropy resync.
    Resync,
    /// A retry after a failed reconcile (per-key backoff).
    Error,
}

impl Reason {
    /// The reason in words, as logged: `object changed`, `child changed`, `requeue`,
    /// `namespace changed`, `resync`, `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ObjectChanged => "object changed",
            Self::ChildChanged => "child changed",
            Self::Requeue => "requeue",
            Self::NamespaceChanged => "namespace changed",
            Self::Resync => "resync",
            Self::Error => "error",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The last trigger noted per key, until a worker takes it at dispatch.
#[derive(Clone, Debug, Default)]
pub(crate) struct Reasons(Arc<Mutex<HashMap<ObjectKey, Reason>>>);

impl Reasons {
    /// Notes that `key` was queued because of `reason`.
    pub(crate) fn note(&self, key: &ObjectKey, reason: Reason) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(key.clone(), reason);
        }
    }

    /// Drops what was noted for `key` (its object is gone).
    pub(crate) fn forget(&self, key: &ObjectKey) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(key);
        }
    }

    /// The reason of the dispatch of `key`: a resync dispatch is [`Reason::Resync`]; else the
    /// last noted trigger; else a retry ([`Reason::Error`]) when the key has failures, else a
    /// requeue.
    pub(crate) fn take(&self, key: &ObjectKey, resync: bool, failures: u32) -> Reason {
        let noted = self.0.lock().ok().and_then(|mut map| map.remove(key));
        match noted {
            _ if resync => Reason::Resync,
            Some(reason) => reason,
            None if failures > 0 => Reason::Error,
            None => Reason::Requeue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_noted_trigger_wins_and_is_taken_once() {
        let reasons = Reasons::default();
        let key = ObjectKey::cluster("Tenant", "acme");
        reasons.note(&key, Reason::ObjectChanged);
        reasons.note(&key, Reason::ChildChanged);
        assert_eq!(reasons.take(&key, false, 0), Reason::ChildChanged);
        assert_eq!(reasons.take(&key, false, 0), Reason::Requeue);
        assert_eq!(reasons.take(&key, false, 2), Reason::Error);
        reasons.note(&key, Reason::ObjectChanged);
        assert_eq!(reasons.take(&key, true, 0), Reason::Resync);
        assert_eq!(
            reasons.take(&key, false, 0),
            Reason::Requeue,
            "taken by the resync"
        );
    }
}
