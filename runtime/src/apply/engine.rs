//! Applying desired children and pruning undesired ones, with conflict retries.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

use super::owner::DesiredChild;
use super::{
    ApplyError, OWNER_UID_LABEL, Owner, RetryPolicy, is_already_exists, is_conflict, is_not_found,
};
use crate::compare::is_applied;
use crate::key::ObjectKey;
use crate::status::Readiness;

/// What happened to one desired child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChildOutcome {
    /// Already converged: no write was made.
    Unchanged,
    /// Created (one `POST`).
    Created,
    /// Changed with server-side apply (one `PATCH`, plus one to move ownership recorded by a
    /// create or a replace to the apply operation the first time).
    Applied,
    /// Replaced with `PUT` because server-side apply could not repair it: the apply was
    /// rejected as 422 Invalid, typically because another field manager's list item merged
    /// beside ours (e.g. a second Service port with our port's name). Fields of other
    /// managers are dropped; server-allocated Service fields are kept by the API server.
    Replaced,
    /// The child is being deleted (it has a `deletionTimestamp`, e.g. waiting on a finalizer):
    /// left alone; a later reconcile creates it anew once it is gone.
    Terminating,
    /// An object with this name exists and is not controlled by the owner: left untouched.
    NotOwned {
        /// Who controls it instead, in words.
        reason: String,
    },
}

/// The result of reconciling an owner's children.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Each desired child and what happened to it, in the order they were desired.
    pub children: Vec<(ObjectKey, ChildOutcome)>,
    /// Children deleted because they were no longer desired.
    pub pruned: Vec<ObjectKey>,
}

impl ApplyReport {
    /// Desired children that exist but belong to someone else.
    pub fn not_owned(&self) -> impl Iterator<Item = (&ObjectKey, &str)> {
        self.children.iter().filter_map(|(k, o)| match o {
            ChildOutcome::NotOwned { reason } => Some((k, reason.as_str())),
            _ => None,
        })
    }

    /// The kstatus readiness this report implies: `Stalled` with reason `ChildNotOwned` when a
    /// desired child's name is taken by an object we do not own (it needs a human: delete or
    /// rename one of them); `Reconciling` with reason `ChildTerminating` while a desired child
    /// is still being deleted (requeue: it resolves by itself); otherwise `Ready` with reason
    /// `Reconciled`. Messages are stable for an unchanged outcome, so an unchanged reconcile
    /// leaves the status unchanged.
    pub fn readiness(&self) -> Readiness {
        let clashes: Vec<String> = self
            .not_owned()
            .map(|(k, why)| format!("{k} exists and is {why}"))
            .collect();
        let terminating: Vec<String> = self
            .children
            .iter()
            .filter(|(_, o)| *o == ChildOutcome::Terminating)
            .map(|(k, _)| k.to_string())
            .collect();
        if clashes.is_empty() && !terminating.is_empty() {
            return Readiness::Reconciling {
                reason: "ChildTerminating".to_owned(),
                message: format!(
                    "waiting for the deletion of {} to finish before creating it again",
                    terminating.join(", ")
                ),
            };
        }
        if clashes.is_empty() {
            Readiness::Ready {
                reason: "Reconciled".to_owned(),
                message: format!("{} children up to date", self.children.len()),
            }
        } else {
            Readiness::Stalled {
                reason: "ChildNotOwned".to_owned(),
                message: format!(
                    "not modifying objects this resource does not own: {}",
                    clashes.join("; ")
                ),
            }
        }
    }

    /// Whether any write was made.
    pub fn wrote(&self) -> bool {
        !self.pruned.is_empty()
            || self.children.iter().any(|(_, o)| {
                matches!(
                    o,
                    ChildOutcome::Created | ChildOutcome::Applied | ChildOutcome::Replaced
                )
            })
    }
}

/// Applies desired children for an owner; cheap to clone.
#[derive(Clone)]
pub struct Applier {
    client: Client,
    retry: RetryPolicy,
}

