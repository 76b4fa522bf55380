//! Mapping watch events to work: object → key, object → tenant, child → owner, and the
//! change filter that keeps a reconcile's own status writes from enqueueing it again.

use std::any::TypeId;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use k8s_openapi::ClusterResourceScope;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::key::{ObjectKey, TenantKey};
use crate::labels::Labels;

/// Whether `K` is cluster-scoped.
pub fn is_cluster_scoped<K: Resource>() -> bool
where
    K::Scope: 'static,
{
    TypeId::of::<K::Scope>() == TypeId::of::<ClusterResourceScope>()
}

/// The queue key of an object of kind `K`.
pub fn key_of<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectKey {
    let kind = K::kind(&());
    match obj.meta().namespace.as_deref() {
        Some(ns) => ObjectKey::namespaced(&kind, ns, &obj.name_any()),
        None => ObjectKey::cluster(&kind, &obj.name_any()),
    }
}

/// idem's default tenant of an object: its tenant label under `labels`
/// ([`Labels::tenant`], e.g. `tenancy.idem.dev/tenant` for the operator's kinds), else its
/// namespace, else its own name (a cluster-scoped root such as `Tenant` is its own tenant).
pub fn default_tenant(meta: &ObjectMeta, labels: Labels) -> TenantKey {
    if let Some(t) = meta.labels.as_ref().and_then(|l| l.get(labels.tenant())) {
        return TenantKey::new(t);
    }
    TenantKey::new(
        meta.namespace
            .as_deref()
            .or(meta.name.as_deref())
            .unwrap_or_default(),
    )
}

/// The owners of kind `K` a child object maps to, each checked by uid against the owner's
/// store (`uid_of` gives the uid of the cached owner of a key, `None` when there is none):
/// the owner reference with `controller: true` whose kind and apiVersion are `K`'s and whose
/// uid is the cached owner's; failing that, and only when `K` is cluster-scoped, the object
/// named by the child's tenant label, but only if the child's owner-uid label carries that
/// owner's uid (a child of ours whose ownerReference was removed: the owner's reconcile puts
/// it back); both labels are `K`'s children's, `names` ([`Labels::tenant`],
/// [`Labels::owner_uid`]), e.g. `tenancy.idem.dev/tenant` for the operator's kinds.
///
/// A label alone never maps: anyone who may write objects in a namespace may set
/// `<prefix>/tenant: <other tenant>`, and that must not make idem reconcile (and
/// charge) another tenant. An owner uid is not guessable and not readable across tenants.
/// An owner not cached yet maps nothing: the primary watch's own list enqueues it.
pub fn owners_of<K>(
    child: &ObjectMeta,
    names: Labels,
    uid_of: impl Fn(&ObjectKey) -> Option<String>,
) -> Vec<ObjectKey>
where
    K: Resource<DynamicType = ()>,
    K::Scope: 'static,
{
    let (kind, api_version) = (K::kind(&()), K::api_version(&()));
    let cluster = is_cluster_scoped::<K>();
    let by_ref: Vec<ObjectKey> = child
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.controller == Some(true) && r.kind == kind && r.api_version == api_version)
        .filter_map(|r| {
            let key = match (cluster, child.namespace.as_deref()) {
                (true, _) => ObjectKey::cluster(&kind, &r.name),
                (false, Some(ns)) => ObjectKey::namespaced(&kind, ns, &r.name),
                // A cluster-scoped child cannot be owned by a namespaced object.
                (false, None) => return None,
            };
            (uid_of(&key).as_deref() == Some(r.uid.as_str())).then_some(key)
        })
        .collect();
    if !by_ref.is_empty() || !cluster {
        return by_ref;
    }
    let labels = child.labels.as_ref();
    let (Some(tenant), Some(uid)) = (
        labels.and_then(|l| l.get(names.tenant())),
        labels.and_then(|l| l.get(names.owner_uid())),
    ) else {
        return Vec::new();
    };
    let key = ObjectKey::cluster(&kind, tenant);
    if uid_of(&key).as_deref() == Some(uid.as_str()) {
        vec![key]
    } else {
        Vec::new()
    }
}

/// What of a primary object makes it worth reconciling again: `metadata.generation`
/// (bumped by the apiserver on spec changes, not on status writes), finalizers,
/// `deletionTimestamp`, labels and annotations. For objects without a generation every
/// change counts (the resourceVersion is included instead).
pub fn fingerprint(meta: &ObjectMeta) -> u64 {
    let mut h = DefaultHasher::new();
    match meta.generation {
        Some(g) => g.hash(&mut h),
        None => meta.resource_version.hash(&mut h),
    }
    meta.finalizers.hash(&mut h);
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .hash(&mut h);
    meta.labels.hash(&mut h);
    meta.annotations.hash(&mut h);
    h.finish()
}

