//! Pruning: the owner's recorded children no longer desired are deleted (or released), those
//! whose deletion is held stay recorded until they are gone (rules: [`crate::apply::record`]).

use std::collections::BTreeSet;

use kube::api::{DeleteParams, ListParams};
use kube::core::ApiResource;

use super::Applier;
use crate::apply::report::ApplyReport;
use crate::apply::{ApplyError, Owner, is_conflict, is_not_found};
use crate::key::ObjectKey;

/// One pruned kind and how its undesired children go.
pub(super) struct PruneKind<'a> {
    pub(super) resource: &'a ApiResource,
    pub(super) namespaced: bool,
    /// The kind releases orphans ([`crate::apply::DesiredChildren::release_orphans`]).
    pub(super) release_orphans: bool,
    /// The kind's undesired children are released instead of deleted
    /// ([`crate::apply::DesiredChildren::release_undesired`]).
    pub(super) release_undesired: bool,
    /// Namespaces whose children are released instead of deleted.
    pub(super) release_in: &'a BTreeSet<String>,
}

impl Applier {
    /// Deletes the owner's children of kind `kind.resource` that are not in `keep` (or
    /// releases them, see [`crate::apply::DesiredChildren::release_in`]).
    ///
    /// Rule (see [`crate::apply::record`]): an object is deleted only when its uid is in the owner's
    /// record of children it created ([`Owner::may_prune`]) and it is still the owner's: it
    /// carries the owner's controller ownerReference (matched by uid), or — for kinds that do
    /// not release orphans — it lost that reference and its labels to someone's edit (found
    /// by its recorded key and uid). The reference and the labels the list is made by can be
    /// forged by anyone who may create the kind there; the record, in the owner's status,
    /// cannot. An object that claims the owner without being recorded is left alone, and
    /// reported in [`ApplyReport::unrecorded`] when it is where the owner's children are (for a
    /// cluster-scoped owner, a namespace its record holds). A recorded object of a kind that releases
    /// orphans whose reference was removed is released ([`ApplyReport::released`]), never
    /// deleted.
    pub(super) async fn prune_kind(
        &self,
        owner: &Owner,
        kind: &PruneKind<'_>,
        keep: &BTreeSet<ObjectKey>,
        report: &mut ApplyReport,
    ) -> Result<(), ApplyError> {
        let resource = kind.resource;
        // A namespaced owner's children live in its namespace; a cluster-scoped owner's
        // namespaced children may be anywhere.
        let scope = if kind.namespaced {
            owner.namespace()
        } else {
            None
        };
        let kind_key = |ns: Option<&str>, name: &str| ObjectKey {
            kind: resource.kind.as_str().into(),
            namespace: ns.map(Into::into),
            name: name.into(),
        };
        let cached = self
            .caches
            .as_ref()
            .and_then(|c| c.owned_by(resource, scope, owner.label_names(), owner.uid()));
        let items = match cached {
            Some(items) => items,
            None => {
                let api = self.api(resource, scope);
                let lp = ListParams::default().labels(&format!(
                    "{}={}",
                    owner.label_names().owner_uid(),
                    owner.uid()
                ));
                api.list_metadata(&lp)
                    .await
                    .map_err(|source| ApplyError::Api {
                        child: kind_key(scope, "*"),
                        action: "list",
                        source: Box::new(source),
                    })?
                    .items
                    .into_iter()
                    .map(|o| o.metadata)
                    .collect()
            }
        };
        // A cluster-scoped owner's claimants are reported only in the namespaces it holds
        // children in: an object in another tenant's namespace that copies its uid says
        // nothing about it, and a Warning on it would be that tenant's to write.
        let reported_in = (scope.is_none() && kind.namespaced)
            .then(|| owner.recorded_namespaces())
            .flatten();
        let mut listed = BTreeSet::new();
        for meta in items {
            let name = meta.name.clone().unwrap_or_default();
            let key = kind_key(meta.namespace.as_deref(), &name);
            if !owner.owns(&meta) {
                continue;
            }
            listed.insert(key.clone());
            report.claiming.push(key.clone());
            if keep.contains(&key) {
                continue;
            }
            let uid = meta.uid.clone().unwrap_or_default();
            if meta.deletion_timestamp.is_some() {
                // Its deletion is under way: no second DELETE; held, it is still in effect.
                if owner.may_prune(&uid) {
                    held(report, key, &meta);
                }
                continue;
            }
            if !owner.may_prune(&uid) {
                let elsewhere = reported_in.as_ref().is_some_and(|held| {
                    key.namespace
                        .as_deref()
                        .is_some_and(|ns| !held.contains(ns))
                });
                if !elsewhere {
                    // Said once per set by the owner's `NotPruned` Event; a line per object
                    // and pass would let whoever forges them flood the log.
                    tracing::debug!(child = %key, %uid, "claims the owner but was not created by it: not pruned");
                    report.unrecorded.push(key);
                }
                continue;
            }
            self.remove(owner, kind, key, &meta, report).await?;
        }
        // Recorded children the list did not show: someone removed the labels it selects by
        // (and perhaps the ownerReference), or they are gone. Each is looked up by its key:
        // one read, from the cache when it holds the object (else from the API server, so
        // that a cache that does not show a child yet never makes it gone), once (it then
        // leaves the record, pruned, released or found gone).
        let unlisted: Vec<(String, ObjectKey)> = owner
            .recorded_of_kind(&resource.kind)
            .filter(|(_, key)| !listed.contains(*key) && !keep.contains(*key))
            .filter(|(_, key)| scope.is_none() || key.namespace.as_deref() == scope)
            .map(|(uid, key)| (uid.to_owned(), key.clone()))
            .collect();
        for (uid, key) in unlisted {
            let cached = self
                .caches
                .as_ref()
                .and_then(|c| c.get(resource, &key))
                .flatten();
            let live = match cached {
                Some(live) => Some(live),
                None => self.get(resource, &key).await?,
            };
            let Some(live) = live else {
                // Gone (the API server says so): it leaves the record.
                report.pruned_uids.push(uid);
                continue;
            };
            let meta: kube::api::ObjectMeta =
                serde_json::from_value(live.get("metadata").cloned().unwrap_or_default())
                    .unwrap_or_default();
            // Replaced by another object of the same name (not ours; ours is gone).
            if meta.uid.as_deref() != Some(uid.as_str()) {
                report.pruned_uids.push(uid);
                continue;
            }
            // Being deleted: it stays recorded until it is gone.
            if meta.deletion_timestamp.is_some() {
                held(report, key, &meta);
                continue;
            }
            if kind.release_orphans && !owner.owns(&meta) {
                // An administrator released it (see `DesiredChildren::release_orphans`).
                report.released.push(key);
                report.released_uids.push(uid);
                continue;
            }
            self.remove(owner, kind, key, &meta, report).await?;
        }
        Ok(())
    }