impl Applier {
    /// An applier using `client` and client-go's default conflict retry.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            retry: RetryPolicy::default(),
        }
    }

    /// Replaces the conflict retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    fn api(&self, resource: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        }
    }

    /// Applies every desired child, then prunes the owner's children (of the desired kinds)
    /// that are no longer desired.
    ///
    /// Children are applied one after another in the given order; the first error stops the
    /// reconcile (nothing is pruned then, so a failed reconcile never deletes).
    ///
    /// # Errors
    /// See [`ApplyError`]; a child that is not owned is not an error but a
    /// [`ChildOutcome::NotOwned`] in the report.
    ///
    /// # Cancel safety
    /// Not cancel safe as a whole: a cancelled reconcile may have applied some children and
    /// not others. Every single write is idempotent, so the next reconcile completes the work.
    pub async fn reconcile(
        &self,
        owner: &Owner,
        desired: &super::DesiredChildren,
    ) -> Result<ApplyReport, ApplyError> {
        let mut report = ApplyReport::default();
        let mut keep = BTreeSet::new();
        for child in &desired.children {
            let (key, _) = child.stamped(owner)?;
            if !keep.insert(key.clone()) {
                return Err(ApplyError::Duplicate(key));
            }
        }
        for child in &desired.children {
            let (key, outcome) = self.apply_child(owner, child).await?;
            report.children.push((key, outcome));
        }
        for (resource, namespaced) in &desired.kinds {
            report
                .pruned
                .extend(self.prune_kind(owner, resource, *namespaced, &keep).await?);
        }
        Ok(report)
    }

    async fn apply_child(
        &self,
        owner: &Owner,
        child: &DesiredChild,
    ) -> Result<(ObjectKey, ChildOutcome), ApplyError> {
        let (key, _) = child.stamped(owner)?;
        let api = self.api(&child.resource, key.namespace.as_deref());
        let live = api
            .get_opt(&key.name)
            .await
            .map_err(|source| ApplyError::Api {
                child: key.clone(),
                action: "get",
                source: Box::new(source),
            })?;
        let outcome = self.apply_observed(owner, child, live).await?;
        Ok((key, outcome))
    }

    /// Applies one child given what was observed of it (`None`: it did not exist).
    ///
    /// This is the step after the read in [`Applier::reconcile`], public so that the
    /// read-then-create race can be exercised: when `observed` is stale (the child was created
    /// since), the create meets AlreadyExists and the child is handled as an apply.
    ///
    /// When the server-side apply of an existing child we own is rejected with 422 `Invalid`,
    /// the child is replaced (`PUT` of the desired body, guarded by the live
    /// `resourceVersion`): server-side apply merges list items by key, so a rival's item (e.g.
    /// a Service port with another port number but our port's name) stays beside ours and
    /// every apply fails, while a replace drops it ([`ChildOutcome::Replaced`]). A child we do
    /// not own is never replaced, and nothing is ever deleted for this.
    ///
    /// # Errors
    /// See [`ApplyError`].
    pub async fn apply_observed(
        &self,
        owner: &Owner,
        child: &DesiredChild,
        mut observed: Option<DynamicObject>,
    ) -> Result<ChildOutcome, ApplyError> {
        let (key, body) = child.stamped(owner)?;
        let api = self.api(&child.resource, key.namespace.as_deref());
        let err = |action, source| ApplyError::Api {
            child: key.clone(),
            action,
            source: Box::new(source),
        };
        let attempts = self.retry.attempts();
        for attempt in 0..attempts {
            self.retry.sleep_before(attempt).await;
            let Some(live) = observed.take() else {
                let obj: DynamicObject =
                    serde_json::from_value(body.clone()).map_err(|e| ApplyError::Serialize {
                        kind: key.kind.to_string(),
                        reason: e.to_string(),
                    })?;
                let pp = PostParams {
                    field_manager: Some(owner.field_manager().to_owned()),
                    ..PostParams::default()
                };
                match api.create(&pp, &obj).await {
                    Ok(_) => return Ok(ChildOutcome::Created),
                    Err(e) if is_already_exists(&e) => {
                        observed = api.get_opt(&key.name).await.map_err(|e| err("get", e))?;
                        continue;
                    }
                    Err(e) => return Err(err("create", e)),
                }
            };
            if !owner.owns(&live.metadata) {
                return Ok(ChildOutcome::NotOwned {
                    reason: owner.describe_foreign(&live.metadata),
                });
            }
            if live.metadata.deletion_timestamp.is_some() {
                return Ok(ChildOutcome::Terminating);
            }
            let live_json = serde_json::to_value(&live).unwrap_or(Value::Null);
            if is_applied(&body, Some(&live_json)) {
                return Ok(ChildOutcome::Unchanged);
            }
            let rv = live.metadata.resource_version.clone();
            let result = match self.take_over_create_ownership(&api, owner, &live).await {
                Ok(()) => {
                    let mut guarded = body.clone();
                    guarded["metadata"]["resourceVersion"] = json!(rv);
                    let pp = PatchParams::apply(owner.field_manager()).force();
                    api.patch(&key.name, &pp, &Patch::Apply(&guarded))
                        .await
                        .map(|_| ())
                }
                Err(e) => Err(e),
            };
            let (action, e) = match result {
                Ok(()) => return Ok(ChildOutcome::Applied),
                Err(e) if is_invalid(&e) => match replace(&api, owner, &key, &body, &live).await {
                    Ok(()) => return Ok(ChildOutcome::Replaced),
                    Err(ReplaceError::Serialize(e)) => return Err(e),
                    Err(ReplaceError::Api(e)) => ("replace", e),
                },
                Err(e) => ("apply", e),
            };
            if !(is_conflict(&e) || is_not_found(&e)) {
                return Err(err(action, e));
            }
            observed = api.get_opt(&key.name).await.map_err(|e| err("get", e))?;
        }
        Err(ApplyError::ConflictsExhausted {
            child: key,
            attempts,
        })
    }

    /// A child created with `POST` or replaced with `PUT` records our fields under an `Update`
    /// operation, and server-side apply only removes fields its `Apply` entry owns. Before the
    /// next apply, the `Update` entry is folded into our `Apply` entry (moved when there is
    /// none, its field set united with it otherwise; as kubectl's client-side → server-side
    /// upgrade does), so a field later dropped from the desired object is removed. One extra
    /// write, once per create or replace.
    async fn take_over_create_ownership(
        &self,
        api: &Api<DynamicObject>,
        owner: &Owner,
        live: &DynamicObject,
    ) -> Result<(), kube::Error> {
        let Some(entries) = &live.metadata.managed_fields else {
            return Ok(());
        };
        let ours = |op: &str| {
            entries.iter().any(|e| {
                e.manager.as_deref() == Some(owner.field_manager())
                    && e.operation.as_deref() == Some(op)
                    && e.subresource.as_deref().unwrap_or("").is_empty()
            })
        };
        if !ours("Update") {
            return Ok(());
        }
        let moved = fold_update_into_apply(entries, owner.field_manager());
        let patch = json!({"metadata": {
            "managedFields": moved,
            "resourceVersion": live.metadata.resource_version,
        }});
        let name = live.metadata.name.as_deref().unwrap_or_default();
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }

    async fn prune_kind(
        &self,
        owner: &Owner,
        resource: &ApiResource,
        namespaced: bool,
        keep: &BTreeSet<ObjectKey>,
    ) -> Result<Vec<ObjectKey>, ApplyError> {
        // A namespaced owner's children live in its namespace; a cluster-scoped owner's
        // namespaced children may be anywhere.
        let scope = if namespaced { owner.namespace() } else { None };
        let api = self.api(resource, scope);
        let lp = ListParams::default().labels(&format!("{OWNER_UID_LABEL}={}", owner.uid()));
        let kind_key = |ns: Option<&str>, name: &str| ObjectKey {
            kind: resource.kind.as_str().into(),
            namespace: ns.map(Into::into),
            name: name.into(),
        };
        let list = api.list(&lp).await.map_err(|source| ApplyError::Api {
            child: kind_key(scope, "*"),
            action: "list",
            source: Box::new(source),
        })?;
        let mut pruned = Vec::new();
        for obj in list.items {
            let name = obj.metadata.name.clone().unwrap_or_default();
            let key = kind_key(obj.metadata.namespace.as_deref(), &name);
            if keep.contains(&key) || !owner.owns(&obj.metadata) {
                continue;
            }
            if obj.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let api = self.api(resource, obj.metadata.namespace.as_deref());
            let dp = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: obj.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::background()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => pruned.push(key),
                // Gone already, or replaced by a new object with another uid: not ours to
                // delete either way.
                Err(e) if is_not_found(&e) || is_conflict(&e) => {}
                Err(source) => {
                    return Err(ApplyError::Api {
                        child: key,
                        action: "delete",
                        source: Box::new(source),
                    });
                }
            }
        }
        Ok(pruned)
    }
}