/// Whether an object in the cache is gone for reconcile purposes: deleted, or marked for
/// deletion with no finalizer left (the apiserver removes it at once).
pub fn is_gone(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some() && meta.finalizers.as_ref().is_none_or(Vec::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::{OWNER_UID_LABEL, TENANT_LABEL};
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    fn meta(ns: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some("child".into()),
            namespace: ns.map(Into::into),
            generation: Some(1),
            resource_version: Some("10".into()),
            ..ObjectMeta::default()
        }
    }

    fn owner_ref(kind: &str, api_version: &str, name: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
            controller: Some(controller),
            block_owner_deletion: None,
        }
    }

    #[test]
    fn rule8_status_only_change_keeps_fingerprint() {
        let a = meta(Some("ns"));
        let mut status_write = a.clone();
        status_write.resource_version = Some("11".into());
        status_write.managed_fields = Some(vec![]);
        assert_eq!(fingerprint(&a), fingerprint(&status_write));
    }

    #[test]
    fn rule8_spec_finalizer_deletion_and_label_changes_change_fingerprint() {
        let a = meta(Some("ns"));
        let mut spec = a.clone();
        spec.generation = Some(2);
        let mut fin = a.clone();
        fin.finalizers = Some(vec!["tenancy.idem.dev/cleanup".into()]);
        let mut del = a.clone();
        del.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let mut label = a.clone();
        label.labels = Some([("x".to_owned(), "y".to_owned())].into());
        for changed in [spec, fin, del, label] {
            assert_ne!(fingerprint(&a), fingerprint(&changed), "{changed:?}");
        }
    }

    #[test]
    fn rule8_without_generation_every_change_counts() {
        let mut a = meta(None);
        a.generation = None;
        let mut b = a.clone();
        b.resource_version = Some("11".into());
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }

    /// The uid of every cached owner is "u".
    fn cached(_: &ObjectKey) -> Option<String> {
        Some("u".into())
    }

    #[test]
    fn child_maps_to_controller_owner_only() {
        let mut m = meta(Some("ns"));
        m.owner_references = Some(vec![
            owner_ref("ConfigMap", "v1", "not-controller", false),
            owner_ref("Secret", "v1", "other-kind", true),
            owner_ref("ConfigMap", "v1", "boss", true),
        ]);
        assert_eq!(
            owners_of::<ConfigMap>(&m, Labels::operator(), cached),
            [ObjectKey::namespaced("ConfigMap", "ns", "boss")]
        );
        // An owner not cached, or cached with another uid (a forged or stale reference).
        assert!(owners_of::<ConfigMap>(&m, Labels::operator(), |_| None).is_empty());
        assert!(
            owners_of::<ConfigMap>(&m, Labels::operator(), |_| Some("other".into())).is_empty()
        );
    }

    #[test]
    fn tenant_label_maps_to_cluster_scoped_owner_only_with_its_uid() {
        let mut m = meta(Some("acme-dev"));
        m.labels = Some([(TENANT_LABEL.to_owned(), "acme".to_owned())].into());
        // A forged tenant label alone maps nothing.
        assert!(owners_of::<Namespace>(&m, Labels::operator(), cached).is_empty());
        m.labels
            .as_mut()
            .unwrap()
            .insert(OWNER_UID_LABEL.to_owned(), "u".to_owned());
        assert_eq!(
            owners_of::<Namespace>(&m, Labels::operator(), cached),
            [ObjectKey::cluster("Namespace", "acme")]
        );
        assert!(
            owners_of::<Namespace>(&m, Labels::operator(), |_| Some("other".into())).is_empty()
        );
        assert!(owners_of::<ConfigMap>(&m, Labels::operator(), cached).is_empty());
        assert!(is_cluster_scoped::<Namespace>() && !is_cluster_scoped::<ConfigMap>());
        // Another kind's names (another prefix) are not this kind's children's labels.
        let theirs = Labels::with_prefix("teams.example.com");
        assert!(owners_of::<Namespace>(&m, theirs, cached).is_empty());
        m.labels = Some(
            [
                (theirs.tenant().to_owned(), "acme".to_owned()),
                (theirs.owner_uid().to_owned(), "u".to_owned()),
            ]
            .into(),
        );
        assert_eq!(
            owners_of::<Namespace>(&m, theirs, cached),
            [ObjectKey::cluster("Namespace", "acme")]
        );
        assert!(owners_of::<Namespace>(&m, Labels::operator(), cached).is_empty());
    }

    #[test]
    fn default_tenant_prefers_label_then_namespace_then_name() {
        let mut m = meta(Some("ns"));
        assert_eq!(default_tenant(&m, Labels::operator()), TenantKey::new("ns"));
        m.labels = Some([(TENANT_LABEL.to_owned(), "acme".to_owned())].into());
        assert_eq!(
            default_tenant(&m, Labels::operator()),
            TenantKey::new("acme")
        );
        assert_eq!(
            default_tenant(&meta(None), Labels::operator()),
            TenantKey::new("child")
        );
    }

    #[test]
    fn gone_means_deleting_without_finalizers() {
        let mut m = meta(Some("ns"));
        assert!(!is_gone(&m));
        m.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(is_gone(&m));
        m.finalizers = Some(vec!["f".into()]);
        assert!(!is_gone(&m));
    }
}
