//! Controllers of kinds with `#[derive(IdempotentResource)]`: the tenant comes from the
//! derive's `#[idempotent(tenant = ...)]` rule and the change predicate ignores
//! `#[idempotent(skip)]` fields.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::Api;
use kube::api::ObjectMeta;
use kube::runtime::watcher;

use super::Controller;
use super::mapping::fingerprint;
use super::watch::TenantFn;
use crate::key::TenantKey;
use crate::resource::{IdempotentResource, SpecDiff, TenantRef};

/// Reads the labels of a namespace by name (e.g. from a reflector store); `None` when the
/// namespace is unknown or must not be trusted to name a tenant.
pub type NamespaceLabelsFn = Arc<dyn Fn(&str) -> Option<BTreeMap<String, String>> + Send + Sync>;

/// The fair-queue tenant of every object whose rule does not resolve — its namespace unknown,
/// not cached yet or not trusted to name a tenant, or the object lacking what its rule reads:
/// one tenant for all of them, never what the object says about itself (its own labels or
/// namespace would let anyone who may create one charge its work to another tenant, or make
/// tenants and metric series without bound). Not a valid object name, so no real tenant has
/// it. The worker looks the tenant up again at every dispatch, so a key queued under it moves
/// to its real tenant once the namespace is known.
pub const UNRESOLVED_TENANT: &str = "(unresolved)";

fn tenant_fn<K: IdempotentResource>(labels: Option<NamespaceLabelsFn>) -> TenantFn<K> {
    Arc::new(move |obj: &K| {
        let resolved = match obj.tenant() {
            Ok(TenantRef::Known(key)) => Some(key),
            Ok(TenantRef::NamespaceLabel { namespace, label }) => {
                labels.as_ref().and_then(|f| f(&namespace)).and_then(|l| {
                    TenantRef::NamespaceLabel { namespace, label }
                        .resolve_with_labels(&l)
                        .ok()
                })
            }
            Err(_) => None,
        };
        resolved.unwrap_or_else(|| TenantKey::new(UNRESOLVED_TENANT))
    })
}

/// The change predicate of a derived kind: [`fingerprint`] with the spec's
/// [`SpecDiff::fingerprint`] (which leaves out `#[idempotent(skip)]` fields) in place of
/// `metadata.generation`, so an edit of only skipped fields enqueues nothing.
pub fn change_fingerprint<K: IdempotentResource>(obj: &K) -> u64 {
    let meta = ObjectMeta {
        generation: Some(obj.spec().fingerprint().0 as i64),
        ..obj.meta().clone()
    };
    fingerprint(&meta)
}

impl<K: IdempotentResource> Controller<K>
where
    K::Scope: 'static,
{
    /// A controller for a derived kind: like [`Controller::new`], but an object's tenant is
    /// what [`IdempotentResource::tenant`] says (`#[idempotent(tenant = ...)]`), and editing only
    /// `#[idempotent(skip)]` fields does not reconcile (the status' `observedGeneration` then
    /// stays behind `metadata.generation` until the next reconcile). A `namespace_label`
    /// rule needs [`Controller::namespace_labels`]; until it resolves, and when the object lacks
    /// what its rule reads, the tenant is [`UNRESOLVED_TENANT`].
    pub fn for_derived(api: Api<K>, watcher_config: watcher::Config) -> Self {
        let mut c = Self::new(api, watcher_config);
        c.tenant_of = tenant_fn::<K>(None);
        c.change_of = Some(Arc::new(change_fingerprint::<K>));
        c
    }

    /// How a `tenant = namespace_label("...")` rule reads a namespace's labels.
    #[must_use]
    pub fn namespace_labels(
        mut self,
        f: impl Fn(&str) -> Option<BTreeMap<String, String>> + Send + Sync + 'static,
    ) -> Self {
        self.tenant_of = tenant_fn::<K>(Some(Arc::new(f)));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
    struct S {
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
    #[kube(
        group = "t.example",
        version = "v1",
        kind = "Thing",
        namespaced,
        status = "S"
    )]
    #[idempotent(tenant = namespace_label("team"), crate = "crate")]
    struct ThingSpec {
        size: i32,
        #[idempotent(skip)]
        note: String,
    }

    fn thing(ns: &str, size: i32, note: &str) -> Thing {
        let mut t = Thing::new(
            "a",
            ThingSpec {
                size,
                note: note.into(),
            },
        );
        t.metadata.namespace = Some(ns.into());
        t
    }

    #[test]
    fn the_tenant_comes_from_the_rule_and_the_namespace_labels() {
        let f = tenant_fn::<Thing>(Some(Arc::new(|ns: &str| {
            (ns == "labelled").then(|| BTreeMap::from([("team".to_string(), "blue".to_string())]))
        })));
        assert_eq!(f(&thing("labelled", 1, "")), TenantKey::new("blue"));
        assert_eq!(
            f(&thing("other", 1, "")),
            TenantKey::new(UNRESOLVED_TENANT),
            "unresolved: the one fallback tenant, not the namespace"
        );
        // Nor the object's own tenant label.
        let mut forged = thing("other", 1, "");
        forged.metadata.labels = Some(BTreeMap::from([(
            crate::apply::TENANT_LABEL.to_string(),
            "blue".to_string(),
        )]));
        assert_eq!(f(&forged), TenantKey::new(UNRESOLVED_TENANT));
    }

    #[test]
    fn skip_fields_do_not_change_the_predicate() {
        let base = change_fingerprint(&thing("n", 1, "a"));
        assert_eq!(change_fingerprint(&thing("n", 1, "b")), base);
        assert_ne!(change_fingerprint(&thing("n", 2, "a")), base);
    }
}
