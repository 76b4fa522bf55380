//! Setting metav1.Condition-shaped conditions and the kstatus Ready/Reconciling/Stalled trio.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::StatusError;
use super::message::{MAX_MESSAGE_BYTES, shorten};

/// A condition's status (`metav1.ConditionStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    /// `"True"`.
    True,
    /// `"False"`.
    False,
    /// `"Unknown"`.
    Unknown,
}

impl ConditionStatus {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// Where a reconcile stands, expressed as kstatus conditions.
///
/// | variant | `Ready` | `Reconciling` | `Stalled` |
/// |---|---|---|---|
/// | `Ready` | True | False | False |
/// | `Reconciling` | False | True | False |
/// | `Stalled` | False | False | True |
///
/// The reason and message go on every condition the resource declares among the three.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// The desired state is reached.
    Ready {
        /// CamelCase reason, e.g. `Reconciled`.
        reason: String,
        /// Human-readable detail.
        message: String,
    },
    /// Work is in progress and expected to finish without help (e.g. a Deployment rolling out).
    Reconciling {
        /// CamelCase reason, e.g. `Progressing`.
        reason: String,
        /// Human-readable detail.
        message: String,
    },
    /// Progress needs help from outside, e.g. a child name is taken by an object we do not
    /// own.
    Stalled {
        /// CamelCase reason, e.g. `ChildNotOwned`.
        reason: String,
        /// Human-readable detail.
        message: String,
    },
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

fn valid_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && label.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

/// Whether `t` is a valid condition type: a qualified name, as the API server checks.
pub fn valid_type(t: &str) -> bool {
    let (prefix, name) = match t.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, t),
    };
    prefix.is_none_or(valid_dns_subdomain)
        && !name.is_empty()
        && name.len() <= 63
        && name.starts_with(is_alnum)
        && name.ends_with(is_alnum)
        && name
            .chars()
            .all(|c| is_alnum(c) || matches!(c, '-' | '_' | '.'))
}

/// Whether `r` is a valid reason: `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, ≤ 1024.
pub fn valid_reason(r: &str) -> bool {
    r.len() <= 1024
        && r.starts_with(|c: char| c.is_ascii_alphabetic())
        && r.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':'))
        && r.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
}

/// Checks a condition's type, reason and message against the API server's rules.
///
/// # Errors
/// [`StatusError::InvalidType`], [`StatusError::InvalidReason`] or
/// [`StatusError::MessageTooLong`].
pub fn validate_condition(type_: &str, reason: &str, message: &str) -> Result<(), StatusError> {
    if !valid_type(type_) {
        return Err(StatusError::InvalidType(type_.to_owned()));
    }
    if !valid_reason(reason) {
        return Err(StatusError::InvalidReason(reason.to_owned()));
    }
    if message.len() > 32768 {
        return Err(StatusError::MessageTooLong(message.len()));
    }
    Ok(())
}

/// The current time as `metav1.Time`, in whole seconds (its wire precision).
pub(crate) fn now_seconds() -> Time {
    let now = Timestamp::now();
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// A status being computed for one write: the object's generation, the time of this
/// computation and the declared condition types; handed to the closure of
/// [`super::StatusWriter::write`].
pub struct StatusDraft<'a, S> {
    status: &'a mut S,
    conditions_of: fn(&mut S) -> &mut Vec<Condition>,
    generation: i64,
    now: Time,
    declared: &'static [&'static str],
    error: Option<StatusError>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for StatusDraft<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusDraft")
            .field("status", &self.status)
            .field("generation", &self.generation)
            .field("declared", &self.declared)
            .finish_non_exhaustive()
    }
}

impl<'a, S> StatusDraft<'a, S> {
    /// A draft over `status`, whose conditions `conditions_of` reaches, for `generation`, at
    /// time `now`, allowing the `declared` condition types.
    pub fn new(
        status: &'a mut S,
        conditions_of: fn(&mut S) -> &mut Vec<Condition>,
        generation: i64,
        now: Time,
        declared: &'static [&'static str],
    ) -> Self {
        Self {
            status,
            conditions_of,
            generation,
            now,
            declared,
            error: None,
        }
    }

    /// The status, to set resource-specific fields (e.g. available replicas).
    pub fn status_mut(&mut self) -> &mut S {
        self.status
    }

    /// The generation this status will claim to have observed.
    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// Sets one condition. `lastTransitionTime` is kept unless the status flips;
    /// `observedGeneration` of the condition is set to the draft's generation. The message is
    /// cut to [`MAX_MESSAGE_BYTES`] at a character boundary, ending in `…` (so any content,
    /// e.g. a foreign object's name quoted in it, can be written). An invalid or undeclared
    /// type or reason is recorded and makes the whole write fail before any request.
    pub fn set_condition(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) -> &mut Self {
        if self.error.is_some() {
            return self;
        }
        let message = &shorten(message, MAX_MESSAGE_BYTES);
        if let Err(e) = validate_condition(type_, reason, message) {
            self.error = Some(e);
            return self;
        }
        if !self.declared.contains(&type_) {
            self.error = Some(StatusError::UndeclaredType(type_.to_owned()));
            return self;
        }
        let conditions = (self.conditions_of)(self.status);
        let now = self.now.clone();
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != status.as_str() {
                    c.status = status.as_str().to_owned();
                    c.last_transition_time = now;
                }
                c.reason = reason.to_owned();
                c.message = message.to_owned();
                c.observed_generation = Some(self.generation);
            }
            None => conditions.push(Condition {
                type_: type_.to_owned(),
                status: status.as_str().to_owned(),
                reason: reason.to_owned(),
                message: message.to_owned(),
                last_transition_time: now,
                observed_generation: Some(self.generation),
            }),
        }
        self
    }

    /// Sets the kstatus conditions (those of `Ready`, `Reconciling`, `Stalled` the resource
    /// declares) as the table on [`Readiness`] says.
    ///
    /// The condition that is `True` carries the readiness' reason and message, and so does
    /// `Ready` when it is `False` (it says why the object is not ready: what `kubectl wait`
    /// shows). An abnormal-true condition that is `False` gets its own reason and message
    /// saying which state holds instead (e.g. `Stalled=False` reason `Progressing` while
    /// reconciling), so the three never repeat one another.
    pub fn set_readiness(&mut self, readiness: &Readiness) -> &mut Self {
        use ConditionStatus::{False, True};
        let (state, reason, message) = match readiness {
            Readiness::Ready { reason, message } => ("Ready", reason, message),
            Readiness::Reconciling { reason, message } => ("Reconciling", reason, message),
            Readiness::Stalled { reason, message } => ("Stalled", reason, message),
        };
        // Reason and message of an abnormal-true condition that does not hold.
        let other = match state {
            "Ready" => ("Ready", "the desired state is reached"),
            "Reconciling" => ("Progressing", "work is in progress (see Reconciling)"),
            _ => (
                "NeedsHelp",
                "progress needs help from outside (see Stalled)",
            ),
        };
        for t in ["Ready", "Reconciling", "Stalled"] {
            if !self.declared.contains(&t) {
                continue;
            }
            if t == state {
                self.set_condition(t, True, reason, message);
            } else if t == "Ready" {
                self.set_condition(t, False, reason, message);
            } else {
                self.set_condition(t, False, other.0, other.1);
            }
        }
        self
    }

    /// The first error recorded, if any.
    pub(crate) fn into_error(self) -> Option<StatusError> {
        self.error
    }
}

#[cfg(test)]
mod tests;
