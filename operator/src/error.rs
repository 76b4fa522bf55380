//! The operator's reconcile error: idem-runtime's common [`ReconcileError`].

pub use idem_runtime::reconciler::ReconcileError as Error;
