//! Ensuring a create-once child: created when absent (the create that wins is taken by every
//! racer), found by name when hidden from the caches, never written but for idem's ownership
//! metadata, and never silently made again once deleted (rules: [`crate::apply::once`]).

use kube::api::{Patch, PatchParams};
use serde_json::Value;

use super::{Applied, Applier, ChildOutcome, to_json, uid_guarded, unclaim_patch};
use crate::apply::once::unprinted;
use crate::apply::owner::DesiredChild;
use crate::apply::{ApplyError, Owner, is_already_exists};
use crate::compare::{Drift, DriftKind, entry_name};

/// What ensuring a create-once child did, and the child as it is now.
pub(crate) struct Ensured {
    pub(crate) outcome: ChildOutcome,
    /// The uid to add to the owner's record (created, or ours and missing from it).
    pub(crate) created: Option<String>,
    /// The live child (`None` when it is not the owner's, or being deleted).
    pub(crate) live: Option<Value>,
    /// It was deleted and created anew (its kind opted in to regenerating).
    pub(crate) regenerated: bool,
    /// The ownership metadata put back, with the `resourceVersion` that lacked it.
    pub(crate) repaired: Option<(Vec<Drift>, Option<String>)>,
}

impl Ensured {
    fn of(outcome: ChildOutcome, live: Option<Value>) -> Self {
        Self {
            outcome,
            created: None,
            live,
            regenerated: false,
            repaired: None,
        }
    }
}

impl Applier {
    /// Ensures the create-once child `child` of `owner` (see [`crate::apply::once`]): from
    /// the cache without a request when it is there and carries the owner's labels and
    /// controller ownerReference.
    pub(crate) async fn ensure_once(
        &self,
        owner: &Owner,
        child: &DesiredChild,
    ) -> Result<Ensured, ApplyError> {
        let once = child
            .once
            .as_ref()
            .expect("ensure_once is for create-once children");
        let (key, stamp) = child.stamped(owner)?;
        let stamp = unprinted(stamp, owner.label_names());
        if let Some(c) = &self.caches {
            c.note_manager(owner.field_manager());
        }
        let api = self.api(&child.resource, key.namespace.as_deref());
        let err = |action, source| ApplyError::Api {
            child: key.clone(),
            action,
            source: Box::new(source),
        };
        let recorded = owner
            .recorded_of_kind(&key.kind)
            .find(|(_, k)| **k == key)
            .map(|(uid, _)| uid.to_owned());
        // The cache's view: an object, or "absent"; a stub or a name last seen taken by a
        // foreign object is read by name. A child the record holds but the label-selected
        // cache does not show was hidden (its labels changed) or deleted: read by name too.
        let cached = self.caches.as_ref().and_then(|c| {
            c.get(&child.resource, &key)
                .filter(|v| v.is_some() || !c.is_foreign(&key))
        });
        let mut observed = match cached {
            Some(Some(live)) => Some(live),
            Some(None) if recorded.is_none() => None,
            _ => self.get(&child.resource, &key).await?,
        };
        let mut regenerated = false;
        let attempts = self.retry.attempts();
        for attempt in 0..attempts {
            self.retry.sleep_before(attempt).await;
            let Some(live) = observed.take() else {
                if let Some(uid) = &recorded
                    && !regenerated
                {
                    if !once.regenerate {
                        return Err(ApplyError::ChildDeleted {
                            child: key.clone(),
                            uid: uid.clone(),
                            replaced_by: None,
                        });
                    }
                    regenerated = true;
                }
                let body = unprinted(
                    DesiredChild {
                        body: once.body(&key)?,
                        once: None,
                        ..child.clone()
                    }
                    .stamped(owner)?
                    .1,
                    owner.label_names(),
                );
                match self.create_whole(&api, owner, &key, &body).await {
                    Ok(created) => {
                        let uid = created.pointer("/metadata/uid").and_then(Value::as_str);
                        let mut done = Ensured::of(ChildOutcome::Created, None);
                        done.created = uid.map(str::to_owned);
                        done.live = Some(created);
                        done.regenerated = regenerated;
                        return Ok(done);
                    }
                    // Another reconcile won the create: take what is there.
                    Err(e) if is_already_exists(&e) => {
                        observed = self.get(&child.resource, &key).await?;
                        continue;
                    }
                    Err(e) => return Err(err("create", e)),
                }
            };
            let meta: kube::api::ObjectMeta =
                serde_json::from_value(live.get("metadata").cloned().unwrap_or_default())
                    .unwrap_or_default();
            let uid = meta.uid.clone().unwrap_or_default();
            let controlled = owner.owns(&meta);
            // Ours: in the record, or carrying the owner's controller ownerReference (a create
            // whose answer was lost, another reconcile's create, or one restored from a
            // backup with the reference); a recorded uid elsewhere at its name means the
            // recorded object was deleted.
            // The recorded object replaced by another at its name — even one that copies the
            // owner's controller ownerReference — is not ours: its value was never made by us.
            if let Some(recorded) = recorded.as_ref().filter(|r| **r != uid)
                && controlled
            {
                if let Some(c) = &self.caches {
                    c.set_foreign(&key, true);
                }
                return Err(ApplyError::ChildDeleted {
                    child: key.clone(),
                    uid: recorded.clone(),
                    replaced_by: Some(uid),
                });
            }
            let ours = controlled || owner.recorded(&uid);
            if !ours {
                if let Some(c) = &self.caches {
                    c.set_foreign(&key, true);
                }
                if let Some(recorded) = &recorded {
                    return Err(ApplyError::ChildDeleted {
                        child: key.clone(),
                        uid: recorded.clone(),
                        replaced_by: Some(uid),
                    });
                }
                return Ok(Ensured::of(
                    ChildOutcome::NotOwned {
                        reason: owner.describe_foreign(&meta),
                    },
                    None,
                ));
            }
            if let Some(c) = &self.caches {
                c.set_foreign(&key, false);
                c.ours(&key, &live);
            }
            // Missing from the record (a lost create answer, a race's loser): recorded now, even
            // while it is being deleted (it is still in effect, and pruned if no longer desired).
            let record = Some(uid.clone()).filter(|uid| !owner.may_prune(uid));
            if meta.deletion_timestamp.is_some() {
                let finalizers = meta.finalizers.clone().unwrap_or_default();
                let mut done = Ensured::of(
                    ChildOutcome::Terminating {
                        finalizers,
                        unrepaired: None,
                    },
                    None,
                );
                done.created = record;
                return Ok(done);
            }
            let mut done = Ensured::of(ChildOutcome::Unchanged, None);
            done.created = record;
            if controlled && carries_labels(&live, &stamp) {
                done.live = Some(live);
                return Ok(done);
            }
            // A removed ownerReference stays removed while the owner is being deleted
            // (see `Owner::is_being_deleted`).
            if !controlled
                && owner
                    .is_being_deleted(&self.client)
                    .await
                    .map_err(|source| err("get", source))?
            {
                done.live = Some(live);
                return Ok(done);
            }
            let _in_flight = self.begin_write(&key);
            let written = match unclaim_patch(&live, owner.uid()).filter(|_| !controlled) {
                Some(patch) => {
                    api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                }
                None => {
                    let drift = ownership_drift(&live, &stamp, controlled, owner.field_manager());
                    done.repaired = Some((drift, meta.resource_version.clone()))
                        .filter(|(drift, _)| !drift.is_empty());
                    let guarded = uid_guarded(&stamp, &live);
                    let pp = PatchParams::apply(owner.field_manager()).force();
                    api.patch(&key.name, &pp, &Patch::Apply(&guarded)).await
                }
            };
            match written {
                Ok(obj) => {
                    let now = to_json(&obj);
                    self.remember(&key, &now);
                    if owner.owns(&obj.metadata) && carries_labels(&now, &stamp) {
                        done.outcome = ChildOutcome::Applied;
                        done.live = Some(now);
                        return Ok(done);
                    }
                    // The foreign controller reference is gone: now the labels.
                    observed = Some(now);
                }
                Err(e) => observed = self.read_again(&child.resource, &key, &meta, e).await?,
            }
        }
        Err(ApplyError::ConflictsExhausted {
            child: key,
            attempts,
        })
    }

