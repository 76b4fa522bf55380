//! The admission policy that keeps a kind's cleanup finalizer on its objects until the driver
//! has marked their cleanup done in their status.
//!
//! Children carry a controller ownerReference to their owner, and once the owner is gone the
//! garbage collector deletes every one of them, whatever the cleanup would have kept. Removing
//! the finalizer by hand (the usual cure for an object stuck in deletion while its controller
//! is down) therefore deletes what a `Retain` cleanup keeps. The [`Driver`](super::Driver)
//! writes a condition with reason [`CLEANUP_DONE`] into the status just before it removes
//! [`Reconciler::FINALIZER`](super::Reconciler::FINALIZER); [`cleanup_guard`]'s policy refuses
//! every other removal from an object being deleted. Status is a subresource, written by the
//! controller: whoever really means to skip the cleanup writes the mark first, on purpose.
//!
//! A deletion in the foreground (`kubectl delete --cascade=foreground`, `propagationPolicy:
//! Foreground`, what some GitOps tools send by default) skips the cleanup the same way: the
//! garbage collector deletes the dependents at once, before any controller could release
//! them. So the guard also refuses a foreground deletion of an object that holds the finalizer;
//! deleted in the background (the default), it is cleaned up first. Nor may an object lose the
//! finalizer on the way: one its controller has seen (it has conditions; the controller adds
//! the finalizer before anything else) and that lacks it (removed by an update while the
//! controller was down) may not be deleted until the controller has put it back, or the mark
//! is written.
//!
//! The guard and the driver go together: a controller built before the mark existed cannot
//! remove its finalizer under the guard, so rolling back to one means deleting the guard
//! first.

use serde_json::{Value, json};

use crate::resource::IdempotentResource;

/// The reason of the condition the driver writes once the cleanup is done, just before it
/// removes the finalizer (`Reconciling`, and `Ready` `False`, carry it).
pub const CLEANUP_DONE: &str = "CleanupDone";

/// The kstatus conditions the mark is written to (`Reconciling` `True` and `Ready` `False`
/// carry the reason; `Stalled` `False` does not); a kind that declares neither cannot carry it.
const MARKED_ON: [&str; 2] = ["Ready", "Reconciling"];

