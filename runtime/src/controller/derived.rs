//! Controllers of kinds with `#[derive(IdempotentResource)]`: the tenant comes from the
//! derive's `#[idempotent(tenant = ...)]` rule and the change predicate ignores
//! `#[idempotent(skip)]` fields.

use std::sync::Arc;

use kube::Api;
use kube::api::ObjectMeta;
use kube::runtime::watcher;

use super::Controller;
use super::mapping::fingerprint;
use super::namespaces::NamespaceTenants;
use super::watch::TenantFn;
use crate::key::TenantKey;
use crate::labels::Labels;
use crate::resource::{IdempotentResource, SpecDiff, TenantRef, TenantRule};

/// The fair-queue tenant of every object whose rule does not resolve — its namespace unknown,
/// not cached yet or not trusted to name a tenant, or the object lacking what its rule reads:
/// one tenant for all of them, never what the object says about itself (its own labels or
/// namespace would let anyone who may create one charge its work to another tenant, or make
/// tenants and metric series without bound). Not a valid object name, so no real tenant has
/// it. The worker looks the tenant up again at every dispatch, so a key queued under it moves
/// to its real tenant once the namespace is known.
pub const UNRESOLVED_TENANT: &str = "(unresolved)";

fn tenant_fn<K: IdempotentResource>(namespaces: Option<NamespaceTenants>) -> TenantFn<K> {
    Arc::new(move |obj: &K| {
        let resolved = match obj.tenant() {
            Ok(TenantRef::Known(key)) => Some(key),
            Ok(TenantRef::NamespaceLabel { namespace, .. }) => {
                namespaces.as_ref().and_then(|n| n.get(&namespace))
            }
            Err(_) => None,
        };
        resolved.unwrap_or_else(|| TenantKey::new(UNRESOLVED_TENANT))
    })
}

/// The change predicate of a derived kind: `fingerprint` with the spec's
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
    /// stays behind `metadata.generation` until the next reconcile).
    ///
    /// A `tenant = namespace_label("...")` rule needs no wiring: the controller watches the
    /// metadata of every Namespace and keeps the label's value of each
    /// ([`NamespaceTenants`]; its client needs `list` and `watch` on namespaces), its workers
    /// start once those are listed, and an object's tenant is its namespace's label value —
    /// never the namespace's name nor a label of the object itself. When a namespace's tenant
    /// changes, its objects are queued at once. Until it resolves (the
    /// namespace unknown or unlabelled), and when the object lacks what its rule reads, the
    /// tenant is [`UNRESOLVED_TENANT`]. A [`Driver`](crate::reconciler::Driver) running the
    /// controller reads the tenant its children are labelled with there too, so a converged
    /// reconcile makes no request for it.
    pub fn for_derived(api: Api<K>, watcher_config: watcher::Config) -> Self {
        let mut c = Self::new(api, watcher_config).label_names(Labels::of::<K>());
        if let TenantRule::NamespaceLabel(label) = K::TENANT_RULE {
            c.namespaces = Some((
                NamespaceTenants::new(label),
                watcher::Config::default().streaming_lists(),
            ));
        }
        c.tenant_of = tenant_fn::<K>(c.namespaces.as_ref().map(|(n, _)| n.clone()));
        c.change_of = Some(Arc::new(change_fingerprint::<K>));
        c
    }

    /// For a `tenant = namespace_label("...")` kind: watch only the namespaces `config`
    /// selects (e.g. by a label of the namespaces your own controller creates), and let only
    /// those whose metadata `trust` accepts name a tenant (e.g. those a tenant object
    /// controls by ownerReference: a label alone can be set by whoever may label a
    /// namespace). A no-op for kinds with another tenant rule.
    #[must_use]
    pub fn namespace_tenants_with(
        mut self,
        config: watcher::Config,
        trust: impl Fn(&ObjectMeta) -> bool + Send + Sync + 'static,
    ) -> Self {
        if let Some((tenants, _)) = self.namespaces.take() {
            let tenants = tenants.trusting(Arc::new(trust));
            self.tenant_of = tenant_fn::<K>(Some(tenants.clone()));
            self.namespaces = Some((tenants, config));
        }
        self
    }

    /// For a `tenant = namespace_label("...")` kind whose namespaces a tenant object controls:
    /// a namespace names tenant `t` only while `is_owner(t, uid)` accepts the uid its
    /// controller ownerReference names, asked at every read (so it may read a cache that
    /// fills later than the namespaces'). The label and the reference's name can be written
    /// by whoever may create a namespace; the uid is what the garbage collector trusts (a
    /// reference whose uid is not the named object's gets the namespace deleted), and until
    /// then the namespace is nobody's. A no-op for kinds with another tenant rule.
    #[must_use]
    pub fn namespace_tenant_owner(
        mut self,
        is_owner: impl Fn(&TenantKey, &str) -> bool + Send + Sync + 'static,
    ) -> Self {
        if let Some((tenants, config)) = self.namespaces.take() {
            let tenants = tenants.owned_by(Arc::new(is_owner));
            self.tenant_of = tenant_fn::<K>(Some(tenants.clone()));
            self.namespaces = Some((tenants, config));
        }
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
    #[idempotent(tenant = namespace_label("team"), crate = "crate", prune = owner_references)]
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
        let namespaces = NamespaceTenants::new("team");
        namespaces.insert_for_test("labelled", "blue");
        let f = tenant_fn::<Thing>(Some(namespaces));
        assert_eq!(f(&thing("labelled", 1, "")), TenantKey::new("blue"));
        assert_eq!(
            f(&thing("other", 1, "")),
            TenantKey::new(UNRESOLVED_TENANT),
            "unresolved: the one fallback tenant, not the namespace"
        );
        // Nor the object's own tenant label.
        let mut forged = thing("other", 1, "");
        forged.metadata.labels = Some(std::collections::BTreeMap::from([(
            Labels::of::<Thing>().tenant().to_string(),
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
