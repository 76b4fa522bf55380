//! The operator's reconcile error: idem-runtime's common [`ReconcileError`](idem_runtime::reconciler::ReconcileError).

pub use idem_runtime::reconciler::ReconcileError as Error;
