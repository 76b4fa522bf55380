//! What a reconcile returns ([`Action`]) and what it is told about its attempt ([`Attempt`]).

use std::time::Duration;

use crate::key::{ObjectKey, TenantKey};
use crate::queue::Priority;

/// The result of a finished reconcile: wait for the next change, reconcile again after a
/// delay, or a terminal error that was handled. Errors to retry are returned as `Err` and
/// retried with per-key backoff instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
    terminal: bool,
}

impl Action {
    /// Converged: reconcile again on the next change of the object or an owned child, or at
    /// the next periodic resync.
    pub fn await_change() -> Self {
        Self {
            requeue_after: None,
            terminal: false,
        }
    }

    /// The reconcile met a terminal error — one retrying cannot fix, controller-runtime's
    /// `reconcile.TerminalError` — and recorded it (the reconciler driver writes `Stalled`
    /// with the error's reason): not retried, no backoff; the key waits for the next change
    /// (or the periodic resync). Counted as controller-runtime counts a terminal error: in
    /// `controller_runtime_reconcile_total{result="error"}`,
    /// `controller_runtime_reconcile_errors_total` and
    /// `controller_runtime_terminal_reconcile_errors_total`.
    pub fn terminal() -> Self {
        Self {
            requeue_after: None,
            terminal: true,
        }
    }

    /// Whether this is [`Action::terminal`].
    pub fn is_terminal(&self) -> bool {
        self.terminal
    }

    /// Same as [`Action::await_change`] (controller-runtime's wording: the reconcile is done).
    pub fn done() -> Self {
        Self::await_change()
    }

    /// Reconcile again after exactly `after` (unless a change comes first); honoured as is,
    /// with no backoff or jitter.
    pub fn requeue(after: Duration) -> Self {
        Self {
            requeue_after: Some(after),
            terminal: false,
        }
    }

    /// The requested delay, if any.
    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// What the controller tells a reconcile about this attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The key being reconciled.
    pub key: ObjectKey,
    /// The tenant it was queued under.
    pub tenant: TenantKey,
    /// Consecutive failed reconciles of this key before this attempt (0 after a success).
    /// The status engine uses it to set `Stalled` after N failures while retries go on at
    /// the backoff cap.
    pub failures: u32,
    /// Why it runs: [`Priority::Event`] for changes, requeues and retries;
    /// [`Priority::Resync`] for the periodic anti-entropy pass.
    pub priority: Priority,
    /// What triggered it: object changed, child changed, requeue, resync or error.
    pub reason: super::Reason,
}
