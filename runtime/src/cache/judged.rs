//! The stubs of idem's children last judged converged, so that a pass reads such a child from
//! the API server only once it or its desired body changed.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::compare::Fingerprint;
use crate::key::ObjectKey;

/// The most children remembered; past it one is forgotten for each new one (read once more).
const JUDGED_CAP: usize = 10_000;

/// What a pass judged of a child the caches keep as a stub (a tenant owner added more to it than
/// the caches keep whole): converged at this `resourceVersion` and uid, for this desired body.
/// While the store's stub shows the same version, and its store has not relisted since (a
/// restored etcd may give a version again), nothing of the object changed, and a pass
/// desiring the same body would judge it the same way: it need not read it again. Each
/// remembered child is one of idem's desired children, so the memory is bounded by what the
/// owners desire.
#[derive(Default)]
pub(crate) struct JudgedStubs {
    converged: Mutex<HashMap<ObjectKey, Judged>>,
}

#[derive(PartialEq, Eq)]
struct Judged {
    uid: Box<str>,
    /// The `resourceVersion`, and the relists its store had completed.
    at: (u64, u64),
    desired: Fingerprint,
}

impl JudgedStubs {
    /// Remembers that the child at `key` (`uid`, at `(resourceVersion, relists)`) was judged
    /// converged with `desired`.
    pub(crate) fn converged(
        &self,
        key: &ObjectKey,
        uid: &str,
        at: (u64, u64),
        desired: Fingerprint,
    ) {
        if let Ok(mut map) = self.converged.lock() {
            if map.len() >= JUDGED_CAP
                && !map.contains_key(key)
                && let Some(any) = map.keys().next().cloned()
            {
                map.remove(&any);
            }
            map.insert(
                key.clone(),
                Judged {
                    uid: uid.into(),
                    at,
                    desired,
                },
            );
        }
    }

    /// Whether the child at `key`, held as a stub of `uid` at `(resourceVersion, relists)`,
    /// was judged converged with `desired` there.
    pub(crate) fn still_converged(
        &self,
        key: &ObjectKey,
        uid: &str,
        at: (u64, u64),
        desired: Fingerprint,
    ) -> bool {
        let want = Judged {
            uid: uid.into(),
            at,
            desired,
        };
        self.converged
            .lock()
            .is_ok_and(|map| map.get(key) == Some(&want))
    }

    /// Forgets the child at `key` (written, or deleted).
    pub(crate) fn forget(&self, key: &ObjectKey) {
        if let Ok(mut map) = self.converged.lock() {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::fingerprint;
    use serde_json::json;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            kind: "ConfigMap".into(),
            namespace: Some("t-a".into()),
            name: name.into(),
        }
    }

    #[test]
    fn converged_only_at_the_same_version_uid_and_desired_body() {
        let judged = JudgedStubs::default();
        let (one, two) = (fingerprint(&json!({"a": 1})), fingerprint(&json!({"a": 2})));
        assert!(!judged.still_converged(&key("c"), "u", (7, 0), one));
        judged.converged(&key("c"), "u", (7, 0), one);
        assert!(judged.still_converged(&key("c"), "u", (7, 0), one));
        assert!(!judged.still_converged(&key("c"), "u", (8, 0), one));
        assert!(
            !judged.still_converged(&key("c"), "u", (7, 1), one),
            "relisted since"
        );
        assert!(!judged.still_converged(&key("c"), "v", (7, 0), one));
        assert!(!judged.still_converged(&key("c"), "u", (7, 0), two));
        assert!(!judged.still_converged(&key("d"), "u", (7, 0), one));
        judged.forget(&key("c"));
        assert!(!judged.still_converged(&key("c"), "u", (7, 0), one));
    }

    #[test]
    fn past_the_cap_one_is_forgotten_for_each_new_one() {
        let judged = JudgedStubs::default();
        let print = fingerprint(&json!({}));
        for i in 0..JUDGED_CAP + 5 {
            judged.converged(&key(&format!("c{i}")), "u", (1, 0), print);
        }
        let map = judged.converged.lock().unwrap();
        assert_eq!(map.len(), JUDGED_CAP);
        assert!(map.contains_key(&key(&format!("c{}", JUDGED_CAP + 4))));
    }
}
