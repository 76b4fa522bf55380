//! Releasing an object from an owner, as `kubectl delete --cascade=orphan` has the garbage
//! collector do: every ownerReference to the owner's uid (controller or not: the collector
//! deletes a dependent whose owners are all gone, whichever reference names them) and the
//! owner-uid label naming it ([`Labels::owner_uid`] of the owner's kind) are removed; nothing else changes. The object is then no
//! longer the owner's: neither pruned nor repaired, and kept when the owner is deleted.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

use super::{Labels, is_conflict, is_not_found};

/// How often a release is tried again after 409 Conflict (someone changed the object since
/// it was read), reading it again each time.
const ATTEMPTS: u32 = 5;

/// Whether `meta` refers to `owner_uid` the way the garbage collector reads it: any
/// ownerReference with that uid, `controller` or not.
pub fn refers_to(meta: &ObjectMeta, owner_uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| r.uid == owner_uid)
}

/// The JSON merge patch that releases `meta` from `owner_uid` (an owner of a kind with
/// `labels`), guarded by its `resourceVersion`; `None` when nothing on it names the owner.
fn release_patch(meta: &ObjectMeta, labels: Labels, owner_uid: &str) -> Option<Value> {
    let labelled = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(labels.owner_uid()))
        .is_some_and(|v| v == owner_uid);
    if !labelled && !refers_to(meta, owner_uid) {
        return None;
    }
    let mut patch = json!({"metadata": {"resourceVersion": meta.resource_version}});
    if refers_to(meta, owner_uid) {
        // A merge patch replaces the list: the other owners' references, as read, stay.
        let others: Vec<_> = meta
            .owner_references
            .iter()
            .flatten()
            .filter(|r| r.uid != owner_uid)
            .collect();
        patch["metadata"]["ownerReferences"] = if others.is_empty() {
            Value::Null
        } else {
            json!(others)
        };
    }
    if labelled {
        patch["metadata"]["labels"] = json!({ labels.owner_uid(): null });
    }
    Some(patch)
}

/// Releases the object `meta` (as read, with its `uid` and `resourceVersion`) of kind
/// `resource` from the owner with `owner_uid`, whose kind's label names are `labels`
/// ([`Labels::of`] the owner kind): one JSON merge patch (any kind, custom
/// resources too) guarded by the `resourceVersion`, so a concurrent change is never
/// overwritten: on 409 the object is read again and released again, unless it was replaced
/// by another object of the same name (another uid: not ours to touch).
///
/// Returns whether the object exists and named the owner (`false`: nothing to do, no request
/// made, or it is gone).
///
/// # Errors
/// The API's error; [`kube::Error`] of the last conflict after a few attempts.
pub async fn release(
    client: &Client,
    resource: &ApiResource,
    meta: &ObjectMeta,
    labels: Labels,
    owner_uid: &str,
) -> Result<bool, kube::Error> {
    let api = match meta.namespace.as_deref() {
        Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, resource),
        None => Api::<DynamicObject>::all_with(client.clone(), resource),
    };
    let name = meta.name.clone().unwrap_or_default();
    let mut meta = meta.clone();
    let mut attempt = 0;
    loop {
        let Some(patch) = release_patch(&meta, labels, owner_uid) else {
            return Ok(false);
        };
        let err = match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(e) if is_not_found(&e) => return Ok(false),
            Err(e) => e,
        };
        attempt += 1;
        if !is_conflict(&err) || attempt >= ATTEMPTS {
            return Err(err);
        }
        match api.get_metadata_opt(&name).await? {
            Some(now) if now.metadata.uid == meta.uid => meta = now.metadata,
            _ => return Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::OWNER_UID_LABEL;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn reference(uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "o".into(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: None,
        }
    }

    #[test]
    fn the_patch_removes_every_reference_to_the_owner_and_its_label_only() {
        let meta = ObjectMeta {
            resource_version: Some("7".into()),
            owner_references: Some(vec![reference("ours", false), reference("other", true)]),
            labels: Some([(OWNER_UID_LABEL.to_owned(), "ours".to_owned())].into()),
            ..ObjectMeta::default()
        };
        let patch = release_patch(&meta, Labels::operator(), "ours").expect("a patch");
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        let refs = patch["metadata"]["ownerReferences"].as_array().unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0]["uid"], "other");
        assert_eq!(patch["metadata"]["labels"][OWNER_UID_LABEL], Value::Null);
    }

    #[test]
    fn another_owners_label_stays_and_nothing_to_release_makes_no_patch() {
        let meta = ObjectMeta {
            owner_references: Some(vec![reference("ours", true)]),
            labels: Some([(OWNER_UID_LABEL.to_owned(), "other".to_owned())].into()),
            ..ObjectMeta::default()
        };
        let patch = release_patch(&meta, Labels::operator(), "ours").expect("a patch");
        assert_eq!(patch["metadata"]["ownerReferences"], Value::Null);
        assert!(patch["metadata"].get("labels").is_none(), "{patch}");
        assert_eq!(release_patch(&meta, Labels::operator(), "someone"), None);
    }
}
