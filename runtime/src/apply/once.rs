//! Create-once children: children made when absent and never changed afterwards (a generated
//! password, a key pair, a random suffix), declared with [`DesiredChildren::create_once`].
//!
//! Rules (applied by the engine, `engine/once.rs`):
//! - Absent (the cache shows none, and the owner's record holds none at its key): `make` is
//!   called and its object created with one `POST`. A create that meets AlreadyExists takes
//!   what is there (read once by name): concurrent reconciles agree on the one object that won
//!   the create, and no reconcile ever applies over it. `make` is called only to create.
//! - Present: never written, except for idem's ownership metadata — the owner's labels and
//!   controller ownerReference — which is put back by one server-side apply of just those
//!   fields when someone removed or changed it (the child caches select by those labels),
//!   reported as a [`Repair`](super::Repair) (the `DriftRepaired` Event names the labels and
//!   who changed them). A converged pass makes no request.
//! - Found by name when hidden: a child the owner's record holds that the label-selected cache
//!   does not show is read by name (one GET, only then), so a child whose labels someone
//!   changed keeps its value.
//! - Deleted (the record holds it, the API server does not, or holds another object at its
//!   name): [`ApplyError::ChildDeleted`](super::ApplyError::ChildDeleted), a terminal error
//!   (`Stalled`, reason `ChildDeleted`, and a Warning Event of that reason) — a new value that
//!   the users of the old one do not know is never made silently. Kinds opted in with
//!   [`DesiredChildren::regenerate_deleted`] are created anew instead, with a Warning Event
//!   `Regenerated`. Telling deleted from never created needs the owner's record
//!   ([`Reconciler::child_record`](crate::reconciler::Reconciler::child_record)): without one,
//!   a deleted create-once child is created again.
//! - Otherwise a child like any other: recorded, pruned once no longer desired, and an object
//!   at its name the owner does not own is `NotOwned` (its value is never taken).

use std::sync::Arc;

use kube::Resource;
use kube::core::ApiResource;
use serde::Serialize;
use serde_json::{Value, json};

use super::owner::{ChildScope, CreateOnce, DesiredChild, DesiredChildren};
use super::{ApplyError, Labels};
use crate::key::ObjectKey;

/// Removes idem's fingerprint annotation (the owner kind's, `labels`) from a stamped
/// create-once body (and the annotations map when nothing else is left in it).
pub(crate) fn unprinted(mut body: Value, labels: Labels) -> Value {
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        let empty = match meta.get_mut("annotations").and_then(Value::as_object_mut) {
            Some(a) => {
                a.remove(labels.fingerprint());
                a.is_empty()
            }
            None => false,
        };
        if empty {
            meta.remove("annotations");
        }
    }
    body
}

impl DesiredChildren {
    /// Adds a create-once child of kind `K` named `name` (in the owner's namespace when `K` is
    /// namespaced): created from `make()` when absent, never changed afterwards — for values
    /// generated once (a password, a key pair, a random suffix). Concurrent reconciles agree on
    /// the one object that won the create; only idem's labels and ownerReference on it are
    /// kept up to date. A deleted one is a terminal error (`Stalled`, reason `ChildDeleted`)
    /// unless `K` is opted in with [`DesiredChildren::regenerate_deleted`]. Its kind is pruned
    /// like any child's. `make` is called only when the child is created (its name and
    /// namespace are set from `name`).
    ///
    /// Absent (the cache shows none and the owner's record holds none at its key), it is
    /// created with one `POST`; a create that meets AlreadyExists takes what is there. Present,
    /// it is never written, except that idem's labels and controller ownerReference are put
    /// back (one apply of just those fields) when someone removed or changed them; one the
    /// label-selected cache no longer shows but the record holds is read by name (one GET,
    /// only then). A converged pass makes no request. Telling deleted from never created needs
    /// the owner's record
    /// ([`Reconciler::child_record`](crate::reconciler::Reconciler::child_record)): without
    /// one, a deleted create-once child is created again. An object at its name the owner does
    /// not own is [`NotOwned`](super::ChildOutcome::NotOwned): its value is never taken.
    ///
    /// To use the live child's value in other children, read it with
    /// [`Pass::ensure_once`](crate::reconciler::Pass::ensure_once) before adding them.
    pub fn create_once<K, F>(&mut self, name: &str, make: F) -> &mut Self
    where
        K: Resource<DynamicType = ()> + Serialize + 'static,
        K::Scope: ChildScope,
        F: Fn() -> K + Send + Sync + 'static,
    {
        self.create_once_at::<K, F>(None, name, make)
    }

    /// As [`DesiredChildren::create_once`], in `namespace` (for a cluster-scoped owner's
    /// namespaced child).
    pub fn create_once_in<K, F>(&mut self, namespace: &str, name: &str, make: F) -> &mut Self
    where
        K: Resource<DynamicType = ()> + Serialize + 'static,
        K::Scope: ChildScope,
        F: Fn() -> K + Send + Sync + 'static,
    {
        self.create_once_at::<K, F>(Some(namespace), name, make)
    }