    /// Deletes the recorded child `key` (`meta` as read; uid precondition), or releases it
    /// when its kind or the namespace it lives in has undesired children released.
    async fn remove(
        &self,
        owner: &Owner,
        kind: &PruneKind<'_>,
        key: ObjectKey,
        meta: &kube::api::ObjectMeta,
        report: &mut ApplyReport,
    ) -> Result<(), ApplyError> {
        let uid = meta.uid.clone().unwrap_or_default();
        self.answers.forget(&key);
        if let Some(c) = &self.caches {
            c.forget(&key);
        }
        if kind.release_undesired
            || meta
                .namespace
                .as_ref()
                .is_some_and(|ns| kind.release_in.contains(ns))
        {
            // A stub keeps the controller ownerReference only: the release keeps the others,
            // so it works from the object's metadata as the API server has it.
            let stub = (self.caches.as_ref()).is_some_and(|c| c.is_stub(kind.resource, &key));
            let read;
            let meta = if stub {
                let api = self.api(kind.resource, meta.namespace.as_deref());
                read = api
                    .get_metadata_opt(&key.name)
                    .await
                    .map_err(|source| ApplyError::Api {
                        child: key.clone(),
                        action: "get",
                        source: Box::new(source),
                    })?;
                match &read {
                    Some(now) if now.metadata.uid == meta.uid => &now.metadata,
                    _ => meta,
                }
            } else {
                meta
            };
            let _in_flight = self.begin_write(&key);
            crate::apply::release(
                &self.client,
                kind.resource,
                meta,
                owner.label_names(),
                owner.uid(),
            )
            .await
            .map_err(|source| ApplyError::Api {
                child: key.clone(),
                action: "release",
                source: Box::new(source),
            })?;
            report.released.push(key);
            report.released_uids.push(uid);
            return Ok(());
        }
        let api = self.api(kind.resource, meta.namespace.as_deref());
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: meta.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match api.delete(&key.name, &dp).await {
            Ok(deleted) => {
                report.pruned.push(key.clone());
                // Still there, being deleted (its finalizers, or its kind's own wait, such as
                // a Namespace's for its contents): recorded until it is gone.
                match deleted.left() {
                    Some(still) if still.metadata.deletion_timestamp.is_some() => {
                        held(report, key, &still.metadata);
                    }
                    _ => report.pruned_uids.push(uid),
                }
            }
            // Gone already, or replaced by a new object with another uid: not ours to
            // delete either way (and our object is gone).
            Err(e) if is_not_found(&e) || is_conflict(&e) => report.pruned_uids.push(uid),
            Err(source) => {
                return Err(ApplyError::Api {
                    child: key,
                    action: "delete",
                    source: Box::new(source),
                });
            }
        }
        Ok(())
    }
}

/// Notes the recorded, undesired child `key` (`meta`), still there and being deleted, in
/// [`ApplyReport::pruning`] with its finalizers: something holds it, its finalizers or its
/// kind's own wait (a Namespace is deleted once its contents are, which a finalizer on any of
/// them holds), and it is in effect until it is gone.
fn held(report: &mut ApplyReport, key: ObjectKey, meta: &kube::api::ObjectMeta) {
    report
        .pruning
        .push((key, meta.finalizers.clone().unwrap_or_default()));
}
