//! The status engine: observedGeneration, kstatus conditions, and status writes that never go
//! backwards.
//!
//! Rules, and their sources:
//! - Conditions have the `metav1.Condition` shape and are validated before any write as the
//!   API server validates them (apimachinery `ValidateConditions`): type is a qualified name
//!   (optional DNS-subdomain prefix, name ≤ 63 characters), status is `True`, `False` or
//!   `Unknown`, reason matches `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$` and is 1–1024
//!   characters, message is at most 32768 bytes. idem cuts every condition message to
//!   [`MAX_MESSAGE_BYTES`] (1024) at a character boundary before that check, so a long message
//!   (one quoting a foreign object's 48 KiB name) is shortened, never a status write that fails
//!   forever.
//! - `lastTransitionTime` changes only when a condition's status changes (API conventions,
//!   "Typical status properties"); times are whole seconds, as `metav1.Time` is serialised.
//! - `Ready`, `Reconciling` and `Stalled` follow kstatus (sigs.k8s.io/cli-utils/pkg/kstatus):
//!   `Ready` is normal-true, `Reconciling` and `Stalled` are abnormal-true; see [`Readiness`].
//! - The status is written only when it changed (compared as JSON), with a `PUT` to the
//!   `/status` subresource carrying the `resourceVersion` that was read: a reconcile that
//!   started from an older object gets 409 Conflict, re-reads and recomputes, up to
//!   [`RetryPolicy`](crate::apply::RetryPolicy) attempts (client-go `retry.DefaultRetry`).
//! - `observedGeneration` is the generation the reconcile read. It never goes backwards: if the
//!   stored status already observed a newer generation, the write is abandoned
//!   ([`StatusOutcome::Superseded`]).

mod applied;
mod conditions;
mod message;
mod writer;

pub use conditions::{ConditionStatus, Readiness, StatusDraft, validate_condition};
pub use message::{MAX_MESSAGE_BYTES, shorten};
pub use writer::{StatusOutcome, StatusWriter};

use crate::api_error::{is_admission_denial, is_invalid};

/// Errors of the status engine.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// A condition type is not a qualified name (apimachinery `ValidateConditions`).
    #[error(
        "condition type {0:?} is not a valid qualified name (optional DNS prefix, name of 1-63 characters [A-Za-z0-9_.-] starting and ending alphanumeric)"
    )]
    InvalidType(String),
    /// A condition type is not among the resource's declared `conditions(...)`.
    #[error("condition type {0:?} is not declared in #[idempotent(conditions(...))]")]
    UndeclaredType(String),
    /// A condition reason does not match `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$` or is
    /// longer than 1024 characters.
    #[error(
        "condition reason {0:?} must match ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$ and be 1-1024 characters"
    )]
    InvalidReason(String),
    /// A condition message is longer than 32768 bytes.
    #[error("condition message of {0} bytes exceeds the 32768-byte limit")]
    MessageTooLong(usize),
    /// The object has no `metadata.generation`, `name` or `resourceVersion`: it was not read
    /// from the API server.
    #[error("object has no metadata.{0}; status writes need an object read from the API server")]
    NotStored(&'static str),
    /// A request failed with an error that retrying will not fix.
    #[error("{action} {name}: {source}")]
    Api {
        /// The object's name.
        name: String,
        /// The request: `get`, `replace_status`, `patch`.
        action: &'static str,
        /// The client error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Every attempt met 409 Conflict.
    #[error("{name}: status still conflicting after {attempts} attempts")]
    ConflictsExhausted {
        /// The object's name.
        name: String,
        /// Attempts made.
        attempts: u32,
    },
}

impl StatusError {
    /// Whether the status itself is refused, so the same reconcile meets the same refusal on
    /// every retry: a condition these checks refuse (type, reason, message), or a status write
    /// the API server's validation refuses as 422 Invalid (a value the CRD's status schema
    /// does not allow). Not an admission webhook's or policy's denial, which an administrator
    /// may lift.
    pub fn is_invalid_status(&self) -> bool {
        match self {
            Self::InvalidType(_)
            | Self::UndeclaredType(_)
            | Self::InvalidReason(_)
            | Self::MessageTooLong(_) => true,
            Self::Api {
                action: "replace_status",
                source,
                ..
            } => is_invalid(source) && !is_admission_denial(source),
            _ => false,
        }
    }
}
