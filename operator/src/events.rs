//! Kubernetes Events about what a reconcile changed: each child created or deleted, and each
//! change of the `Ready` condition. Publishing is best effort: a failure is logged, never fails
//! the reconcile.

use idem_runtime::apply::{ApplyReport, ChildOutcome};
use idem_runtime::status::Readiness;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::{Event, EventType, Recorder};

/// Publishes `event`, its note cut to the 1024 bytes an Event may hold (at a character
/// boundary: see [`crate::status::shorten`]).
pub async fn publish(recorder: &Recorder, reference: &ObjectReference, mut event: Event) {
    if let Some(note) = &event.note {
        event.note = Some(crate::status::shorten(
            note,
            crate::status::MAX_MESSAGE_BYTES,
        ));
    }
    if let Err(e) = recorder.publish(&event, reference).await {
        tracing::warn!(error = %e, reason = %event.reason, "could not publish an event");
    }
}

/// One `Normal` event per child created (`Created`) and per child pruned (`Deleted`).
pub async fn children(recorder: &Recorder, reference: &ObjectReference, report: &ApplyReport) {
    for (key, outcome) in &report.children {
        if *outcome == ChildOutcome::Created {
            let event = Event {
                type_: EventType::Normal,
                reason: "Created".into(),
                note: Some(format!("created {key}")),
                action: "Apply".into(),
                secondary: None,
            };
            publish(recorder, reference, event).await;
        }
    }
    for key in &report.pruned {
        let event = Event {
            type_: EventType::Normal,
            reason: "Deleted".into(),
            note: Some(format!("deleted {key}, no longer desired")),
            action: "Prune".into(),
            secondary: None,
        };
        publish(recorder, reference, event).await;
    }
}

/// An event when the readiness differs from the stored `Ready` condition (`previous`):
/// `Normal` for Ready and Reconciling, `Warning` for Stalled, with the reason and message.
pub async fn readiness(
    recorder: &Recorder,
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
    publish(recorder, reference, event).await;
}
