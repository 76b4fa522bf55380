//! Kubernetes Events about what a reconcile changed: each child created, recreated, repaired
//! or deleted, and each change of the `Ready` condition. Publishing is best effort: a failure
//! is logged, never fails the reconcile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::{Event, EventType};

use super::budget::EventBudget;
use super::recorder::Recorder;
use crate::apply::{ApplyReport, ChildOutcome};
use crate::key::ObjectKey;
use crate::status::{MAX_MESSAGE_BYTES, Readiness, shorten};

/// A recorder and the Event budgets of the objects it publishes about and of their tenants
/// (shared by every pass of a driver, see [`EventBudget`]).
#[derive(Clone)]
pub(crate) struct Publisher {
    recorder: Recorder,
    budget: Arc<EventBudget>,
    tenants: Arc<EventBudget>,
}

/// An Event budget: so many at once, then one per interval.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Allowance {
    pub burst: u32,
    pub every: Duration,
}

impl Publisher {
    /// Publishes with `recorder`, at most `object.burst` Events per object at once, then one
    /// per `object.every`, and within that `tenant.burst` per tenant, then one per
    /// `tenant.every` (the tenant of the reconcile publishing, [`crate::inflight::current_tenant`]).
    pub(crate) fn new(recorder: Recorder, object: Allowance, tenant: Allowance) -> Self {
        Self {
            recorder,
            budget: Arc::new(EventBudget::new(object.burst, object.every)),
            tenants: Arc::new(EventBudget::new(tenant.burst, tenant.every)),
        }
    }

    /// The same budget, publishing with `recorder` (e.g. one of another client).
    pub(crate) fn with_recorder(&self, recorder: Recorder) -> Self {
        Self {
            recorder,
            ..self.clone()
        }
    }
}

/// Publishes `event` about `reference` if the object's Event budget allows (else it is held
/// back, and the next one published says how many were), its note cut to the 1024 bytes an
/// Event may hold (at a character boundary, see [`shorten`]); a failure is logged at `warn`.
pub async fn publish(publisher: &Publisher, reference: &ObjectReference, event: Event) {
    send(publisher, reference, event, true).await;
}

/// As [`publish`], whatever the object's budget (it still counts against it): for the few
/// Events only an administrator's action causes, once each, that would otherwise be lost
/// after an owner spent the budget (a Tenant's `Retained` and `Released`: the only record of
/// what its deletion or a release kept).
pub async fn publish_always(publisher: &Publisher, reference: &ObjectReference, event: Event) {
    send(publisher, reference, event, false).await;
}

async fn send(
    publisher: &Publisher,
    reference: &ObjectReference,
    mut event: Event,
    budgeted: bool,
) {
    let object = reference.uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}/{}",
            reference.kind.as_deref().unwrap_or_default(),
            reference.namespace.as_deref().unwrap_or_default(),
            reference.name.as_deref().unwrap_or_default()
        )
    });
    let now = Instant::now();
    let held = match publisher.budget.take(&object, now) {
        Some(held) => held,
        None if !budgeted => 0,
        None => {
            tracing::debug!(reason = %event.reason, "an event held back: its object's Event budget is spent");
            return;
        }
    };
    // Within the object's budget, the tenant's: a tenant's many objects, each within its own
    // budget, cannot have the controller write Events without bound either.
    if let Some(tenant) = crate::inflight::current_tenant()
        && publisher.tenants.take(tenant.as_str(), now).is_none()
        && budgeted
    {
        publisher.budget.give_back(&object, held);
        tracing::debug!(reason = %event.reason, %tenant, "an event held back: its tenant's Event budget is spent");
        return;
    }
    if let Some(note) = &event.note {
        event.note = Some(if held == 0 {
            shorten(note, MAX_MESSAGE_BYTES)
        } else {
            let said = format!(
                " ({held} earlier Events about this object held back: at most {} at once, then one every {})",
                publisher.budget.burst(),
                humantime::format_duration(publisher.budget.every())
            );
            format!(
                "{}{said}",
                shorten(note, MAX_MESSAGE_BYTES.saturating_sub(said.len()))
            )
        });
    }
    if let Err(e) = publisher.recorder.publish(&event, reference).await {
        tracing::warn!(error = %e, reason = %event.reason, "could not publish an event");
    }
}

