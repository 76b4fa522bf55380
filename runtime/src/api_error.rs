//! What the API server's error answers mean (conflict, already exists, not found, invalid,
//! forbidden) and how they read in a message, for every layer that writes.

/// A client error in words: for an API status, `{code} {reason}: {message}` (the status the
/// server sent, not its Rust debug form); otherwise the error's own message.
pub(crate) fn describe(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => {
            format!(
                "{} {}: {}",
                status.code,
                status.reason,
                one_line(&status.message)
            )
        }
        other => other.to_string(),
    }
}

/// The longest server message a description keeps, in characters.
const MESSAGE_MAX: usize = 400;

/// `message` on one line, its lines joined with spaces; past [`MESSAGE_MAX`] characters, its
/// first and last halves of that with `…` between: some refusals go on after a colon with
/// what matters (the rules an RBAC escalation lacks), others give a diff of the whole object
/// first and the reason last (a StatefulSet's forbidden spec update), which a condition
/// message and an Event cannot hold whole.
fn one_line(message: &str) -> String {
    let joined = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let chars = joined.chars().count();
    if chars <= MESSAGE_MAX {
        return joined;
    }
    let half = MESSAGE_MAX / 2;
    let head: String = joined.chars().take(half).collect();
    let tail: String = joined.chars().skip(chars - half).collect();
    format!("{head} … {tail}")
}

/// The API status `reason` of an error, when it is one.
pub(crate) fn api_reason(err: &kube::Error) -> Option<(u16, &str)> {
    match err {
        kube::Error::Api(status) => Some((status.code, status.reason.as_str())),
        _ => None,
    }
}

/// Whether `err` is 409 Conflict on a write guarded by `resourceVersion` (not AlreadyExists).
pub(crate) fn is_conflict(err: &kube::Error) -> bool {
    matches!(api_reason(err), Some((409, reason)) if reason != "AlreadyExists")
}

/// Whether `err` is 409 AlreadyExists.
pub(crate) fn is_already_exists(err: &kube::Error) -> bool {
    matches!(api_reason(err), Some((409, "AlreadyExists")))
}

/// Whether `err` is 404 NotFound.
pub(crate) fn is_not_found(err: &kube::Error) -> bool {
    matches!(api_reason(err), Some((404, _)))
}

/// Whether `err` is 404 NotFound that may be for the object `name` a write was sent to: its
/// details name it, or name nothing. A 404 naming another object is for one the server looked
/// up to admit the write (a missing ClusterRole a RoleBinding binds, in the API server's
/// escalation check), never "deleted since it was read". The details' resource cannot tell the
/// two apart (that check's answer names the ClusterRole with the binding's resource), so a
/// 404 naming the object is only a hint: the caller reads the object again to know.
pub(crate) fn is_not_found_named(err: &kube::Error, name: &str) -> bool {
    let kube::Error::Api(status) = err else {
        return false;
    };
    status.code == 404
        && status
            .details
            .as_ref()
            .is_none_or(|d| d.name.is_empty() || d.name == name)
}

/// Whether `err` is a denial by an admission webhook or a ValidatingAdmissionPolicy (which
/// answers 422 Invalid when the policy names no other reason), not the server's validation of
/// the object: an administrator's rule, which deleting and creating the object again must
/// not get around.
pub(crate) fn is_admission_denial(err: &kube::Error) -> bool {
    let kube::Error::Api(status) = err else {
        return false;
    };
    status.message.contains("admission webhook")
        || status.message.contains("ValidatingAdmissionPolicy")
}

/// Whether `err` is 422 Invalid (the object failed validation).
pub(crate) fn is_invalid(err: &kube::Error) -> bool {
    matches!(api_reason(err), Some((422, "Invalid")))
}

/// Whether `err` is 403 Forbidden: an admission webhook's denial (its default code), or
/// authorization's.
pub(crate) fn is_forbidden(err: &kube::Error) -> bool {
    matches!(api_reason(err), Some((403, _)))
}

/// Whether `err` is the 422 the API server gives when the apply's `metadata.uid` is not the
/// stored object's (the object was replaced since we read it).
pub(crate) fn uid_mismatch(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(s) => {
            s.code == 422
                && s.details
                    .as_ref()
                    .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use kube::core::response::StatusDetails;

    fn not_found(name: Option<&str>) -> kube::Error {
        let mut status = Status::failure("not found", "NotFound");
        status.code = 404;
        status.details = name.map(|name| StatusDetails {
            group: "rbac.authorization.k8s.io".into(),
            kind: "rolebindings".into(),
            name: name.into(),
            uid: String::new(),
            causes: Vec::new(),
            retry_after_seconds: 0,
        });
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn a_message_is_described_on_one_line_whole_up_to_a_bound() {
        let escalation = "user \"system:serviceaccount:idem-system:idem-operator\" is \
            attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"*\"], \
            Resources:[\"*\"], Verbs:[\"*\"]}\n";
        let mut status = Status::failure(escalation, "Forbidden");
        status.code = 403;
        let said = describe(&kube::Error::Api(Box::new(status)));
        assert!(
            said.ends_with(
                "not currently held: {APIGroups:[\"*\"], Resources:[\"*\"], Verbs:[\"*\"]}"
            ),
            "{said}"
        );
        let diff = format!("spec is immutable\n{}", "  -  x: y\n".repeat(500));
        let mut status = Status::failure(&diff, "Invalid");
        status.code = 422;
        let said = describe(&kube::Error::Api(Box::new(status)));
        assert!(!said.contains('\n'), "{said}");
        assert!(said.chars().count() <= MESSAGE_MAX + 20, "{said}");
        assert!(said.contains("spec is immutable"), "{said}");
        assert!(said.contains(" … "), "{said}");
        // A diff first and the reason last: the reason is kept.
        let reason = "spec: Forbidden: updates to statefulset spec for fields other than \
            'replicas' are forbidden";
        let message = format!(
            "{} {reason}",
            "{\"Status\":{\"Phase\":\"Pending\"}} ".repeat(60)
        );
        let mut status = Status::failure(&message, "Invalid");
        status.code = 422;
        let said = describe(&kube::Error::Api(Box::new(status)));
        assert!(said.ends_with(reason), "{said}");
    }

    #[test]
    fn a_404_naming_another_object_is_not_the_written_objects() {
        assert!(is_not_found_named(&not_found(Some("x")), "x"));
        assert!(is_not_found_named(&not_found(None), "x"));
        // The escalation check's answer for the ClusterRole `viewer` the binding `x` binds.
        assert!(!is_not_found_named(&not_found(Some("viewer")), "x"));
    }
}
