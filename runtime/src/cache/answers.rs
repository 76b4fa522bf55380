//! The API server's answers for desired bodies the convergence check cannot judge alone, kept
//! per child as fingerprints so that a converged pass asks nothing.
//!
//! When [`crate::compare::check`] finds a difference it cannot tell from the server's own
//! normalisation (see [`crate::compare::settled`]), the engine asks the server once with a
//! `dryRun=All` apply, or learns the answer from a real apply's or create's response, and
//! keeps `(uid, desired fingerprint) → settled fingerprint` here. A later pass with the same
//! desired body and the same object compares the live object's settled fingerprint with the
//! answer: equal means the apply would change nothing. About 100 bytes per child that needs
//! it (most children never do), kept with the controller's child caches so that every pass
//! shares them, and dropped when the child is deleted (its watch's event), pruned or found
//! not ours.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;

use crate::compare::{Fingerprint, settled};
use crate::key::ObjectKey;

/// Answers per child, shared by the clones of one applier.
#[derive(Clone, Debug, Default)]
pub(crate) struct Answers {
    inner: Arc<Mutex<HashMap<ObjectKey, Answer>>>,
}

#[derive(Debug)]
struct Answer {
    uid: String,
    desired: Fingerprint,
    settled: Option<Fingerprint>,
}

impl Answers {
    /// The answer for object `uid` at `key` and the desired body with fingerprint `desired`:
    /// `Some(settled)` when known.
    pub(crate) fn get(
        &self,
        key: &ObjectKey,
        uid: &str,
        desired: Fingerprint,
    ) -> Option<Option<Fingerprint>> {
        let map = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(key)
            .filter(|a| a.uid == uid && a.desired == desired)
            .map(|a| a.settled)
    }

    /// Keeps the server's answer `obj` (the object an apply of the desired body with
    /// fingerprint `desired` leaves) for `key`, and returns its settled fingerprint.
    pub(crate) fn learn(
        &self,
        key: &ObjectKey,
        desired: Fingerprint,
        obj: &Value,
        manager: &str,
    ) -> Option<Fingerprint> {
        let uid = obj
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let s = settled(obj, manager);
        let mut map = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        map.insert(
            key.clone(),
            Answer {
                uid,
                desired,
                settled: s,
            },
        );
        s
    }

    /// Drops the answer for `key` (the child was deleted, or the check decides it alone).
    pub(crate) fn forget(&self, key: &ObjectKey) {
        let mut map = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(key);
    }

    /// Object `uid` at `key` was deleted: its answer goes (an answer for a newer object at
    /// the name stays).
    pub(crate) fn deleted(&self, key: &ObjectKey, uid: &str) {
        let mut map = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if map.get(key).is_some_and(|a| a.uid == uid) {
            map.remove(key);
        }
    }

    /// How many children have an answer.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Answers;
    use crate::compare::fingerprint;
    use crate::key::ObjectKey;

    #[test]
    fn an_answer_holds_for_the_same_object_and_desired_body_only() {
        let answers = Answers::default();
        let key = ObjectKey {
            kind: "StatefulSet".into(),
            namespace: Some("ns".into()),
            name: "db".into(),
        };
        let desired = fingerprint(&json!({"spec": 1}));
        let obj = json!({"metadata": {"uid": "u1", "managedFields": [
            {"manager": "idem", "operation": "Apply", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"a": 1}});
        let s = answers.learn(&key, desired, &obj, "idem");
        assert!(s.is_some());
        assert_eq!(answers.get(&key, "u1", desired), Some(s));
        assert_eq!(answers.get(&key, "u2", desired), None, "another object");
        let other = fingerprint(&json!({"spec": 2}));
        assert_eq!(answers.get(&key, "u1", other), None, "another desired body");
        answers.deleted(&key, "u2");
        assert_eq!(answers.len(), 1, "the delete of another object at the name");
        answers.deleted(&key, "u1");
        assert_eq!(answers.len(), 0);
    }
}