/// The most of a `fieldPath` an Event's related object gets (the note has every path).
const MAX_FIELD_PATH_BYTES: usize = 256;

/// A reference to a child, for an event's `related` object.
fn child_reference(key: &ObjectKey) -> ObjectReference {
    ObjectReference {
        kind: Some(key.kind.to_string()),
        namespace: key.namespace.as_ref().map(ToString::to_string),
        name: Some(key.name.to_string()),
        ..ObjectReference::default()
    }
}

/// What goes with `key` when it is deleted, said in its `Deleted` Event: a Namespace's deletion
/// deletes every object in it.
fn contents(key: &ObjectKey) -> &'static str {
    if key.namespace.is_none() && &*key.kind == "Namespace" {
        " with everything in it"
    } else {
        ""
    }
}

/// Events on the owner about its children: `Normal` `Created` per child created (saying
/// "again" when the owner's record held it: it was gone), `Deleted`
/// per child pruned (saying why: no longer desired, or, when `owner_deleted`, its owner is
/// being deleted), one `Warning` `NotPruned` for the objects that claim the owner without
/// being in its record of created children (never deleted, see [`crate::apply::record`];
/// [`not_pruned`]); `Warning` `Recreated` per child deleted and created again (its apply was
/// rejected, e.g. an immutable field changed) and `DriftRepaired` per child whose fields another
/// writer had changed, naming the fields and the field managers that changed them (e.g.
/// `RoleBinding/acme-dev/idem-owners: .subjects changed by kubectl-edit (Update), restored`),
/// one Event per repair (see the comment in the body).
pub async fn children(
    publisher: &Publisher,
    reference: &ObjectReference,
    report: &ApplyReport,
    owner_deleted: bool,
) {
    for (key, outcome) in &report.children {
        let event = match outcome {
            ChildOutcome::Created => Event {
                type_: EventType::Normal,
                reason: "Created".into(),
                note: Some(if report.remade.contains(key) {
                    format!(
                        "created {key} again: the one its status records was gone (deleted by someone, with its namespace, or by an earlier prune)"
                    )
                } else {
                    format!("created {key}")
                }),
                action: "Apply".into(),
                // The child, with the uid it was created with, as related object: kube's
                // recorder folds events with the same related object into one series and
                // keeps the first note, so each child, and each creation of it, gets its own.
                secondary: Some(ObjectReference {
                    uid: (report.created.iter())
                        .find(|c| c.key() == *key)
                        .map(|c| c.uid.clone()),
                    ..child_reference(key)
                }),
            },
            ChildOutcome::Recreated { reason } => Event {
                type_: EventType::Warning,
                reason: "Recreated".into(),
                note: Some(format!(
                    "deleted and created {key} again: the apply was rejected: {reason}"
                )),
                action: "Recreate".into(),
                secondary: Some(child_reference(key)),
            },
            _ => continue,
        };
        publish(publisher, reference, event).await;
    }
    for repair in &report.repaired {
        // kube's recorder folds events with the same owner, reason, action and related object
        // into one series and keeps the first event's note (client-go's events/v1 recorder
        // keys series by the note too): with the child alone as related object, a repair of
        // other fields of the same child (a removed label after a changed `.subjects`), or by
        // another manager, only counted up the old note. The related object names the drifted
        // fields (`fieldPath`) and the child's `resourceVersion` with the drift, so each repair
        // is an Event of its own. The managers are the field-manager names in
        // `managedFields`, which each writer chooses: a lead to who changed what, not proof (the
        // API server's audit log has the user).
        let mut related = child_reference(&repair.child);
        related.field_path = Some(shorten(&repair.paths(), MAX_FIELD_PATH_BYTES));
        related
            .resource_version
            .clone_from(&repair.resource_version);
        let event = Event {
            type_: EventType::Warning,
            reason: "DriftRepaired".into(),
            note: Some(repair.to_string()),
            action: "Repair".into(),
            secondary: Some(related),
        };
        publish(publisher, reference, event).await;
    }
    if let Some(event) = not_pruned(&report.unrecorded) {
        publish(publisher, reference, event).await;
    }
    for key in &report.pruned {
        let event = Event {
            type_: EventType::Normal,
            reason: "Deleted".into(),
            note: Some(if owner_deleted {
                format!("deleted {key}{}: its owner is being deleted", contents(key))
            } else {
                format!("deleted {key}{}, no longer desired", contents(key))
            }),
            action: "Prune".into(),
            secondary: Some(child_reference(key)),
        };
        publish(publisher, reference, event).await;
    }
}