/// The `ValidatingAdmissionPolicy` and its binding (`Deny`) that refuse an update of a `K`
/// being deleted that removes `finalizer` while neither its `Ready` nor its `Reconciling`
/// condition has reason [`CLEANUP_DONE`], whoever sends it, cluster administrators included.
/// An object not being deleted may lose the finalizer (a `kubectl replace` of a manifest
/// without it): the driver puts it back. `labels` go on both objects.
///
/// Then the policy and its binding that refuse deleting a `K` that holds `finalizer` in the
/// foreground (its dependents would be deleted before its cleanup runs), and giving one the
/// `foregroundDeletion` finalizer that makes any deletion so; and the policy and its binding
/// that refuse deleting a `K` its controller has seen (it has conditions) but that lost
/// `finalizer` since, until the mark. A collection's delete is judged object by object.
///
/// `None` when `K` declares neither `Ready` nor `Reconciling` (the driver has nowhere to
/// write the mark) or `finalizer` holds a quote or a backslash (finalizer names are qualified
/// names, which never do).
pub fn cleanup_guard<K: IdempotentResource>(finalizer: &str, labels: &Value) -> Option<[Value; 6]> {
    if !K::CONDITION_TYPES.iter().any(|t| MARKED_ON.contains(t)) || finalizer.contains(['\'', '\\'])
    {
        return None;
    }
    let (group, plural, kind) = (K::group(&()), K::plural(&()), K::kind(&()));
    let name = format!("idem-cleanup.{plural}.{group}");
    let object = if K::NAMESPACED {
        "NAME -n NAMESPACE"
    } else {
        "NAME"
    };
    let holds = |obj: &str| {
        format!("has({obj}.metadata.finalizers) && '{finalizer}' in {obj}.metadata.finalizers")
    };
    let types = MARKED_ON.map(|t| format!("'{t}'")).join(", ");
    let marked = format!(
        "has(oldObject.status) && has(oldObject.status.conditions) && \
         oldObject.status.conditions.exists(c, c.type in [{types}] && has(c.reason) && \
         c.reason == '{CLEANUP_DONE}')"
    );
    let message = format!(
        "the finalizer {finalizer} stays on this {kind} being deleted until its controller has \
         done the cleanup (neither its Ready nor its Reconciling condition has reason \
         {CLEANUP_DONE}): without it the garbage collector deletes every object whose \
         ownerReference points at the {kind}, also what the cleanup would keep. Have the \
         controller started (a cluster administrator's task) and it removes the finalizer \
         itself; to skip the cleanup on purpose, first set the reason of the {kind}'s Ready \
         condition to {CLEANUP_DONE} in its status: kubectl patch {plural}.{group} {object} \
         --subresource=status --type=json -p '[{{\"op\":\"replace\",\"path\":\"/status/conditions/I/reason\",\"value\":\"{CLEANUP_DONE}\"}}]' \
         with I the index of Ready among its conditions"
    );
    let [policy, binding] = denying(
        &name,
        labels,
        json!({
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["*"],
                "operations": ["UPDATE"], "resources": [plural]}]},
            "matchConditions": [
                {"name": "being-deleted", "expression": "has(oldObject.metadata.deletionTimestamp)"},
                {"name": "removes-the-cleanup-finalizer",
                 "expression": format!("({}) && !({})", holds("oldObject"), holds("object"))},
            ],
            "validations": [{"expression": marked, "message": message, "reason": "Forbidden"}],
        }),
    );
    let foreground = format!("idem-foreground.{plural}.{group}");
    let foreground_finalizer = |obj: &str| {
        format!(
            "has({obj}.metadata.finalizers) && 'foregroundDeletion' in {obj}.metadata.finalizers"
        )
    };
    let [foreground_policy, foreground_binding] = denying(
        &foreground,
        labels,
        json!({
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE", "DELETE"], "resources": [plural]}]},
            "matchConditions": [
                // A write that gives the finalizer is judged whatever the object holds: removing
                // the cleanup finalizer first, then adding `foregroundDeletion`, must not pass.
                {"name": "a-write-or-holds-the-cleanup-finalizer",
                 "expression": format!("request.operation != 'DELETE' || (oldObject != null && {})", holds("oldObject"))},
                // A delete asked for in the foreground, or any delete of an object that has the
                // `foregroundDeletion` finalizer; or a create or update that gives it that
                // finalizer (deleting the CRD deletes its objects without admission, and each such
                // deletion would be one in the foreground).
                {"name": "in-the-foreground",
                 "expression": format!(
                    "request.operation == 'DELETE' ? \
                     ((has(request.options) && has(request.options.propagationPolicy) && \
                       request.options.propagationPolicy == 'Foreground') || ({old_fg})) : \
                     (object != null && ({new_fg}) && !(oldObject != null && ({old_fg})))",
                    old_fg = foreground_finalizer("oldObject"),
                    new_fg = foreground_finalizer("object"))},
            ],
            "validations": [{"expression": "false", "reason": "Forbidden", "message": format!(
                "this {kind} may not be deleted in the foreground (propagationPolicy: Foreground, \
                 kubectl delete --cascade=foreground, or the finalizer foregroundDeletion, which \
                 may not be added to it either): the garbage collector would delete every object \
                 whose ownerReference points at it before its controller's cleanup (the finalizer \
                 {finalizer}) decides what to keep. Delete it in the background, the default \
                 (kubectl delete {plural}.{group} {object}); a tool that deletes in the foreground \
                 must be set to delete in the background")}],
        }),
    );
    // Its controller adds the finalizer before anything else, so an object with conditions
    // had it: without it now, someone removed it (a `kubectl replace` or edit of a manifest
    // without it) and the controller has not put it back (it is down, or its shard's replica
    // is). Deleted so, the garbage collector deletes what the cleanup would keep.
    let unguarded = format!("idem-unguarded.{plural}.{group}");
    let [unguarded_policy, unguarded_binding] = denying(
        &unguarded,
        labels,
        json!({
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["*"],
                "operations": ["DELETE"], "resources": [plural]}]},
            "matchConditions": [
                {"name": "lacks-the-cleanup-finalizer",
                 "expression": format!("oldObject != null && !({})", holds("oldObject"))},
                {"name": "seen-by-its-controller",
                 "expression": "has(oldObject.status) && has(oldObject.status.conditions) && \
                                size(oldObject.status.conditions) > 0"},
            ],
            "validations": [{"expression": marked, "reason": "Forbidden", "message": format!(
                "this {kind} has lost the finalizer {finalizer} (removed while it was not being \
                 deleted, e.g. by a kubectl replace or edit of a manifest without it) and its \
                 controller has not put it back: deleted now, the garbage collector would delete \
                 every object whose ownerReference points at it, also what its cleanup would keep. \
                 Have its controller running (it puts the finalizer back), then delete it; to \
                 delete it without the cleanup on purpose, a cluster administrator first sets \
                 the reason of its Ready \
                 condition to {CLEANUP_DONE}: kubectl patch {plural}.{group} {object} \
                 --subresource=status --type=json -p '[{{\"op\":\"replace\",\"path\":\"/status/conditions/I/reason\",\"value\":\"{CLEANUP_DONE}\"}}]' \
                 with I the index of Ready among its conditions")}],
        }),
    );
    Some([
        policy,
        binding,
        foreground_policy,
        foreground_binding,
        unguarded_policy,
        unguarded_binding,
    ])
}

