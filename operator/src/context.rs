//! What the operator's reconcilers share: the child caches and the tenant of each of the
//! operator's namespaces (to find a TenantApp's tenant without an API call).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::TenantKey;
use idem_runtime::apply::{ChildCaches, TENANT_LABEL};
use idem_runtime::controller::NamespaceTenants;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};

use crate::resources::{GROUP, Tenant};
use crate::tenant::quota_record::SplitMemory;
use crate::tenant::quota_usage::UsageMemory;

/// Shared state of the reconciles.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The controllers' child caches (filled by their watches, read by the apply engine).
    pub caches: ChildCaches,
    /// The tenants of the namespaces managed by the operator (label
    /// `app.kubernetes.io/managed-by=idem-operator`).
    namespaces: TenantNamespaces,
    /// Namespaces a read of the API server found not to be tenant namespaces, with when and
    /// why (see [`NOT_TENANT_RECHECK`]).
    not_tenant: Mutex<HashMap<String, (Instant, NotTenantNamespace)>>,
    /// The usages the Tenants' quota splits have seen ([`UsageMemory`]).
    pub usage: UsageMemory,
    /// The quota splits this process decided ([`SplitMemory`]).
    pub splits: SplitMemory,
}

/// How long a read that found a namespace not to be a tenant namespace is taken as the answer
/// for every app in it: however many TenantApps sit outside tenant namespaces, each such
/// namespace is read at most once per period (a namespace that becomes a tenant's is seen at
/// once through the namespace cache).
pub const NOT_TENANT_RECHECK: Duration = Duration::from_secs(25);

/// Where a namespace's tenant is read.
enum TenantNamespaces {
    /// A cache of the namespaces themselves, judged with [`tenant_of`] at each read.
    Objects(Store<Namespace>),
    /// The TenantApp controller's map of namespace to tenant, which keeps only the namespaces
    /// [`tenant_of_meta`] names a tenant of (the operator's controllers: one watch of the
    /// namespaces, and per namespace only its name and tenant).
    Tenants(NamespaceTenants),
}

impl Context {
    /// A context sharing `client`, with a new [`ChildCaches`] (give it to the reconcilers'
    /// drivers with `Driver::with_caches`), reading namespaces' tenants from `namespaces`.
    pub fn new(client: Client, namespaces: Store<Namespace>) -> Arc<Self> {
        Self::build(
            client,
            TenantNamespaces::Objects(namespaces),
            ChildCaches::new(),
        )
    }

    /// A context reading namespaces' tenants from `namespaces` (the TenantApp controller's:
    /// [`idem_runtime::controller::Controller::namespace_tenants`]) and children from `caches`
    /// (the manager's, kept from one shard ring to the next:
    /// [`idem_runtime::manager::Start::caches`]).
    pub fn with_namespace_tenants(
        client: Client,
        namespaces: NamespaceTenants,
        caches: ChildCaches,
    ) -> Arc<Self> {
        Self::build(client, TenantNamespaces::Tenants(namespaces), caches)
    }

    fn build(client: Client, namespaces: TenantNamespaces, caches: ChildCaches) -> Arc<Self> {
        Arc::new(Self {
            caches,
            client,
            namespaces,
            not_tenant: Mutex::new(HashMap::new()),
            usage: UsageMemory::default(),
            splits: SplitMemory::default(),
        })
    }

    /// The tenant that namespace `ns` belongs to, from the cache; `None` for a namespace that
    /// is not a tenant namespace. See [`tenant_of`].
    pub fn tenant_of_namespace(&self, ns: &str) -> Option<TenantKey> {
        match &self.namespaces {
            TenantNamespaces::Objects(store) => tenant_of(store.get(&ObjectRef::new(ns))?.as_ref()),
            TenantNamespaces::Tenants(tenants) => tenants.get(ns),
        }
    }