/// Most objects a `NotPruned` Warning names (it counts them all).
pub const NOT_PRUNED_NAMED: usize = 5;

/// Owners whose last `NotPruned` set is remembered ([`Noticed`]); at the cap the memory
/// starts over, which costs at most one more Warning per owner, never one per object.
pub const NOTICED_OWNERS_CAP: usize = 10_000;

/// The first [`NOT_PRUNED_NAMED`] of `keys`, and how many more: `a, b and 3 more`.
fn first_named(keys: &[ObjectKey]) -> String {
    let named: Vec<String> = keys
        .iter()
        .take(NOT_PRUNED_NAMED)
        .map(ToString::to_string)
        .collect();
    match keys.len().saturating_sub(NOT_PRUNED_NAMED) {
        0 => named.join(", "),
        rest => format!("{} and {rest} more", named.join(", ")),
    }
}

/// The `Warning` `UndeclaredChildren` about `undeclared`, the children in the owner's record
/// whose kinds its reconciler no longer declares (none: `None`): they are no longer watched,
/// repaired or pruned, and the record holds no version to find them by. One Event whatever
/// their number, counting them and naming the first [`NOT_PRUNED_NAMED`].
pub fn undeclared(undeclared: &[ObjectKey]) -> Option<Event> {
    let (first, n) = (undeclared.first()?, undeclared.len());
    let note = format!(
        "{n} of this object's created children (its status record) are of kinds its reconciler no longer declares in children(): they are neither repaired nor pruned. Declare the kind again to have them pruned, or delete them yourself and remove their entries from status.createdChildren: {}",
        first_named(undeclared)
    );
    let mut related = child_reference(first);
    related.field_path = Some(format!("{n} objects, set {:016x}", digest(undeclared)));
    Some(Event {
        type_: EventType::Warning,
        reason: "UndeclaredChildren".into(),
        note: Some(note),
        action: "Prune".into(),
        secondary: Some(related),
    })
}

/// The `Warning` `NotPruned` about `unrecorded`, the objects that claim the owner without
/// being in its record (none: `None`): one Event whatever their number, counting them and
/// naming the first [`NOT_PRUNED_NAMED`]; its related object names the set (the first object,
/// with the set's count and digest as `fieldPath`), so that another set is an Event of its own
/// rather than a repeat of the first one's series.
pub fn not_pruned(unrecorded: &[ObjectKey]) -> Option<Event> {
    let (first, n) = (unrecorded.first()?, unrecorded.len());
    let note = if n == 1 {
        format!(
            "{first} claims this object as its controller but is not in its status record of created children (someone else created it, or a create whose answer was never recorded, e.g. before a crash): not deleted; remove its ownerReference or delete it yourself"
        )
    } else {
        format!(
            "{n} objects claim this object as their controller but are not in its status record of created children (someone else created them, or creates whose answers were never recorded, e.g. before a crash): not deleted; remove their ownerReference or delete them yourself: {}",
            first_named(unrecorded)
        )
    };
    let mut related = child_reference(first);
    if n > 1 {
        related.field_path = Some(format!("{n} objects, set {:016x}", digest(unrecorded)));
    }
    Some(Event {
        type_: EventType::Warning,
        reason: "NotPruned".into(),
        note: Some(note),
        action: "Prune".into(),
        secondary: Some(related),
    })
}