    fn create_once_at<K, F>(&mut self, namespace: Option<&str>, name: &str, make: F) -> &mut Self
    where
        K: Resource<DynamicType = ()> + Serialize + 'static,
        K::Scope: ChildScope,
        F: Fn() -> K + Send + Sync + 'static,
    {
        let kind = K::kind(&()).into_owned();
        let make = move || -> Result<Value, ApplyError> {
            let mut one = DesiredChildren::new();
            let mut made = make();
            made.meta_mut().name = Some("made".to_owned());
            one.add(&made)?;
            Ok(one.children.pop().map(|c| c.body).unwrap_or_default())
        };
        let resource = ApiResource::erase::<K>(&());
        let regenerate = self.regenerate.contains(&resource);
        let mut metadata = json!({ "name": name });
        if let Some(ns) = namespace {
            metadata["namespace"] = json!(ns);
        }
        self.children.push(DesiredChild {
            namespaced: <K::Scope as ChildScope>::NAMESPACED,
            key: ObjectKey {
                kind: kind.as_str().into(),
                namespace: namespace.map(Into::into),
                name: name.into(),
            },
            body: json!({
                "apiVersion": K::api_version(&()),
                "kind": kind,
                "metadata": metadata,
            }),
            recreate: false,
            release_orphan: self.release_orphans.contains(&resource),
            once: Some(CreateOnce {
                make: Arc::new(make),
                regenerate,
            }),
            resource,
        });
        self.prune_kind::<K>();
        self
    }

    /// Opts kind `K` in to regenerating deleted create-once children: instead of stalling with
    /// `ChildDeleted`, a create-once child of `K` the owner's record holds and the API server
    /// no longer has is created anew from its `make` (a new value: its users must pick it up),
    /// with a Warning Event `Regenerated`. Applies to children of `K` added before and after
    /// this call.
    pub fn regenerate_deleted<K>(&mut self) -> &mut Self
    where
        K: Resource<DynamicType = ()>,
    {
        let ar = ApiResource::erase::<K>(&());
        for c in &mut self.children {
            if let Some(once) = c.once.as_mut()
                && c.resource == ar
            {
                once.regenerate = true;
            }
        }
        if !self.regenerate.contains(&ar) {
            self.regenerate.push(ar);
        }
        self
    }

    /// The create-once child of kind `kind` named `name`, if one was added.
    pub(crate) fn once_child(&self, kind: &str, name: &str) -> Option<&DesiredChild> {
        self.children.iter().find(|c| {
            c.once.is_some() && c.key.kind.as_ref() == kind && c.key.name.as_ref() == name
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::labels::FINGERPRINT_ANNOTATION;

    #[test]
    fn make_is_called_only_for_the_body_and_the_name_is_the_declared_one() {
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = Arc::clone(&calls);
        let mut d = DesiredChildren::new();
        d.create_once::<Secret, _>("db", move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Secret {
                metadata: ObjectMeta {
                    name: Some("ignored".into()),
                    ..ObjectMeta::default()
                },
                string_data: Some([("password".to_owned(), "x".to_owned())].into()),
                ..Secret::default()
            }
        });
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
        let child = d.once_child("Secret", "db").expect("declared");
        assert!(!d.kinds.is_empty(), "its kind is pruned");
        let key = ObjectKey::namespaced("Secret", "ns", "db");
        let body = child.once.as_ref().unwrap().body(&key).unwrap();
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(body["metadata"]["name"], "db");
        assert_eq!(body["metadata"]["namespace"], "ns");
        // Made as `add` makes a body: a Secret's stringData folded into data.
        assert_eq!(body["data"]["password"], "eA==");
        assert_eq!(body["kind"], "Secret");
    }

    #[test]
    fn regenerating_is_an_opt_in_of_the_kind_before_or_after_the_child() {
        let mut d = DesiredChildren::new();
        d.create_once::<Secret, _>("a", Secret::default);
        assert!(
            !d.once_child("Secret", "a")
                .unwrap()
                .once
                .as_ref()
                .unwrap()
                .regenerate
        );
        d.regenerate_deleted::<Secret>();
        d.create_once::<Secret, _>("b", Secret::default);
        for name in ["a", "b"] {
            assert!(
                d.once_child("Secret", name)
                    .unwrap()
                    .once
                    .as_ref()
                    .unwrap()
                    .regenerate
            );
        }
    }

    #[test]
    fn the_fingerprint_annotation_is_dropped() {
        let body = json!({"metadata": {"annotations": {FINGERPRINT_ANNOTATION: "1"}}});
        assert_eq!(unprinted(body, Labels::operator()), json!({"metadata": {}}));
        let body = json!({"metadata": {"annotations": {FINGERPRINT_ANNOTATION: "1", "a": "b"}}});
        assert_eq!(
            unprinted(body, Labels::operator()),
            json!({"metadata": {"annotations": {"a": "b"}}})
        );
    }
}