/// Whether `err` is 422 Invalid (the object failed validation).
fn is_invalid(err: &kube::Error) -> bool {
    matches!(super::api_reason(err), Some((422, "Invalid")))
}

/// Why a replace failed.
enum ReplaceError {
    /// The desired body is not an object (an [`ApplyError::Serialize`]).
    Serialize(ApplyError),
    /// The `PUT` failed.
    Api(kube::Error),
}

/// `PUT`s the desired, stamped `body` over `live`, guarded by the live `resourceVersion`.
///
/// `metadata.managedFields` is left out, so the API server keeps the live entries and records
/// this write as an `Update` of our field manager (folded into `Apply` before the next apply).
/// Fields the body omits are dropped, except those the API server itself carries over from the
/// old object on update: for a Service, `spec.clusterIP(s)` and node ports.
async fn replace(
    api: &Api<DynamicObject>,
    owner: &Owner,
    key: &ObjectKey,
    body: &Value,
    live: &DynamicObject,
) -> Result<(), ReplaceError> {
    let mut obj: DynamicObject = serde_json::from_value(body.clone()).map_err(|e| {
        ReplaceError::Serialize(ApplyError::Serialize {
            kind: key.kind.to_string(),
            reason: e.to_string(),
        })
    })?;
    obj.metadata.resource_version = live.metadata.resource_version.clone();
    obj.metadata.managed_fields = None;
    let pp = PostParams {
        field_manager: Some(owner.field_manager().to_owned()),
        ..PostParams::default()
    };
    api.replace(&key.name, &pp, &obj)
        .await
        .map(|_| ())
        .map_err(ReplaceError::Api)
}