/// A digest of a set of keys (order does not matter).
fn digest(keys: &[ObjectKey]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut sorted: Vec<&ObjectKey> = keys.iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    sorted.hash(&mut h);
    h.finish()
}

/// What was last reported as `NotPruned` per owner (by uid) and set of pruned kinds: one
/// digest of the set, so the Warning is published again only when the set changes, in memory
/// bounded per owner whatever the number of objects.
#[derive(Debug, Default)]
pub(crate) struct Noticed {
    last: std::sync::Mutex<std::collections::HashMap<(String, u64), u64>>,
}

impl Noticed {
    /// Whether `unrecorded`, found by an apply of the kinds `kinds` for owner `owner_uid`,
    /// differs from what was last reported for them (then it is remembered: report it).
    /// An empty set is never reported and forgets the last one.
    pub(crate) fn changed(
        &self,
        owner_uid: &str,
        kinds: &[&str],
        unrecorded: &[ObjectKey],
    ) -> bool {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut kinds = kinds.to_vec();
        kinds.sort_unstable();
        kinds.hash(&mut h);
        let at = (owner_uid.to_owned(), h.finish());
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if unrecorded.is_empty() {
            last.remove(&at);
            return false;
        }
        let now = digest(unrecorded);
        if last.get(&at) == Some(&now) {
            return false;
        }
        if last.len() >= NOTICED_OWNERS_CAP && !last.contains_key(&at) {
            last.clear();
        }
        last.insert(at, now);
        true
    }
}

/// An event when the readiness differs from the stored `Ready` condition (`previous`):
/// `Normal` for Ready and Reconciling, `Warning` for Stalled, with the reason and message.
pub async fn readiness(
    publisher: &Publisher,
    reference: &ObjectReference,
    previous: Option<&Condition>,
    now: &Readiness,
) {
    let (type_, status, reason, message) = match now {
        Readiness::Ready { reason, message } => (EventType::Normal, "True", reason, message),
        Readiness::Reconciling { reason, message } => (EventType::Normal, "False", reason, message),
        Readiness::Stalled { reason, message } => (EventType::Warning, "False", reason, message),
    };
    if previous.is_some_and(|c| c.status == status && &c.reason == reason) {
        return;
    }
    let event = Event {
        type_,
        reason: reason.clone(),
        note: Some(format!("Ready={status}: {message}")),
        action: "Reconcile".into(),
        secondary: None,
    };
    publish(publisher, reference, event).await;
}

/// A `Warning` `Regenerated` per create-once child that was deleted and created anew with a
/// new value (its kind opted in with
/// [`DesiredChildren::regenerate_deleted`](crate::apply::DesiredChildren::regenerate_deleted)),
/// the child as related object: whoever used the old value must pick up the new one. (A
/// deleted create-once child of any other kind stalls the owner with reason `ChildDeleted`,
/// which the `Ready` change reports as a Warning of that reason.)
pub async fn regenerated(publisher: &Publisher, reference: &ObjectReference, keys: &[ObjectKey]) {
    for key in keys {
        let event = Event {
            type_: EventType::Warning,
            reason: "Regenerated".into(),
            note: Some(format!(
                "created {key} anew with a new value: it was deleted, and its kind regenerates deleted create-once children"
            )),
            action: "Create".into(),
            secondary: Some(child_reference(key)),
        };
        publish(publisher, reference, event).await;
    }
}