    /// The namespaces (full names, sorted) that exist and that Tenant `tenant` controls, from
    /// the namespace cache and, for the names in `listed` (a sharded replica's namespace cache
    /// holds only its TenantApps' namespaces), the Tenant controller's Namespace child cache
    /// (see [`tenant_of`]; there, by a controller ownerReference with the Tenant's uid).
    pub fn namespaces_of(&self, tenant: &Tenant, listed: &[String]) -> Vec<String> {
        let key = TenantKey::new(tenant.name_any());
        let controlled = |ns: &Namespace| {
            let refs = ns.metadata.owner_references.iter().flatten();
            let controller = refs.into_iter().find(|r| r.controller == Some(true));
            controller.is_some_and(|r| tenant.metadata.uid.as_ref() == Some(&r.uid))
        };
        let children = listed.iter().filter_map(|name| {
            self.caches
                .lookup::<Namespace>(None, name)
                .flatten()
                .filter(|ns| tenant_of(ns).as_ref() == Some(&key) && controlled(ns))
        });
        let cached: Vec<String> = match &self.namespaces {
            TenantNamespaces::Objects(store) => (store.state().iter())
                .filter(|ns| tenant_of(ns).as_ref() == Some(&key))
                .filter_map(|ns| ns.metadata.name.clone())
                .collect(),
            TenantNamespaces::Tenants(tenants) => (tenants.all().into_iter())
                .filter(|(_, t)| *t == key)
                .map(|(ns, _)| ns)
                .collect(),
        };
        let mut names: Vec<String> = cached
            .into_iter()
            .chain(children.filter_map(|ns| ns.metadata.name))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The tenant of namespace `ns`: from this cache ([`Context::tenant_of_namespace`]) when
    /// `cached`, else (or when it names none) read from the API server through `client`;
    /// when it is not a tenant namespace, says why ([`NotTenantNamespace`]), an answer kept
    /// for [`NOT_TENANT_RECHECK`] for every app in it. A pass run by a controller, whose
    /// runtime cache of namespace tenants named none, asks with `cached` false: in the
    /// operator this context reads that same cache, and elsewhere a watch of its own; neither
    /// may have seen yet the change that woke the app.
    ///
    /// # Errors
    /// When reading the namespace fails.
    pub async fn resolve_tenant_of_namespace(
        &self,
        client: &Client,
        ns: &str,
        cached: bool,
    ) -> Result<Result<TenantKey, NotTenantNamespace>, kube::Error> {
        if cached && let Some(tenant) = self.tenant_of_namespace(ns) {
            return Ok(Ok(tenant));
        }
        let now = Instant::now();
        if let Some((_, why)) = self
            .not_tenant_lock()
            .get(ns)
            .filter(|(at, _)| now.duration_since(*at) < NOT_TENANT_RECHECK)
        {
            return Ok(Err(why.clone()));
        }
        let live = kube::Api::<Namespace>::all(client.clone())
            .get_opt(ns)
            .await?;
        let why = match live {
            None => NotTenantNamespace::Missing,
            Some(live) => {
                let tenant = match &self.namespaces {
                    TenantNamespaces::Objects(_) => tenant_of(&live),
                    // As the cache judges it: with the controller reference's uid too.
                    TenantNamespaces::Tenants(tenants) => tenants.judge(&live.metadata),
                };
                if let Some(tenant) = tenant {
                    return Ok(Ok(tenant));
                }
                let label = live
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(TENANT_LABEL));
                match label {
                    None => NotTenantNamespace::Unlabelled {
                        controller: controlling_tenant(&live.metadata),
                    },
                    Some(tenant) => NotTenantNamespace::NotControlled {
                        tenant: tenant.clone(),
                    },
                }
            }
        };
        let mut not_tenant = self.not_tenant_lock();
        // Only answers of the current period are kept: at most one per namespace read in it.
        not_tenant.retain(|_, (at, _)| now.duration_since(*at) < NOT_TENANT_RECHECK);
        not_tenant.insert(ns.to_owned(), (now, why.clone()));
        Ok(Err(why))
    }