/// `entries` with `manager`'s main-resource `Update` entry folded into its `Apply` entry: the
/// `Update` entry becomes the `Apply` entry when there is none, otherwise its field set is
/// united with the `Apply` entry's and it is dropped.
fn fold_update_into_apply(
    entries: &[ManagedFieldsEntry],
    manager: &str,
) -> Vec<ManagedFieldsEntry> {
    let is = |e: &ManagedFieldsEntry, op: &str| {
        e.manager.as_deref() == Some(manager)
            && e.operation.as_deref() == Some(op)
            && e.subresource.as_deref().unwrap_or("").is_empty()
    };
    let updates: Vec<&ManagedFieldsEntry> = entries.iter().filter(|e| is(e, "Update")).collect();
    let mut out: Vec<ManagedFieldsEntry> = entries
        .iter()
        .filter(|e| !is(e, "Update"))
        .cloned()
        .collect();
    for update in updates {
        match out.iter_mut().find(|e| is(e, "Apply")) {
            Some(apply) => {
                let mut fields = apply.fields_v1.take().map_or(Value::Null, |f| f.0);
                if let Some(more) = &update.fields_v1 {
                    unite(&mut fields, &more.0);
                }
                apply.fields_v1 = Some(FieldsV1(fields));
                apply.time = None;
            }
            None => {
                let mut moved = update.clone();
                moved.operation = Some("Apply".to_owned());
                moved.time = None;
                out.push(moved);
            }
        }
    }
    out
}

/// Unites the `fieldsV1` set `more` into `into` (both nested JSON objects of field paths).
fn unite(into: &mut Value, more: &Value) {
    match (into, more) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                unite(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (slot @ Value::Null, v) => *slot = v.clone(),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(manager: &str, op: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(op.into()),
            api_version: Some("v1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn update_entry_is_moved_or_united_into_apply() {
        let create = [
            entry("idem", "Update", json!({"f:data": {"f:a": {}}})),
            entry("rival", "Update", json!({"f:data": {"f:r": {}}})),
        ];
        let moved = fold_update_into_apply(&create, "idem");
        assert_eq!(moved.len(), 2);
        assert_eq!(moved[0], create[1]);
        assert_eq!(moved[1].operation.as_deref(), Some("Apply"));
        assert_eq!(moved[1].fields_v1, create[0].fields_v1);

        let replaced = [
            entry(
                "idem",
                "Apply",
                json!({"f:spec": {"f:selector": {}, "f:ports": {"k:{\"port\":80}": {".": {}}}}}),
            ),
            entry(
                "idem",
                "Update",
                json!({"f:spec": {"f:ports": {"k:{\"port\":80}": {"f:name": {}}}}}),
            ),
        ];
        let united = fold_update_into_apply(&replaced, "idem");
        assert_eq!(united.len(), 1);
        assert_eq!(united[0].operation.as_deref(), Some("Apply"));
        assert_eq!(
            united[0].fields_v1,
            Some(FieldsV1(json!({"f:spec": {
                "f:selector": {},
                "f:ports": {"k:{\"port\":80}": {".": {}, "f:name": {}}},
            }})))
        );
    }

    #[test]
    fn readiness_from_report() {
        let ok = ApplyReport {
            children: vec![(
                ObjectKey::namespaced("ConfigMap", "ns", "a"),
                ChildOutcome::Created,
            )],
            pruned: vec![],
        };
        assert!(
            matches!(ok.readiness(), Readiness::Ready { ref reason, .. } if reason == "Reconciled")
        );
        assert!(ok.wrote());
        let clash = ApplyReport {
            children: vec![(
                ObjectKey::namespaced("ConfigMap", "ns", "a"),
                ChildOutcome::NotOwned {
                    reason: "not controlled by any owner".into(),
                },
            )],
            pruned: vec![],
        };
        match clash.readiness() {
            Readiness::Stalled { reason, message } => {
                assert_eq!(reason, "ChildNotOwned");
                assert!(
                    message.contains("ConfigMap/ns/a exists and is not controlled"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(!clash.wrote());
        let terminating = ApplyReport {
            children: vec![(
                ObjectKey::namespaced("Service", "ns", "s"),
                ChildOutcome::Terminating,
            )],
            pruned: vec![],
        };
        assert!(matches!(
            terminating.readiness(),
            Readiness::Reconciling { ref reason, .. } if reason == "ChildTerminating"
        ));
    }
}