    /// [`Applier::ensure_once`] as one child of [`Applier::reconcile_into`].
    pub(super) async fn ensure_once_applied(
        &self,
        owner: &Owner,
        child: &DesiredChild,
    ) -> Result<Applied, ApplyError> {
        let ensured = self.ensure_once(owner, child).await?;
        Ok(Applied {
            outcome: ensured.outcome,
            repaired: ensured.repaired,
            created: ensured.created,
            released: None,
            regenerated: ensured.regenerated,
        })
    }
}

/// What putting the owner's ownership metadata back on `live` repairs, for `DriftRepaired`:
/// each of the stamped body's labels that `live` lacks or holds with another value, and the
/// ownerReferences when the owner's controller reference is not among them — named with the
/// managers that own them on `live` (its `managedFields`), none when removed.
fn ownership_drift(live: &Value, stamp: &Value, controlled: bool, ours: &str) -> Vec<Drift> {
    let entries = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let owners = |field: &str, key: Option<&str>| -> Vec<String> {
        entries
            .iter()
            .filter(|e| e.get("manager").and_then(Value::as_str) != Some(ours))
            .filter(|e| {
                let node = e.pointer("/fieldsV1/f:metadata").and_then(|m| m.get(field));
                match key {
                    Some(k) => node.and_then(|n| n.get(format!("f:{k}"))).is_some(),
                    None => node.is_some(),
                }
            })
            .map(entry_name)
            .collect()
    };
    let mut drift: Vec<Drift> = changed_labels(live, stamp)
        .map(|k| Drift {
            path: format!(".metadata.labels.{k}"),
            kind: DriftKind::NotOwned {
                managers: owners("f:labels", Some(k)),
            },
        })
        .collect();
    if !controlled {
        drift.push(Drift {
            path: ".metadata.ownerReferences".into(),
            kind: DriftKind::NotOwned {
                managers: owners("f:ownerReferences", None),
            },
        });
    }
    drift
}

/// Whether `live` carries every label of the stamped body (the owner's).
fn carries_labels(live: &Value, stamp: &Value) -> bool {
    changed_labels(live, stamp).next().is_none()
}

/// The labels of `stamp` that `live` does not carry with the same value.
fn changed_labels<'a>(live: &'a Value, stamp: &'a Value) -> impl Iterator<Item = &'a String> {
    let want = stamp.pointer("/metadata/labels").and_then(Value::as_object);
    let have = live.pointer("/metadata/labels").and_then(Value::as_object);
    (want.into_iter().flatten())
        .filter(move |(k, v)| have.and_then(|h| h.get(*k)) != Some(*v))
        .map(|(k, _)| k)
}
