//! The apply engine: server-side apply of desired children, only where they drifted, pruning
//! children no longer desired, never touching objects another owner controls.
//!
//! Rules, and their sources:
//! - Children are written with server-side apply (`PATCH` `application/apply-patch+yaml`) under
//!   the owner's field manager with `force=true`, so idem takes over the fields it applies and
//!   leaves fields owned by other managers alone (server-side apply's conflicts).
//! - A child is written only when it is not converged by the server's own record
//!   ([`crate::compare`]: our `Apply` entry in `managedFields` covers exactly the desired
//!   fields and every desired value equals the live one). A converged reconcile makes no write,
//!   and with [`ChildCaches`] no request at all: children are read, and listed for pruning,
//!   from the controller's watch caches. Each applied child also carries the fingerprint of
//!   its desired body in the owner kind's fingerprint annotation ([`Labels::fingerprint`]):
//!   when it still matches, every drift was made
//!   by someone else and is reported as a [`Repair`] (the `DriftRepaired` event).
//! - Every child gets a controller ownerReference to the owner (`controller: true`,
//!   `blockOwnerDeletion: true`), the label [`MANAGED_BY_LABEL`] and, under the owner kind's
//!   label prefix ([`Labels`]: `#[idempotent(label_prefix = "...")]`, default the CRD's
//!   group), `<prefix>/tenant`, `<prefix>/owner-uid` and `<prefix>/shard-bucket` (for idem's
//!   operator's kinds [`TENANT_LABEL`], [`OWNER_UID_LABEL`], [`SHARD_BUCKET_LABEL`] and
//!   [`FINGERPRINT_ANNOTATION`]). A live object without our controller ownerReference is never
//!   modified, adopted or deleted: it is reported as [`ChildOutcome::NotOwned`].
//! - Applies carry no `resourceVersion` (a Deployment's status churn must not cost 409s) but
//!   carry the observed `metadata.uid`: an object that replaced ours under the same name makes
//!   the apply fail (422, uid is immutable) instead of being adopted, and is read again. A
//!   409 (the ownership move below is guarded by `resourceVersion`) or 404 re-reads the child
//!   from the API server, up to [`RetryPolicy`] attempts (client-go `retry.DefaultRetry`).
//! - A child that was absent is created with `POST` (so an object someone created since our
//!   read gives AlreadyExists and is read: ours → apply, not ours → `NotOwned`, never
//!   adopted): one write. The `Update` entry the create records stands for the `Apply` entry an
//!   apply of the same body records ([`as_applied`]), so a fresh child is converged at once.
//!   Once the desired body changes, the next apply first moves that record into our `Apply`
//!   entry (one `resourceVersion`-guarded `PATCH` of `managedFields`, as kubectl's
//!   client-side → server-side upgrade does), so the apply can remove fields we no longer
//!   desire.
//! - An apply rejected as 422 Invalid is an error, never a silent `PUT` (which would drop other
//!   managers' labels, annotations and finalizers). Kinds that opt in with
//!   [`DesiredChildren::allow_recreate`] are deleted (uid precondition) and created again
//!   instead ([`ChildOutcome::Recreated`]; the operator records an Event `Recreated`), unless
//!   the 422 is an admission webhook's or ValidatingAdmissionPolicy's denial (an
//!   administrator's rule: the child stays as it is and the apply is an error).
//! - The prune deletes a child only when the owner's record of the children it created holds
//!   its uid ([`Owner::with_record`], [`record`]): a controller ownerReference and our labels
//!   can be forged by whoever may create that kind there, so an object that only claims the
//!   owner is reported ([`ApplyReport::unrecorded`]) and never deleted.
//! - A delete that meets `NotFound` is success (the object is gone, which is what we wanted).
//!   Deletes carry a `uid` precondition, so a same-named object created since is never deleted.

mod engine;
mod metrics;
mod once;
mod owner;
pub mod record;
mod release;
mod report;
mod takeover;

pub use engine::Applier;
pub use metrics::DriftMetrics;
pub(crate) use owner::distinct_kind_names;
pub use owner::{ChildScope, DesiredChild, DesiredChildren, Owner};
pub use record::{CreatedChild, RecordDelta};
pub use release::{refers_to, release};
pub use report::{ApplyReport, ChildOutcome, Repair};
pub use takeover::as_applied;

pub use crate::backoff::RetryPolicy;
pub use crate::cache::ChildCaches;
pub use crate::labels::{
    FINGERPRINT_ANNOTATION, Labels, MANAGED_BY_LABEL, OPERATOR_PREFIX, OWNER_UID_LABEL,
    SHARD_BUCKET_LABEL, TENANT_LABEL,
};

use crate::api_error::is_admission_denial;
pub(crate) use crate::api_error::{describe, is_already_exists, is_conflict, is_not_found};
use crate::key::ObjectKey;

