//! Applying desired children and pruning undesired ones, reading from the controller's caches.

use std::collections::BTreeSet;

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

use self::prune::PruneKind;
use super::owner::DesiredChild;
use super::report::{ApplyReport, ChildOutcome, Repair};
use super::takeover::fold_patch;
use super::{ApplyError, Labels, Owner, RetryPolicy, is_already_exists, is_conflict, is_not_found};
use crate::api_error::{is_forbidden, is_invalid, is_not_found_named, uid_mismatch};
use crate::cache::{Answers, ChildCaches, InFlight};
use crate::compare::{Drift, DriftKind, differences, fingerprint, keyed_fingerprint, settled};
use crate::key::ObjectKey;

mod once;
mod prune;
mod wire;

/// The most children of one reconcile applied at the same time (within a wave, see
/// [`Applier::reconcile`]).
const CHILDREN_IN_FLIGHT: usize = 8;

/// Applies desired children for an owner; cheap to clone.
#[derive(Clone)]
pub struct Applier {
    client: Client,
    retry: RetryPolicy,
    caches: Option<ChildCaches>,
    metrics: Option<super::DriftMetrics>,
    /// The server's answers for children the convergence check cannot judge alone.
    answers: Answers,
}

/// What one child's apply did, plus the drift it repaired.
struct Applied {
    outcome: ChildOutcome,
    /// The drift repaired, with the `resourceVersion` of the drifted object.
    repaired: Option<(Vec<Drift>, Option<String>)>,
    /// The uid to add to the owner's record: of the object this apply created, or of a desired
    /// child of ours the record lacks (its creating pass never saw the answer).
    created: Option<String>,
    /// The uid to drop from the owner's record: a recorded child of a
    /// [`release_orphans`](super::DesiredChildren::release_orphans) kind whose ownerReference
    /// was removed (released).
    released: Option<String>,
    /// A create-once child that was deleted and made again with new values.
    regenerated: bool,
}