    fn not_tenant_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, NotTenantNamespace)>> {
        self.not_tenant.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why a namespace is not a tenant namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotTenantNamespace {
    /// The namespace does not exist.
    Missing,
    /// The namespace has no `tenancy.idem.dev/tenant` label.
    Unlabelled {
        /// The Tenant its controller ownerReference names, if any (one that is paused does not
        /// put the label back).
        controller: Option<String>,
    },
    /// The namespace has the label (naming `tenant`) but no Tenant of that name controls it
    /// (no controller ownerReference to it, or one whose uid is not that Tenant's): the label
    /// alone proves nothing.
    NotControlled {
        /// The label's value.
        tenant: String,
    },
}

/// The tenant of a namespace: the value of its `tenancy.idem.dev/tenant` label, but only when
/// the namespace is really that tenant's — its controller ownerReference names a `Tenant` of
/// that name. A label alone proves nothing (anyone allowed to label a namespace could claim
/// a tenant); an ownerReference to a Tenant that does not exist would get the namespace
/// garbage-collected.
pub fn tenant_of(ns: &Namespace) -> Option<TenantKey> {
    tenant_of_meta(&ns.metadata)
}

/// The name of the Tenant a namespace's controller ownerReference names, whatever its labels.
fn controlling_tenant(meta: &ObjectMeta) -> Option<String> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| {
            r.controller == Some(true)
                && r.kind == "Tenant"
                && r.api_version == format!("{GROUP}/v1alpha1")
        })
        .map(|r| r.name.clone())
}

/// Whether `uid` is that of Tenant `tenant` in `tenants`, or `tenants` does not know that
/// Tenant (not listed yet, or another replica's: the garbage collector deletes a namespace
/// whose controller reference names a Tenant that does not exist, or by a uid not its).
pub fn is_tenants_uid(tenants: &Store<Tenant>, tenant: &str, uid: &str) -> bool {
    tenants
        .get(&ObjectRef::new(tenant))
        .is_none_or(|t| t.metadata.uid.as_deref() == Some(uid))
}

/// [`tenant_of`] a namespace by its metadata (all it reads).
pub fn tenant_of_meta(meta: &ObjectMeta) -> Option<TenantKey> {
    let tenant = meta.labels.as_ref()?.get(TENANT_LABEL)?;
    let owned = meta.owner_references.iter().flatten().any(|r| {
        r.controller == Some(true)
            && r.kind == "Tenant"
            && r.api_version == format!("{GROUP}/v1alpha1")
            && &r.name == tenant
    });
    owned.then(|| TenantKey::new(tenant))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(labels: serde_json::Value, owners: serde_json::Value) -> Namespace {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "acme-dev", "labels": labels, "ownerReferences": owners}
        }))
        .unwrap()
    }

    fn owner(kind: &str, name: &str, controller: bool) -> serde_json::Value {
        serde_json::json!({"apiVersion": "tenancy.idem.dev/v1alpha1", "kind": kind, "name": name,
                           "uid": "u1", "controller": controller})
    }

    #[test]
    fn a_namespace_belongs_to_a_tenant_only_with_label_and_controller_reference() {
        let label = serde_json::json!({TENANT_LABEL: "acme"});
        let good = ns(
            label.clone(),
            serde_json::json!([owner("Tenant", "acme", true)]),
        );
        assert_eq!(tenant_of(&good), Some(TenantKey::new("acme")));
        assert_eq!(
            tenant_of(&ns(label.clone(), serde_json::json!([]))),
            None,
            "label only"
        );
        let other = ns(
            label.clone(),
            serde_json::json!([owner("Tenant", "ghost", true)]),
        );
        assert_eq!(tenant_of(&other), None, "owned by another tenant");
        let weak = ns(label, serde_json::json!([owner("Tenant", "acme", false)]));
        assert_eq!(tenant_of(&weak), None, "not the controller");
        let unlabelled = ns(
            serde_json::json!({}),
            serde_json::json!([owner("Tenant", "acme", true)]),
        );
        assert_eq!(tenant_of(&unlabelled), None);
    }
}