/// Errors of the apply engine.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The owner was not read from the API server: it lacks `metadata.name` or `metadata.uid`.
    #[error(
        "owner {kind} has no metadata.name or metadata.uid; only stored objects can own children"
    )]
    OwnerNotStored {
        /// The owner's kind.
        kind: String,
    },
    /// A desired child could not be turned into JSON, or is not a JSON object.
    #[error("desired child {kind} cannot be serialised: {reason}")]
    Serialize {
        /// The child's kind.
        kind: String,
        /// What went wrong.
        reason: String,
    },
    /// A desired child has no `metadata.name`.
    #[error("desired child {kind} has no metadata.name")]
    MissingName {
        /// The child's kind.
        kind: String,
    },
    /// A desired child cannot be owned by this owner: Kubernetes only allows a namespaced owner
    /// to own objects in its own namespace (API conventions, garbage collection).
    #[error("desired child {child} cannot be owned by {owner}: {reason}")]
    InvalidScope {
        /// The child.
        child: ObjectKey,
        /// The owner.
        owner: ObjectKey,
        /// Why.
        reason: &'static str,
    },
    /// Two desired children have the same kind, namespace and name.
    #[error("desired child {0} is listed twice")]
    Duplicate(ObjectKey),
    /// Two kinds of one name in different API groups among the desired children's kinds
    /// (e.g. a `Gateway` of two projects): children are recorded and keyed by kind name, so
    /// the prune of one would read the other's records. A terminal error.
    #[error(
        "desired children have two kinds named {kind}, {first} and {second}: children are recorded by kind name, so an owner's children must not have two kinds of one name"
    )]
    SameKindName {
        /// The kind's name.
        kind: String,
        /// The first kind's `apiVersion`.
        first: String,
        /// The second kind's `apiVersion`.
        second: String,
    },
    /// A request to the API server failed with an error that retrying will not fix. Displayed
    /// as `{action} {child}: {code} {reason}: {message}` for an API status error.
    #[error("{action} {child}: {}", describe(source))]
    Api {
        /// The child.
        child: ObjectKey,
        /// The request: `get`, `create`, `apply`, `list`, `delete`.
        action: &'static str,
        /// The client error.
        #[source]
        source: Box<kube::Error>,
    },
    /// A create-once child ([`DesiredChildren::create_once`]) the owner created, by its record,
    /// is gone: deleted, or replaced by another object at its name. Not created again with a
    /// new value (its users hold the old one) unless its kind is opted in with
    /// [`DesiredChildren::regenerate_deleted`]; a terminal error (reason `ChildDeleted`). Its
    /// message says how to restore it: an object restored at its name is taken once the
    /// recorded uid is removed from the owner's record (a status write), not before.
    #[error(
        "{child} was created once by its owner (uid {uid}) and {}: it is not created again with a new value its users do not know. To restore it: create it again from a backup with the owner's controller ownerReference, then remove the entry of uid {uid} from the owner's status.createdChildren (a status write, e.g. `kubectl edit <kind> <name> --subresource=status`; the record alone decides what is ours, so an object at its name is not taken while the record names another), then annotate the owner so that it is reconciled (a status write alone does not wake it); or opt in to regenerating it",
        match replaced_by {
            Some(other) => format!("was deleted; its name now holds another object (uid {other})"),
            None => "was deleted".to_owned(),
        }
    )]
    ChildDeleted {
        /// The child.
        child: ObjectKey,
        /// The uid the owner's record holds.
        uid: String,
        /// The uid of the object now at its name, if any.
        replaced_by: Option<String>,
    },
    /// Every attempt met 409 Conflict (someone else kept changing the child).
    #[error("{child}: still conflicting after {attempts} attempts")]
    ConflictsExhausted {
        /// The child.
        child: ObjectKey,
        /// Attempts made.
        attempts: u32,
    },
}

impl ApplyError {
    /// Whether the API server refused the desired child itself: 422 Invalid on its create or
    /// apply, from the server's validation of the body, which the same desired body meets again
    /// on every retry; or an apply the server cannot merge into a typed object (its 500
    /// "failed to create typed patch object", e.g. two items of one key in an associative
    /// list, which a create admits), or its 500 "failed to convert new object" on a create or
    /// apply (not a conversion webhook's), or its 400 BadRequest for a body it cannot decode as the
    /// kind (a quantity that does not parse). Not the 422 of an apply carrying the live `metadata.uid`
    /// when the child was replaced since the read (the engine reads again and never returns it
    /// for that), nor a denial by an admission webhook or a ValidatingAdmissionPolicy (an
    /// admin may lift it).
    pub fn is_invalid_child(&self) -> bool {
        let Self::Api {
            action: action @ ("create" | "apply"),
            source,
            ..
        } = self
        else {
            return false;
        };
        let kube::Error::Api(status) = source.as_ref() else {
            return false;
        };
        if (*action == "apply" && unmergeable(status)) || untypable(status) {
            return true;
        }
        // The body cannot be decoded as the kind ("cannot be handled as a ResourceQuota: quantities must match …").
        if status.code == 400 && status.reason == "BadRequest" {
            return true;
        }
        status.code == 422
            && status.reason == "Invalid"
            && !status
                .details
                .as_ref()
                .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
            && !is_admission_denial(source)
    }
}

