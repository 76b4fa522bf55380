//! What every reconcile shares: the client, the apply engine, the event recorder and a cache
//! of the operator's namespaces (to find a TenantApp's tenant without an API call).

use std::sync::Arc;

use idem_runtime::TenantKey;
use idem_runtime::apply::{Applier, TENANT_LABEL};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};

/// How many consecutive failed reconciles of one object make it `Stalled` (reason
/// `ReconcileFailed`); retries go on at the backoff cap (kstatus: Stalled means it needs help).
pub const STALLED_AFTER_FAILURES: u32 = 5;

/// Shared state of the reconciles.
#[derive(Clone)]
pub struct Context {
    /// The API client.
    pub client: Client,
    /// idem-runtime's apply engine.
    pub applier: Applier,
    /// Publishes Kubernetes Events (child created/deleted, condition changed).
    pub recorder: Recorder,
    /// Namespaces managed by the operator (label `app.kubernetes.io/managed-by=idem-operator`).
    pub namespaces: Store<Namespace>,
}

impl Context {
    /// A context sharing `client`.
    pub fn new(client: Client, recorder: Recorder, namespaces: Store<Namespace>) -> Arc<Self> {
        Arc::new(Self {
            applier: Applier::new(client.clone()),
            client,
            recorder,
            namespaces,
        })
    }

    /// The tenant that namespace `ns` belongs to (its `tenancy.idem.dev/tenant` label), from
    /// the cache; `None` for a namespace the operator does not manage.
    pub fn tenant_of_namespace(&self, ns: &str) -> Option<TenantKey> {
        let obj = self.namespaces.get(&ObjectRef::new(ns))?;
        obj.metadata
            .labels
            .as_ref()?
            .get(TENANT_LABEL)
            .map(TenantKey::new)
    }
}