impl Applier {
    /// An applier using `client` and client-go's default conflict retry, reading every child
    /// from the API server (see [`Applier::with_caches`]).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            retry: RetryPolicy::default(),
            caches: None,
            metrics: None,
            answers: Answers::default(),
        }
    }

    /// Replaces the conflict retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Reads children, and lists them for pruning, from `caches` for every kind they serve
    /// (the controller's watches fill them: [`Controller::with_child_caches`]); other kinds
    /// are read from the API server. A converged reconcile then makes no request at all.
    ///
    /// [`Controller::with_child_caches`]: crate::controller::Controller::with_child_caches
    pub fn with_caches(mut self, caches: ChildCaches) -> Self {
        // The server's answers live with the caches: every pass's applier shares them.
        self.answers = caches.answers().clone();
        self.caches = Some(caches);
        self
    }

    /// Counts one repaired child of `kind` in the metrics, when there are any.
    pub(crate) fn count_repaired(&self, kind: &str) {
        if let Some(m) = &self.metrics {
            m.repaired(kind);
        }
    }

    /// Counts repaired drift in `metrics` (`idem_drift_repaired_total{kind}`).
    pub fn with_metrics(mut self, metrics: super::DriftMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The caches this applier reads from, if any.
    pub fn caches(&self) -> Option<&ChildCaches> {
        self.caches.as_ref()
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
    /// Children are applied in two waves, cluster-scoped children (such as Namespaces) first,
    /// then namespaced ones; the children of a wave are applied concurrently (at most 8 at
    /// once), and the report lists them in the given order. A child that fails does not
    /// stop the others (every child is tried, so one invalid child cannot keep a sibling such
    /// as an isolation NetworkPolicy from being applied); then the first error is returned and
    /// nothing is pruned (a failed reconcile never deletes).
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
        self.reconcile_into(owner, desired, &mut report).await?;
        Ok(report)
    }

    /// As [`Applier::reconcile`], filling `report` as it goes, so that what was done before an
    /// error (children created, with their uids, for the owner's record) is not lost.
    ///
    /// # Errors
    /// As [`Applier::reconcile`].
    ///
    /// # Cancel safety
    /// As [`Applier::reconcile`].
    pub async fn reconcile_into(
        &self,
        owner: &Owner,
        desired: &super::DesiredChildren,
        report: &mut ApplyReport,
    ) -> Result<(), ApplyError> {
        desired.same_kind_names()?;
        let mut keep = BTreeSet::new();
        let mut keys = Vec::with_capacity(desired.children.len());
        for child in &desired.children {
            let key = child.placed(owner)?;
            if !keep.insert(key.clone()) {
                return Err(ApplyError::Duplicate(key));
            }
            keys.push(key);
        }
        // Children are applied in two waves: cluster-scoped ones (a tenant's Namespaces) first,
        // then the namespaced ones, which may live in them. Within a wave every child is
        // independent of the others and applied at the same time, at most
        // `CHILDREN_IN_FLIGHT` at once (the tenant's request slots, when the client has them,
        // share those requests fairly with other tenants'). Results are recorded in the
        // desired order, whatever order the answers come in.
        //
        // A child that fails does not stop the others: one invalid child (a RoleBinding the
        // server rejects) must not leave a sibling that protects the tenant (its
        // NetworkPolicy) unapplied. The first error is returned after every child was tried.
        let mut results: Vec<Option<Result<Applied, ApplyError>>> =
            (0..desired.children.len()).map(|_| None).collect();
        for cluster_wave in [true, false] {
            // Made as slots free up: a child's apply is a large future, and only the ones in
            // flight are held (not one per child of the wave).
            let wave: Vec<usize> = (0..desired.children.len())
                .filter(|&i| desired.children[i].namespaced != cluster_wave)
                .collect();
            let wave = wave.into_iter().map(|i| {
                let child = &desired.children[i];
                async move { (i, self.apply_one(owner, child).await) }
            });
            let mut answers = futures::stream::iter(wave).buffer_unordered(CHILDREN_IN_FLIGHT);
            while let Some((i, result)) = answers.next().await {
                // Told at once: a pass cut off before the end still records what it created.
                if let Ok(Applied {
                    created: Some(uid), ..
                }) = &result
                {
                    report.created.push(super::CreatedChild::new(&keys[i], uid));
                }
                results[i] = Some(result);
            }
        }
        // In the desired order, whatever order the answers came in.
        report
            .created
            .sort_by_key(|c| keys.iter().position(|k| *k == c.key()));
        let mut first_error = None;
        // The kinds with a child not made: not pruned in this pass (see below).
        let mut failed_kinds: BTreeSet<String> = BTreeSet::new();
        for (key, result) in keys.into_iter().zip(results) {
            let applied = match result.expect("every child is in one wave") {
                Ok(applied) => applied,
                Err(e) => {
                    tracing::warn!(child = %key, error = %e, "child not applied; applying the others");
                    // A child that exists and could not be updated (its write refused, or
                    // contended) replaces nothing: its kind is pruned all the same. One that
                    // could not be made (or read) may be what replaces an undesired one.
                    let exists = matches!(
                        e,
                        ApplyError::Api {
                            action: "apply",
                            ..
                        } | ApplyError::ConflictsExhausted { .. }
                    );
                    if !exists {
                        failed_kinds.insert(key.kind.to_string());
                    }
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            if applied.regenerated {
                report.regenerated.push(key.clone());
            } else if matches!(applied.outcome, ChildOutcome::Created)
                && owner.recorded_of_kind(&key.kind).any(|(_, k)| *k == key)
            {
                report.remade.push(key.clone());
            }
            if let Some(uid) = applied.released {
                report.released.push(key.clone());
                report.released_uids.push(uid);
            }
            if let Some((drift, resource_version)) = applied.repaired {
                self.count_repaired(&key.kind);
                report.repaired.push(Repair {
                    child: key.clone(),
                    drift,
                    resource_version,
                });
            }
            report.children.push((key, applied.outcome));
        }
        // A child that failed does not stop the prune either: a tenant owner who can make one
        // child fail (inflate it until the server refuses it; `idem-owners` is itself a
        // RoleBinding) must not keep a RoleBinding the owner no longer desires. Only the kind
        // of a child that could not be made is not pruned in this pass: that child may be
        // what replaces an undesired one of its kind (a renamed ConfigMap, a Namespace).
        for (resource, namespaced) in &desired.kinds {
            if failed_kinds.contains(&resource.kind) {
                tracing::debug!(kind = %resource.kind, "not pruned: a child of the kind was not applied");
                continue;
            }
            let kind = PruneKind {
                resource,
                namespaced: *namespaced,
                release_orphans: desired.release_orphans.contains(resource),
                release_undesired: desired.release_undesired.contains(resource),
                release_in: &desired.release_in,
            };
            if let Err(e) = self.prune_kind(owner, &kind, &keep, report).await {
                return Err(first_error.unwrap_or(e));
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Reads and applies one desired child (ensures it, when it is created once).
    async fn apply_one(&self, owner: &Owner, child: &DesiredChild) -> Result<Applied, ApplyError> {
        if child.once.is_some() {
            return self.ensure_once_applied(owner, child).await;
        }
        let key = child.placed(owner)?;
        if self.unchanged_stub(owner, child, &key)? {
            return Ok(Applied {
                outcome: ChildOutcome::Unchanged,
                repaired: None,
                created: None,
                released: None,
                regenerated: false,
            });
        }
        let live = self.read(&child.resource, &key).await?;
        self.apply_live(owner, child, live).await
    }

    /// Whether the child at `key` is one the caches hold as a stub (a tenant owner added more
    /// to it than they keep whole), recorded by `owner`, that a pass judged converged with
    /// this desired body at the version the stub shows: judged again, it would be unchanged,
    /// so it is not read from the API server (a stub is read once per change, not once per
    /// pass).
    fn unchanged_stub(
        &self,
        owner: &Owner,
        child: &DesiredChild,
        key: &ObjectKey,
    ) -> Result<bool, ApplyError> {
        let Some(c) = &self.caches else {
            return Ok(false);
        };
        if !c.is_stub(&child.resource, key) {
            return Ok(false);
        }
        let (_, body) = child.stamped(owner)?;
        let uid = c.converged_stub(&child.resource, key, keyed_fingerprint(&body));
        Ok(uid.is_some_and(|uid| owner.recorded(&uid)))
    }

    /// The child from the cache when its kind is cached, else from the API server.
    async fn read(
        &self,
        resource: &ApiResource,
        key: &ObjectKey,
    ) -> Result<Option<Value>, ApplyError> {
        if let Some(c) = &self.caches
            && let Some(cached) = c.get(resource, key)
            && (cached.is_some() || !c.is_foreign(key))
        {
            return Ok(cached);
        }

        self.get(resource, key).await
    }

    /// The child from the API server.
    async fn get(
        &self,
        resource: &ApiResource,
        key: &ObjectKey,
    ) -> Result<Option<Value>, ApplyError> {
        let api = self.api(resource, key.namespace.as_deref());
        wire::get(&self.client, &api, &key.name)
            .await
            .map_err(|source| ApplyError::Api {
                child: key.clone(),
                action: "get",
                source: Box::new(source),
            })
    }

    /// After a write of the child `key` (read as `read`) failed with `e`: the child read again
    /// when `e` says it changed since that read — 409 Conflict (a `resourceVersion` guard), 422
    /// on `metadata.uid` (replaced by another object), or a 404 that names it and that the
    /// read confirms (gone, or another uid at its name) — else `e`, the write's refusal. A 404
    /// for an object the server looked up to admit the write (a missing ClusterRole a
    /// RoleBinding binds) may name the child too; the child still there with its uid tells it
    /// apart, so the refusal is reported, not retried as a race.
    ///
    /// # Errors
    /// [`ApplyError::Api`] with `e` (action `apply`), or the read's error.
    async fn read_again(
        &self,
        resource: &ApiResource,
        key: &ObjectKey,
        read: &kube::api::ObjectMeta,
        e: kube::Error,
    ) -> Result<Option<Value>, ApplyError> {
        let refused = |e| ApplyError::Api {
            child: key.clone(),
            action: "apply",
            source: Box::new(e),
        };
        if is_conflict(&e) || uid_mismatch(&e) {
            return self.get(resource, key).await;
        }
        if !is_not_found_named(&e, &key.name) {
            return Err(refused(e));
        }
        let again = self.get(resource, key).await?;
        let uid = |v: &Value| {
            v.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        match &again {
            Some(v) if read.uid.is_some() && uid(v) == read.uid => Err(refused(e)),
            _ => Ok(again),
        }
    }

    /// Marks a write of `key` as in flight (for the child watches, see [`ChildCaches`]) until
    /// the guard is dropped.
    fn begin_write(&self, key: &ObjectKey) -> Option<InFlight> {
        self.caches.as_ref().map(|c| c.begin_write(key))
    }

    /// Remembers the server's answer `obj` (as JSON) to our write of `key`, for the caches.
    fn remember(&self, key: &ObjectKey, obj: &Value) {
        if let Some(c) = &self.caches {
            c.wrote(key, obj);
        }
    }

    /// Applies one child given what was observed of it (`None`: it did not exist).
    ///
    /// This is the step after the read in [`Applier::reconcile`], public so that races can be
    /// exercised: when `observed` is stale (the child was created since), the create meets
    /// AlreadyExists and the child is read and handled as an apply; when the child was
    /// replaced by another object of the same name since, the apply (which carries the
    /// observed `metadata.uid`) is rejected and the child is read again.
    ///
    /// An apply rejected as 422 Invalid is an error ([`ApplyError::Api`], action `apply`),
    /// except for kinds that opted in to recreation
    /// ([`DesiredChildren::allow_recreate`](super::DesiredChildren::allow_recreate)): those
    /// are deleted (with a `uid` precondition) and created again
    /// ([`ChildOutcome::Recreated`]) — never for an admission webhook's or
    /// ValidatingAdmissionPolicy's denial. Nothing is ever replaced with `PUT`, which would drop
    /// other managers' labels, annotations and finalizers.
    ///
    /// # Errors
    /// See [`ApplyError`].
    pub async fn apply_observed(
        &self,
        owner: &Owner,
        child: &DesiredChild,
        observed: Option<DynamicObject>,
    ) -> Result<ChildOutcome, ApplyError> {
        let live = observed.map(|o| to_json(&o));
        Ok(self.apply_live(owner, child, live).await?.outcome)
    }

    async fn apply_live(
        &self,
        owner: &Owner,
        child: &DesiredChild,
        mut observed: Option<Value>,
    ) -> Result<Applied, ApplyError> {
        let (key, body) = child.stamped(owner)?;
        if let Some(c) = &self.caches {
            c.note_manager(owner.field_manager());
        }
        let api = self.api(&child.resource, key.namespace.as_deref());
        let err = |action, source| ApplyError::Api {
            child: key.clone(),
            action,
            source: Box::new(source),
        };
        let done = |outcome| {
            Ok(Applied {
                outcome,
                repaired: None,
                created: None,
                released: None,
                regenerated: false,
            })
        };
        let created = |outcome, uid| {
            Ok(Applied {
                outcome,
                repaired: None,
                created: Some(uid),
                released: None,
                regenerated: false,
            })
        };
        let attempts = self.retry.attempts();
        for attempt in 0..attempts {
            self.retry.sleep_before(attempt).await;
            let Some(live) = observed.take() else {
                match self.create(&api, owner, &key, &body).await {
                    Ok(uid) => return created(ChildOutcome::Created, uid),
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
            // Ours: controlled by the owner; or, unless the kind releases orphans, created by it
            // (its uid, the live object's, is in the owner's record, which only we write) or,
            // for an owner without a record, evidently ours with its reference lost. Labels
            // and ownerReferences anyone may edit never take a recorded child away from us:
            // it is repaired. Nor do they make an unrecorded object ours when the owner has a
            // record: a label and a field manager's name can be forged by whoever may write
            // the object, and a child of ours that lost its reference is in the record.
            let recorded = meta.uid.as_deref().is_some_and(|uid| owner.recorded(uid));
            let controlled = owner.owns(&meta);
            let lost = !owner.has_record() && owner.lost_reference(&meta);
            let foreign = !controlled && (child.release_orphan || !(recorded || lost));
            if let Some(c) = &self.caches {
                c.set_foreign(&key, foreign);
                if !foreign {
                    // Ours at a desired name (read from the API server when the cache held
                    // only a stub of it): cached whole from now on.
                    c.ours(&key, &live);
                }
            }
            if foreign {
                self.answers.forget(&key);
                // An administrator released a recorded child of such a kind by removing its
                // controller reference: what else on it names the owner (another reference,
                // the owner-uid label) goes too, once (released, it leaves the record).
                if recorded && child.release_orphan {
                    let _in_flight = self.begin_write(&key);
                    crate::apply::release(
                        &self.client,
                        &child.resource,
                        &meta,
                        owner.label_names(),
                        owner.uid(),
                    )
                    .await
                    .map_err(|source| err("release", source))?;
                }
                return Ok(Applied {
                    outcome: ChildOutcome::NotOwned {
                        reason: owner.describe_foreign(&meta),
                    },
                    repaired: None,
                    created: None,
                    // An administrator released a recorded child of such a kind.
                    released: meta.uid.clone().filter(|_| recorded),
                    regenerated: false,
                });
            }
            // Being deleted, but still in effect until it is gone (a RoleBinding still grants,
            // a ConfigMap is still read), however long a finalizer someone else put on it keeps
            // it: what drifted is repaired as on any child of ours, never by a recreate, and
            // the outcome is that it is terminating (created again once gone).
            let terminating =
                meta.deletion_timestamp
                    .is_some()
                    .then(|| ChildOutcome::Terminating {
                        finalizers: meta.finalizers.clone().unwrap_or_default(),
                        unrepaired: None,
                    });
            // A child of ours that lost its ownerReference: put it back only if the owner, read
            // now, is not being deleted (see `Owner::is_being_deleted`: an orphaning deletion
            // removes the references, and the garbage collector would otherwise delete the
            // children it was told to keep). One read, only when a reference is missing.
            if !controlled
                && owner
                    .is_being_deleted(&self.client)
                    .await
                    .map_err(|source| err("get", source))?
            {
                tracing::info!(child = %key, "owner is being deleted: its removed ownerReference stays removed");
                return done(ChildOutcome::Unchanged);
            }
            // A desired child of ours missing from the owner's record: created by a pass that
            // never saw the POST's answer (a crash, a timeout), or taken over at a desired
            // name. It is recorded now, so that it is pruned once no longer desired. An object
            // that only claims the owner under a name that is not desired is never applied to,
            // so never recorded (see `super::record`).
            let record = meta.uid.clone().filter(|uid| !owner.may_prune(uid));
            let drift =
                super::takeover::drift_of(&live, owner.label_names(), owner.field_manager(), &body);
            // A terminating child of ours missing from the record is recorded too: still in
            // effect, it is pruned like any other once no longer desired.
            let unchanged = |record| {
                Ok(Applied {
                    outcome: terminating.clone().unwrap_or(ChildOutcome::Unchanged),
                    repaired: None,
                    created: record,
                    released: None,
                    regenerated: false,
                })
            };
            // Judged converged: a stub of it need not be read again until it changes.
            let converged = || {
                if let Some(c) = &self.caches
                    && record.is_none()
                    && terminating.is_none()
                    // The fingerprint only for a stub: not on every converged child's judge.
                    && c.is_stub(&child.resource, &key)
                {
                    c.judged_converged(&child.resource, &key, &live, keyed_fingerprint(&body));
                }
            };
            if drift.is_empty() {
                converged();
                return unchanged(record);
            }
            // What the check cannot judge alone (a default inside a value we own whole, a
            // canonical form it does not know): the server's answer for this desired body,
            // kept from an earlier write or asked once with a dry-run apply.
            let desired_fp = fingerprint(&body);
            let mut asked = None;
            if same_desired(&live, &body, owner.label_names())
                && drift.iter().all(server_may_explain)
            {
                let uid = meta.uid.as_deref().unwrap_or_default();
                let answer = match self.answers.get(&key, uid, desired_fp) {
                    Some(answer) => Some(answer),
                    None => match self.dry_run(&api, owner, &key, &body, &live).await {
                        Ok(answer) => Some(self.answers.learn(
                            &key,
                            desired_fp,
                            &answer,
                            owner.field_manager(),
                        )),
                        Err(e) => {
                            asked = Some(e);
                            None
                        }
                    },
                };
                if let Some(answer) = answer
                    && answer.is_some()
                    && answer == settled(&live, owner.field_manager())
                {
                    converged();
                    return unchanged(record);
                }
            }
            tracing::debug!(child = %key, drift = ?drift, "child drifted");
            // A recorded child someone gave another controller: that reference goes first (the
            // API server allows one controller, so the apply that restores ours would fail).
            if !controlled && let Some(patch) = unclaim_patch(&live, owner.uid()) {
                let _in_flight = self.begin_write(&key);
                let merge = Patch::Merge(&patch);
                match wire::patch(
                    &self.client,
                    &api,
                    &key.name,
                    &PatchParams::default(),
                    &merge,
                )
                .await
                {
                    Ok(patched) => {
                        self.remember(&key, &patched);
                        observed = Some(patched);
                    }
                    Err(e) => observed = self.read_again(&child.resource, &key, &meta, e).await?,
                }
                continue;
            }
            // A dry-run the server refused is the apply's answer too (no write to learn it).
            let result = match asked {
                Some(e) => Err(e),
                None => self.apply(&api, owner, &key, &body, &live).await,
            };
            let e = match result {
                Ok(applied) => {
                    // What the server's own form of the desired body differs in from it
                    // (its defaults, its canonical forms) was never drift.
                    let own_form =
                        own_form(&body, &applied, owner.label_names(), owner.field_manager());
                    // A field another manager took is always theirs to report; a value that
                    // differs where the server's own form differs too is that form.
                    let mut drift: Vec<Drift> = drift
                        .into_iter()
                        .filter(|d| {
                            let own = own_form.contains(d)
                                || (server_may_explain(d)
                                    && own_form.iter().any(|o| o.path == d.path));
                            !own
                        })
                        .collect();
                    if drift.is_empty() && !own_form.is_empty() {
                        // What the check could not name: what the apply restored.
                        drift = differences(&live, &applied, owner.field_manager());
                    }
                    self.keep_answer(&key, desired_fp, &applied, owner, &own_form);
                    // The desired body is the one applied last (same fingerprint): every
                    // difference was made by someone else.
                    let same_desired = same_desired(&live, &body, owner.label_names());
                    // A field we own that the desired body lacks (`Stale`) is reported only when
                    // the apply removed or changed it (a key someone added under our manager
                    // name); one the server defaults again (ours since the fold before an apply
                    // it refused) was left by our own writes.
                    // So is a zero value the object lacked (`Unrecorded`): reported only where
                    // the apply put it back (a map key someone removed), not where the server
                    // does not store it (Go omits it on the wire).
                    if drift
                        .iter()
                        .any(|d| matches!(d.kind, DriftKind::Stale | DriftKind::Unrecorded))
                    {
                        let changed = differences(&live, &applied, owner.field_manager());
                        drift.retain(|d| {
                            !matches!(d.kind, DriftKind::Stale | DriftKind::Unrecorded)
                                || changed.iter().any(|c| {
                                    c.path == d.path
                                        || c.path.starts_with(&format!("{}.", d.path))
                                        || c.path.starts_with(&format!("{}[", d.path))
                                })
                        });
                    }
                    let by_others = !drift.is_empty()
                        && !drift.iter().any(|d| d.kind == DriftKind::NeverApplied);
                    return Ok(Applied {
                        outcome: terminating.unwrap_or(ChildOutcome::Applied),
                        repaired: (same_desired && by_others).then(|| {
                            let rv = live.pointer("/metadata/resourceVersion");
                            (drift, rv.and_then(Value::as_str).map(str::to_owned))
                        }),
                        created: record,
                        released: None,
                        regenerated: false,
                    });
                }
                Err(e) => e,
            };
            // One that cannot be made as desired in place (an immutable field: created anew
            // once it is gone), or whose repair an admission webhook, a policy or authorization
            // refuses: it stays terminating, with the server's reason, and the pass goes on
            // (the owner's other children are applied and pruned meanwhile).
            if let Some(ChildOutcome::Terminating { finalizers, .. }) = &terminating
                && (is_invalid(&e) || is_forbidden(&e))
                && !uid_mismatch(&e)
            {
                return Ok(unrepaired(&key, finalizers.clone(), &e));
            }
            // An object at a desired name that claims the owner by its ownerReference but is
            // not in the owner's record (a tenant owner's, with a copied reference), and that
            // the server refuses to make as desired (an immutable field differs): not ours
            // after all. It stays theirs, reported as not owned (and watched, so that its
            // deletion brings ours back) — never recreated, and not a terminal error that
            // nothing would end.
            if is_invalid(&e) && !uid_mismatch(&e) && owner.has_record() && !recorded {
                if let Some(c) = &self.caches {
                    c.set_foreign(&key, true);
                }
                return Ok(Applied {
                    outcome: ChildOutcome::NotOwned {
                        reason: format!(
                            "{}, but was not created by it (its uid is not in the owner's record) and the API server refuses to make it as desired: {}",
                            owner.describe_foreign(&meta),
                            super::describe(&e)
                        ),
                    },
                    repaired: None,
                    created: None,
                    released: None,
                    regenerated: false,
                });
            }
            // Only the server's validation of the object (an immutable field differs) is mended
            // by a recreate: an admission policy's denial would delete a child the policy let be
            // (and a policy on updates alone would be got around by the create).
            if is_invalid(&e)
                && child.recreate
                && !uid_mismatch(&e)
                && !crate::api_error::is_admission_denial(&e)
            {
                let reason = super::describe(&e);
                let uid = self.recreate(&api, owner, &key, &body, &meta).await?;
                return Ok(Applied {
                    outcome: ChildOutcome::Recreated { reason },
                    repaired: None,
                    created: uid,
                    released: None,
                    regenerated: false,
                });
            }
            observed = match self.read_again(&child.resource, &key, &meta, e).await {
                // A 404 the read confirmed as a refusal (the write needs an object that is
                // missing, a RoleBinding's ClusterRole): a terminating child stays so too.
                Err(ApplyError::Api {
                    action: "apply",
                    source,
                    ..
                }) if let Some(ChildOutcome::Terminating { finalizers, .. }) = &terminating
                    && is_not_found(&source) =>
                {
                    return Ok(unrepaired(&key, finalizers.clone(), &source));
                }
                again => again?,
            };
        }
        Err(ApplyError::ConflictsExhausted {
            child: key,
            attempts,
        })
    }

    /// `POST`s the child: one write. An object someone created since our read gives
    /// AlreadyExists (never adopted). The create records an `Update` entry of our field
    /// manager, which the convergence check takes for the `Apply` entry the same body's apply
    /// records as long as the desired body is the created one ([`super::as_applied`]); an
    /// apply after the desired body changed moves it into our `Apply` entry first
    /// ([`Applier::apply`]).
    async fn create(
        &self,
        api: &Api<DynamicObject>,
        owner: &Owner,
        key: &ObjectKey,
        body: &Value,
    ) -> Result<String, kube::Error> {
        let created_json = self.create_whole(api, owner, key, body).await?;
        let own_form = own_form(
            body,
            &created_json,
            owner.label_names(),
            owner.field_manager(),
        );
        self.keep_answer(key, fingerprint(body), &created_json, owner, &own_form);
        let uid = created_json
            .pointer("/metadata/uid")
            .and_then(Value::as_str);
        Ok(uid.unwrap_or_default().to_owned())
    }

    /// `POST`s `body` and returns the created object (remembered for the child watches).
    async fn create_whole(
        &self,
        api: &Api<DynamicObject>,
        owner: &Owner,
        key: &ObjectKey,
        body: &Value,
    ) -> Result<Value, kube::Error> {
        let pp = PostParams {
            field_manager: Some(owner.field_manager().to_owned()),
            ..PostParams::default()
        };
        let _in_flight = self.begin_write(key);
        let created = wire::create(&self.client, api, &pp, body).await?;
        self.remember(key, &created);
        Ok(created)
    }

    /// Keeps the server's answer `written` (the object our write of the desired body with
    /// fingerprint `desired` left) when the convergence check cannot judge it alone
    /// (`own_form`: what the check finds between the desired body and that answer), so the
    /// next pass decides without asking; forgets it otherwise.
    fn keep_answer(
        &self,
        key: &ObjectKey,
        desired: crate::compare::Fingerprint,
        written: &Value,
        owner: &Owner,
        own_form: &[Drift],
    ) {
        if own_form.is_empty() {
            self.answers.forget(key);
        } else {
            tracing::debug!(child = %key, differs = ?own_form, "the server's form of the desired body differs from it: its answer is kept");
            self.answers
                .learn(key, desired, written, owner.field_manager());
        }
    }

    /// A `dryRun=All` forced apply of `body` (guarded by the live uid): the object the apply
    /// would leave, without writing it.
    async fn dry_run(
        &self,
        api: &Api<DynamicObject>,
        owner: &Owner,
        key: &ObjectKey,
        body: &Value,
        live: &Value,
    ) -> Result<Value, kube::Error> {
        let guarded = uid_guarded(body, live);
        let pp = PatchParams::apply(owner.field_manager()).force().dry_run();
        tracing::debug!(child = %key, "asking the server how it would store the desired body (dry-run apply)");
        wire::patch(&self.client, api, &key.name, &pp, &Patch::Apply(&guarded)).await
    }

    /// One server-side apply of `body` with force, without a `resourceVersion` (status churn
    /// must not cost conflicts) but with the live `metadata.uid`, so an object that replaced
    /// ours under the same name is never written. An `Update` entry of ours (left by our
    /// create, or by someone writing under our manager name) is folded into our `Apply` entry
    /// first, so the apply can remove fields we no longer desire ([`super::takeover`]).
    async fn apply(
        &self,
        api: &Api<DynamicObject>,
        owner: &Owner,
        key: &ObjectKey,
        body: &Value,
        live: &Value,
    ) -> Result<Value, kube::Error> {
        let _in_flight = self.begin_write(key);
        let fold =
            |live: &Value| fold_patch(live, owner.label_names(), owner.field_manager(), body);
        let mut folding = fold(live);
        if folding.is_some() && !timed(live) {
            // The fold writes the whole `managedFields` list, and a cached child has none of
            // its entries' times: it starts from the object as the API server has it, so every
            // other writer's entry keeps its time. Another object at the name is left alone
            // (the apply's uid guard refuses it).
            let read = wire::get(&self.client, api, &key.name).await?;
            let uid = |v: &Value| v.pointer("/metadata/uid").cloned();
            folding = read
                .filter(|now| uid(now) == uid(live))
                .and_then(|now| fold(&now));
        }
        if let Some(patch) = folding {
            let merge = Patch::Merge(&patch);
            let folded = wire::patch(
                &self.client,
                api,
                &key.name,
                &PatchParams::default(),
                &merge,
            )
            .await?;
            self.remember(key, &folded);
        }
        let guarded = uid_guarded(body, live);
        let pp = PatchParams::apply(owner.field_manager()).force();
        let applied =
            wire::patch(&self.client, api, &key.name, &pp, &Patch::Apply(&guarded)).await?;
        self.remember(key, &applied);
        Ok(applied)
    }

    /// Deletes the child (uid precondition) and creates it again, once a dry-run create has
    /// shown the server takes the desired body as a new object; the new uid, `None` when the
    /// old one is still terminating (the next reconcile creates it).
    async fn recreate(
        &self,
        api: &Api<DynamicObject>,
        owner: &Owner,
        key: &ObjectKey,
        body: &Value,
        meta: &kube::api::ObjectMeta,
    ) -> Result<Option<String>, ApplyError> {
        let err = |action, source| ApplyError::Api {
            child: key.clone(),
            action,
            source: Box::new(source),
        };
        // The server decides whether the desired body makes a valid new object: a dry-run
        // create validates it in full, then finds the name taken (409). Only such a body
        // replaces the child; one the server refuses as a new object too (a required value
        // missing, a port out of range) leaves it in place, and that refusal is the error.
        let dry = PostParams {
            dry_run: true,
            field_manager: Some(owner.field_manager().to_owned()),
        };
        match wire::create(&self.client, api, &dry, body).await {
            Ok(_) => {}
            Err(e) if is_already_exists(&e) => {}
            Err(e) => return Err(err("create", e)),
        }
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: meta.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::foreground()
        };
        match api.delete(&key.name, &dp).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(err("delete", e)),
        }
        if let Some(c) = &self.caches {
            c.forget(key);
        }
        match self.create(api, owner, key, body).await {
            Ok(uid) => Ok(Some(uid)),
            // Still terminating (foreground deletion): the next reconcile creates it.
            Err(e) if is_already_exists(&e) => Ok(None),
            Err(e) => Err(err("create", e)),
        }
    }
}

/// The outcome of the terminating child `key` (held by `finalizers`) whose in-place repair the
/// server refused with `e`: still terminating, with the server's reason. Not recorded: one that
/// only claims the owner (a copied reference) and that the server refuses to make as desired
/// is not ours.
fn unrepaired(key: &ObjectKey, finalizers: Vec<String>, e: &kube::Error) -> Applied {
    let reason = super::describe(e);
    tracing::info!(child = %key, error = %reason, "a terminating child cannot be repaired in place");
    Applied {
        outcome: ChildOutcome::Terminating {
            finalizers,
            unrepaired: Some(reason),
        },
        repaired: None,
        created: None,
        released: None,
        regenerated: false,
    }
}

/// A JSON merge patch (guarded by the `resourceVersion`) removing from `live` the controller
/// ownerReferences to owners other than `owner_uid`; `None` when there is none.
fn unclaim_patch(live: &Value, owner_uid: &str) -> Option<Value> {
    let refs = live.pointer("/metadata/ownerReferences")?.as_array()?;
    let foreign = |r: &&Value| {
        r.get("controller") == Some(&Value::Bool(true))
            && r.get("uid").and_then(Value::as_str) != Some(owner_uid)
    };
    if !refs.iter().any(|r| foreign(&r)) {
        return None;
    }
    let kept: Vec<Value> = refs.iter().filter(|r| !foreign(r)).cloned().collect();
    Some(json!({"metadata": {
        "resourceVersion": live.pointer("/metadata/resourceVersion"),
        "ownerReferences": if kept.is_empty() { Value::Null } else { Value::Array(kept) },
    }}))
}

/// Whether every `managedFields` entry of `live` has its `time` (the caches drop them).
fn timed(live: &Value) -> bool {
    live.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .all(|e| e.get("time").is_some_and(|t| !t.is_null()))
}

/// `body` with the live object's `metadata.uid`: a write of it never reaches an object that
/// replaced ours under the same name.
fn uid_guarded(body: &Value, live: &Value) -> Value {
    let mut guarded = body.clone();
    guarded["metadata"]["uid"] = live
        .pointer("/metadata/uid")
        .cloned()
        .unwrap_or(Value::Null);
    guarded
}

/// What the convergence check finds between the desired body `body` and `written`, the object
/// our write of it left: the server's own form of the body, where it differs from it.
fn own_form(body: &Value, written: &Value, labels: Labels, manager: &str) -> Vec<Drift> {
    super::takeover::judged(written, labels, manager, body)
}

/// Whether `live` was last applied from the desired body `body` (same fingerprint annotation,
/// the owner kind's: `labels`).
fn same_desired(live: &Value, body: &Value, labels: Labels) -> bool {
    let fp = |v: &Value| {
        v.pointer("/metadata/annotations")
            .and_then(|a| a.get(labels.fingerprint()))
            .cloned()
    };
    fp(live) == fp(body)
}

/// Whether the server's own form of the desired body may explain `drift`: a value that differs
/// in a field we still own, or a field no manager owns. A field another manager took, or an
/// object never applied, is drift the server cannot explain away.
fn server_may_explain(drift: &Drift) -> bool {
    match &drift.kind {
        DriftKind::Changed | DriftKind::Stale | DriftKind::Unrecorded => true,
        DriftKind::NotOwned { managers } => managers.is_empty(),
        DriftKind::NeverApplied => false,
    }
}

/// A dynamic object as JSON (`apiVersion`, `kind`, `metadata`, and its other fields).
fn to_json(obj: &DynamicObject) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}
