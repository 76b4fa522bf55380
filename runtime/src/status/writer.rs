//! Status and finalizer writes guarded by resourceVersion, with re-read and recompute on 409.

use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::StatusError;
use super::conditions::{StatusDraft, now_seconds};
use crate::api_error::{is_conflict, is_not_found};
use crate::backoff::RetryPolicy;
use crate::resource::IdempotentResource;

/// What a status write did.
#[derive(Clone, Debug, PartialEq)]
pub enum StatusOutcome<K> {
    /// The computed status equals the stored one: nothing was written.
    Unchanged,
    /// The status was written; the object as stored afterwards.
    Written(Box<K>),
    /// The stored status already observed a newer generation than the one reconciled, so
    /// nothing was written (observedGeneration never goes backwards).
    Superseded,
}

/// Writes the status and finalizers of one resource kind.
#[derive(Clone)]
pub struct StatusWriter<K> {
    api: Api<K>,
    retry: RetryPolicy,
}

impl<K: IdempotentResource> StatusWriter<K> {
    /// A writer using `api` (scoped to the object's namespace for namespaced kinds) and
    /// client-go's default conflict retry.
    pub fn new(api: Api<K>) -> Self {
        Self {
            api,
            retry: RetryPolicy::default(),
        }
    }

    /// Replaces the conflict retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Computes and writes the status of `read`, the object the reconcile started from.
    ///
    /// `compute` gets the current object and a [`StatusDraft`] starting from its stored status
    /// and sets conditions and fields; `observedGeneration` is set to `read`'s generation. The
    /// status is written only when it differs from the stored one. On 409 Conflict the object
    /// is read again and `compute` runs again on it.
    ///
    /// # Errors
    /// A [`StatusError`] for invalid conditions (nothing written), missing metadata, API
    /// failures, or conflicts past the retry bound.
    ///
    /// # Cancel safety
    /// Cancel safe: a write either happened whole or not at all.
    pub async fn write<F>(&self, read: &K, compute: F) -> Result<StatusOutcome<K>, StatusError>
    where
        F: FnMut(&K, &mut StatusDraft<'_, K::Status>),
    {
        self.write_inner(read, true, compute).await
    }

    /// As [`StatusWriter::write`], but `observedGeneration` keeps its stored value: for fields
    /// that record what a reconcile did (e.g. the children it created) when the reconcile did
    /// not finish, or when a newer generation's status is already stored, so the status does
    /// not claim to describe `read`'s generation. Written also when the stored status observed
    /// a newer generation (never [`StatusOutcome::Superseded`]).
    ///
    /// # Errors
    /// As [`StatusWriter::write`].
    pub async fn write_fields<F>(
        &self,
        read: &K,
        compute: F,
    ) -> Result<StatusOutcome<K>, StatusError>
    where
        F: FnMut(&K, &mut StatusDraft<'_, K::Status>),
    {
        self.write_inner(read, false, compute).await
    }

    async fn write_inner<F>(
        &self,
        read: &K,
        observe: bool,
        mut compute: F,
    ) -> Result<StatusOutcome<K>, StatusError>
    where
        F: FnMut(&K, &mut StatusDraft<'_, K::Status>),
    {
        let generation = read
            .meta()
            .generation
            .ok_or(StatusError::NotStored("generation"))?;
        let name = read
            .meta()
            .name
            .clone()
            .ok_or(StatusError::NotStored("name"))?;
        let mut current = read.clone();
        let attempts = self.retry.attempts();
        for attempt in 0..attempts {
            self.retry.sleep_before(attempt).await;
            if attempt > 0 {
                current = self
                    .api
                    .get(&name)
                    .await
                    .map_err(|source| StatusError::Api {
                        name: name.clone(),
                        action: "get",
                        source: Box::new(source),
                    })?;
            }
            let stored = current.status().cloned();
            if observe
                && stored
                    .as_ref()
                    .and_then(K::observed_generation_of)
                    .is_some_and(|g| g > generation)
            {
                return Ok(StatusOutcome::Superseded);
            }
            let mut next = stored.clone().unwrap_or_default();
            let mut draft = StatusDraft::new(
                &mut next,
                K::conditions_of_mut,
                generation,
                now_seconds(),
                K::CONDITION_TYPES,
            );
            compute(&current, &mut draft);
            if let Some(e) = draft.into_error() {
                return Err(e);
            }
            if observe {
                K::set_observed_generation_of(&mut next, generation);
            }
            let as_json = |s: &K::Status| serde_json::to_value(s).unwrap_or(Value::Null);
            if stored.as_ref().map(as_json) == Some(as_json(&next)) {
                return Ok(StatusOutcome::Unchanged);
            }
            if current.meta().resource_version.is_none() {
                return Err(StatusError::NotStored("resourceVersion"));
            }
            let mut body = current.clone();
            *body.status_mut() = Some(next);
            let pp = PostParams {
                field_manager: Some(K::FIELD_MANAGER.to_owned()),
                ..PostParams::default()
            };
            match self.api.replace_status(&name, &pp, &body).await {
                Ok(stored) => return Ok(StatusOutcome::Written(Box::new(stored))),
                Err(e) if is_conflict(&e) => continue,
                Err(source) => {
                    return Err(StatusError::Api {
                        name,
                        action: "replace_status",
                        source: Box::new(source),
                    });
                }
            }
        }
        Err(StatusError::ConflictsExhausted { name, attempts })
    }

    /// Adds `finalizer` to `obj` unless present; `None` when nothing was written.
    ///
    /// # Errors
    /// As [`StatusWriter::write`].
    pub async fn add_finalizer(&self, obj: &K, finalizer: &str) -> Result<Option<K>, StatusError> {
        self.edit_finalizers(obj, |list| {
            if list.iter().any(|f| f == finalizer) {
                false
            } else {
                list.push(finalizer.to_owned());
                true
            }
        })
        .await
    }

    /// Removes `finalizer` from `obj` if present; `None` when nothing was written (also when
    /// the object is already gone: NotFound is success).
    ///
    /// # Errors
    /// As [`StatusWriter::write`].
    pub async fn remove_finalizer(
        &self,
        obj: &K,
        finalizer: &str,
    ) -> Result<Option<K>, StatusError> {
        self.edit_finalizers(obj, |list| {
            let before = list.len();
            list.retain(|f| f != finalizer);
            list.len() != before
        })
        .await
    }

    /// Edits the finalizer list with a merge patch carrying the resourceVersion read, so a
    /// concurrent change gives 409 and the edit is redone on a fresh read.
    async fn edit_finalizers(
        &self,
        obj: &K,
        mut edit: impl FnMut(&mut Vec<String>) -> bool,
    ) -> Result<Option<K>, StatusError> {
        let name = obj
            .meta()
            .name
            .clone()
            .ok_or(StatusError::NotStored("name"))?;
        let mut current = obj.clone();
        let attempts = self.retry.attempts();
        for attempt in 0..attempts {
            self.retry.sleep_before(attempt).await;
            if attempt > 0 {
                match self.api.get_opt(&name).await {
                    Ok(Some(o)) => current = o,
                    Ok(None) => return Ok(None),
                    Err(source) => {
                        return Err(StatusError::Api {
                            name,
                            action: "get",
                            source: Box::new(source),
                        });
                    }
                }
            }
            let mut list = current.meta().finalizers.clone().unwrap_or_default();
            if !edit(&mut list) {
                return Ok(None);
            }
            let rv = current
                .meta()
                .resource_version
                .clone()
                .ok_or(StatusError::NotStored("resourceVersion"))?;
            let patch = json!({"metadata": {"finalizers": list, "resourceVersion": rv}});
            match self
                .api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(o) => return Ok(Some(o)),
                Err(e) if is_not_found(&e) => return Ok(None),
                Err(e) if is_conflict(&e) => continue,
                Err(source) => {
                    return Err(StatusError::Api {
                        name,
                        action: "patch",
                        source: Box::new(source),
                    });
                }
            }
        }
        Err(StatusError::ConflictsExhausted { name, attempts })
    }
}