/// A `ValidatingAdmissionPolicy` named `name` with `spec`, and its binding (`Deny`), both
/// labelled `labels`.
fn denying(name: &str, labels: &Value, spec: Value) -> [Value; 2] {
    let policy = json!({"apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": spec});
    let binding = json!({"apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels},
        "spec": {"policyName": name, "validationActions": ["Deny"]}});
    [policy, binding]
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
    struct St {
        observed_generation: Option<i64>,
        conditions: Vec<Condition>,
    }

    #[derive(
        CustomResource,
        idem_macros::IdempotentResource,
        Clone,
        Debug,
        Serialize,
        Deserialize,
        JsonSchema,
    )]
    #[kube(group = "t.example", version = "v1", kind = "Kept", status = "St")]
    #[idempotent(crate = "crate", tenant = name, prune = owner_references)]
    struct KeptSpec {}

    #[derive(
        CustomResource,
        idem_macros::IdempotentResource,
        Clone,
        Debug,
        Serialize,
        Deserialize,
        JsonSchema,
    )]
    #[kube(group = "t.example", version = "v1", kind = "Own", status = "St")]
    #[idempotent(crate = "crate", tenant = name, prune = owner_references, conditions(Stalled, "t.example/Synced"))]
    struct OwnSpec {}

    #[test]
    fn the_guard_refuses_removing_its_finalizer_from_its_kind_until_the_mark() {
        let [
            policy,
            binding,
            foreground,
            foreground_binding,
            unguarded,
            _,
        ] = cleanup_guard::<Kept>("t.example/cleanup", &json!({})).unwrap();
        assert_eq!(
            unguarded["spec"]["matchConstraints"]["resourceRules"][0]["operations"],
            json!(["DELETE"])
        );
        assert!(
            (unguarded["spec"]["validations"][0]["expression"]
                .as_str()
                .unwrap())
            .contains(&format!("c.reason == '{CLEANUP_DONE}'"))
        );
        let on = &foreground["spec"];
        assert_eq!(
            on["matchConstraints"]["resourceRules"][0]["operations"],
            json!(["CREATE", "UPDATE", "DELETE"])
        );
        assert!(
            (on["matchConditions"][0]["expression"].as_str().unwrap())
                .contains("'t.example/cleanup' in oldObject.metadata.finalizers")
        );
        assert!(
            (on["matchConditions"][1]["expression"].as_str().unwrap())
                .contains("request.options.propagationPolicy == 'Foreground'")
        );
        assert_eq!(
            foreground_binding["spec"]["policyName"],
            foreground["metadata"]["name"]
        );
        let spec = &policy["spec"];
        assert_eq!(
            spec["matchConstraints"]["resourceRules"][0]["resources"],
            json!(["kepts"])
        );
        assert_eq!(
            spec["matchConstraints"]["resourceRules"][0]["operations"],
            json!(["UPDATE"])
        );
        assert_eq!(
            spec["matchConditions"][0]["expression"], "has(oldObject.metadata.deletionTimestamp)",
            "only an object being deleted keeps it"
        );
        let removes = spec["matchConditions"][1]["expression"].as_str().unwrap();
        assert!(
            removes.contains("'t.example/cleanup' in oldObject.metadata.finalizers"),
            "{removes}"
        );
        let marked = spec["validations"][0]["expression"].as_str().unwrap();
        assert!(
            marked.contains(&format!("c.reason == '{CLEANUP_DONE}'")),
            "{marked}"
        );
        assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    }

    #[test]
    fn no_guard_for_a_kind_the_mark_cannot_be_written_to_or_a_finalizer_it_cannot_quote() {
        assert!(cleanup_guard::<Own>("t.example/cleanup", &json!({})).is_none());
        assert!(cleanup_guard::<Kept>("t.example/it's", &json!({})).is_none());
    }
}