/// Whether `status` is the API server's 500 for an apply body it cannot make a typed object of
/// (server-side apply's conversion of the applied configuration against the kind's schema):
/// the same body fails the same way every time.
fn unmergeable(status: &kube::core::Status) -> bool {
    status.code == 500
        && status
            .message
            .starts_with("failed to create typed patch object")
}

/// Whether `status` is the API server's 500 for an applied object it cannot convert to the
/// kind (a quantity that does not parse, say: "failed to convert new object … to proper
/// version" or "… to smd typed"): the same body fails the same way on every create or apply.
/// Not a conversion webhook's failure (that webhook may come back).
fn untypable(status: &kube::core::Status) -> bool {
    status.code == 500
        && status.message.starts_with("failed to convert new object")
        && !status.message.contains("webhook")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(action: &'static str, status: kube::core::Status) -> ApplyError {
        ApplyError::Api {
            child: ObjectKey::namespaced("Service", "ns", "my.app"),
            action,
            source: Box::new(kube::Error::Api(Box::new(status))),
        }
    }

    fn status(code: u16, reason: &str, message: &str, field: Option<&str>) -> kube::core::Status {
        kube::core::Status {
            code,
            reason: reason.into(),
            message: message.into(),
            details: field.map(|f| {
                serde_json::from_value(serde_json::json!({"causes": [{"field": f}]})).unwrap()
            }),
            ..kube::core::Status::default()
        }
    }

    #[test]
    fn only_the_servers_422_on_the_desired_body_is_an_invalid_child() {
        let invalid = status(
            422,
            "Invalid",
            r#"Service "my.app" is invalid: metadata.name: Invalid value: "my.app": a DNS-1035 label must consist of lower case alphanumeric characters or '-'"#,
            Some("metadata.name"),
        );
        assert!(rejected("create", invalid.clone()).is_invalid_child());
        assert!(rejected("apply", invalid.clone()).is_invalid_child());
        assert!(!rejected("delete", invalid).is_invalid_child());
        let replaced = status(
            422,
            "Invalid",
            "Precondition failed: UID in precondition: a, UID in object meta: b",
            Some("metadata.uid"),
        );
        assert!(!rejected("apply", replaced).is_invalid_child());
        let webhook = status(
            422,
            "Invalid",
            r#"admission webhook "check.example.com" denied the request: no"#,
            None,
        );
        assert!(!rejected("apply", webhook).is_invalid_child());
        let policy = status(
            422,
            "Invalid",
            "services \"x\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no",
            None,
        );
        assert!(!rejected("create", policy).is_invalid_child());
        let forbidden = status(403, "Forbidden", "forbidden", None);
        assert!(!rejected("create", forbidden).is_invalid_child());
        let unmergeable = status(
            500,
            "",
            r#"failed to create typed patch object (ns/web; apps/v1, Kind=Deployment): .spec.template.spec.containers[name="app"].env: duplicate entries for key [name="A"]"#,
            None,
        );
        assert!(rejected("apply", unmergeable.clone()).is_invalid_child());
        assert!(!rejected("delete", unmergeable).is_invalid_child());
        let untypable = status(
            500,
            "",
            "failed to convert new object (t/db; apps/v1, Kind=StatefulSet) to smd typed: \
             .spec.volumeClaimTemplates[0].spec.resources.requests.storage: quantities must \
             match the regular expression",
            None,
        );
        assert!(rejected("create", untypable.clone()).is_invalid_child());
        assert!(rejected("apply", untypable).is_invalid_child());
        let undecodable = status(
            400,
            "BadRequest",
            "ResourceQuota in version \"v1\" cannot be handled as a ResourceQuota: quantities \
             must match the regular expression",
            None,
        );
        assert!(rejected("create", undecodable.clone()).is_invalid_child());
        assert!(!rejected("get", undecodable).is_invalid_child());
        let webhook_down = status(
            500,
            "",
            "failed to convert new object (ns/x; example.com/v1, Kind=W) to proper version \
             (example.com/v2): conversion webhook for example.com/v1, Kind=W failed: connection refused",
            None,
        );
        assert!(!rejected("apply", webhook_down).is_invalid_child());
        let internal = status(500, "InternalError", "etcdserver: request timed out", None);
        assert!(!rejected("apply", internal).is_invalid_child());
        let missing = ApplyError::Duplicate(ObjectKey::namespaced("Service", "ns", "a"));
        assert!(!missing.is_invalid_child());
    }

    #[test]
    fn api_error_displays_the_status_message() {
        let status = kube::core::Status {
            code: 422,
            reason: "Invalid".into(),
            message: r#"Service "web" is invalid: spec.ports[1].name: Duplicate value: "http""#
                .into(),
            ..kube::core::Status::default()
        };
        let err = ApplyError::Api {
            child: ObjectKey::namespaced("Service", "ns", "web"),
            action: "apply",
            source: Box::new(kube::Error::Api(Box::new(status))),
        };
        assert_eq!(
            err.to_string(),
            r#"apply Service/ns/web: 422 Invalid: Service "web" is invalid: spec.ports[1].name: Duplicate value: "http""#
        );
    }
}
