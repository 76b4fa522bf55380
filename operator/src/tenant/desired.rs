//! The desired children of a Tenant: its namespaces (first pass), then in each namespace the
//! ResourceQuota, LimitRange, owners' and extra RoleBindings, isolation NetworkPolicy and the
//! TenantPolicy of the admission policy (second pass).

use std::collections::{BTreeMap, BTreeSet};

use idem_runtime::prelude::*;
use k8s_openapi::api::core::v1::{
    LimitRange, LimitRangeItem, LimitRangeSpec, Namespace, ResourceQuota, ResourceQuotaSpec,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicySpec,
};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

use crate::resources::TenantPolicy;
use crate::resources::tenant::{DeletionPolicy, Owner, OwnerKind, Tenant};

/// ResourceQuota name in each tenant namespace.
pub const QUOTA: &str = "idem-quota";
/// LimitRange name in each tenant namespace.
pub const LIMITS: &str = "idem-limits";
/// RoleBinding name in each tenant namespace.
pub const OWNERS: &str = "idem-owners";
/// Prefix of the RoleBindings of `spec.roleBindings`: entry `readers` is `idem-rb-readers`.
pub const ROLE_BINDING_PREFIX: &str = "idem-rb-";
/// NetworkPolicy name in each tenant namespace.
pub const ISOLATION: &str = "idem-isolation";
/// The ClusterRole bound to a tenant's owners (Kubernetes' built-in `admin`).
pub const OWNER_ROLE: &str = "admin";

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        ..ObjectMeta::default()
    }
}

/// The full names of the tenant's namespaces, in spec order.
pub fn namespace_names(tenant: &Tenant) -> Vec<String> {
    tenant
        .spec
        .namespaces
        .iter()
        .map(|short| tenant.namespace_name(short))
        .collect()
}

/// First pass: one Namespace per short name; namespaces no longer listed are pruned, or kept
/// and released under `deletionPolicy: Retain`.
///
/// # Errors
/// [`ApplyError`] when a child cannot be serialised.
pub fn namespaces(tenant: &Tenant) -> Result<DesiredChildren, ApplyError> {
    let mut desired = DesiredChildren::new();
    // A namespace holds the tenant's data and only administrators can edit it: one whose
    // ownerReference an administrator removed is released (kept, never adopted back), not
    // repaired, and so is what the tenant made in it (the second pass releases it).
    desired
        .prune_kind::<Namespace>()
        .release_orphans::<Namespace>();
    // One taken out of the spec goes only as deleting the Tenant would take it: with
    // `deletionPolicy: Retain` it is kept, with everything in it (a renamed short name, a line
    // removed by mistake, would otherwise delete the tenant's data).
    if tenant.spec.deletion_policy == DeletionPolicy::Retain {
        desired.release_undesired::<Namespace>();
    }
    for name in namespace_names(tenant) {
        // The bucket of the namespace's name: the TenantApp controller's namespace-to-tenant watch is sharded on it.
        let bucket = crate::shard::namespace_bucket(&name);
        let mut metadata = meta(&name, None);
        // `spec.namespaceMetadata` first; its keys cannot be in idem's domain (refused at
        // admission), so the bucket label cannot be overridden.
        let extra = tenant.spec.namespace_metadata.clone().unwrap_or_default();
        let mut labels = extra.labels;
        labels.insert(crate::shard::NAMESPACE_BUCKET_LABEL.to_owned(), bucket);
        metadata.labels = Some(labels);
        metadata.annotations = (!extra.annotations.is_empty()).then_some(extra.annotations);
        desired.add(&Namespace {
            metadata,
            ..Namespace::default()
        })?;
    }
    Ok(desired)
}

/// The ResourceQuota `idem-quota` in namespace `ns`, when the tenant has a quota.
pub fn quota(tenant: &Tenant, ns: Option<&str>) -> Option<ResourceQuota> {
    quota_with(tenant, ns, None)
}

/// [`quota`] with `hard` instead of `quota.hard` when given (the namespace's part of
/// `quota.tenantHard`, see [`super::quota_split`]).
pub fn quota_with(
    tenant: &Tenant,
    ns: Option<&str>,
    hard: Option<&BTreeMap<String, Quantity>>,
) -> Option<ResourceQuota> {
    let quota = tenant.spec.quota.as_ref()?;
    Some(ResourceQuota {
        metadata: meta(QUOTA, ns),
        spec: Some(ResourceQuotaSpec {
            hard: Some(hard.unwrap_or(&quota.hard).clone()),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    })
}

/// The LimitRange `idem-limits` in namespace `ns`, when the tenant has limits.
pub fn limit_range(tenant: &Tenant, ns: Option<&str>) -> Option<LimitRange> {
    let limits = tenant.spec.limits.as_ref()?;
    let map = |m: &BTreeMap<_, _>| (!m.is_empty()).then(|| m.clone());
    Some(LimitRange {
        metadata: meta(LIMITS, ns),
        spec: Some(LimitRangeSpec {
            limits: vec![LimitRangeItem {
                type_: "Container".into(),
                default_request: map(&limits.default_request),
                default: map(&limits.default),
                ..LimitRangeItem::default()
            }],
        }),
    })
}

/// Label the API server sets on every namespace to its name; no one can change it,
/// unlike a label such as `tenancy.idem.dev/tenant`, which anyone allowed to label a
/// namespace could forge.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A selector of exactly `namespaces` by their [`NAMESPACE_NAME_LABEL`] (values sorted, so
/// the policy is stable).
pub fn namespace_selector(namespaces: &[String]) -> LabelSelector {
    let mut values = namespaces.to_vec();
    values.sort();
    values.dedup();
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: NAMESPACE_NAME_LABEL.to_string(),
            operator: "In".to_string(),
            values: Some(values),
        }]),
        match_labels: None,
    }
}

/// The RoleBinding `name` in namespace `ns` binding ClusterRole `role` to `subjects`.
fn role_binding(ns: Option<&str>, name: &str, role: &str, subjects: &[Owner]) -> RoleBinding {
    RoleBinding {
        metadata: meta(name, ns),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(
            subjects
                .iter()
                .map(|o| match o.kind {
                    OwnerKind::ServiceAccount => Subject {
                        kind: "ServiceAccount".into(),
                        name: o.name.clone(),
                        namespace: o.namespace.clone(),
                        api_group: None,
                    },
                    kind => Subject {
                        kind: format!("{kind:?}"),
                        name: o.name.clone(),
                        namespace: None,
                        api_group: Some("rbac.authorization.k8s.io".into()),
                    },
                })
                .collect(),
        ),
    }
}

/// The RoleBindings that grant access in namespace `ns`: the owners' (`idem-owners`, when
/// the tenant has owners) and one per `roleBindings` entry.
pub fn bindings(tenant: &Tenant, ns: Option<&str>) -> Vec<RoleBinding> {
    let spec = &tenant.spec;
    let owners =
        (!spec.owners.is_empty()).then(|| role_binding(ns, OWNERS, OWNER_ROLE, &spec.owners));
    let extras = spec.role_bindings.iter().map(|extra| {
        let name = format!("{ROLE_BINDING_PREFIX}{}", extra.name);
        role_binding(ns, &name, &extra.cluster_role, &extra.subjects)
    });
    owners.into_iter().chain(extras).collect()
}

/// Second pass: the objects inside each of `namespaces` (those the tenant really owns).
/// Kinds that are not wanted any more (quota removed, isolation off) are pruned; what the
/// tenant made in `released` (namespaces it no longer controls) is released, not deleted:
/// it stays with the namespace. `quotas` holds the `hard` of the namespaces' quotas when
/// `quota.tenantHard` is split ([`super::quota_split`]); the RoleBindings in `held`
/// (namespace, name) are left out and the namespaces in `cordoned` say so in their
/// TenantPolicy ([`super::quota_gate`]).
///
/// # Errors
/// [`ApplyError`] when a child cannot be serialised.
pub fn contents(
    tenant: &Tenant,
    namespaces: &[String],
    released: &[String],
    quotas: &BTreeMap<String, BTreeMap<String, Quantity>>,
    held: &BTreeSet<(String, String)>,
    cordoned: &BTreeSet<String>,
) -> Result<DesiredChildren, ApplyError> {
    let mut desired = DesiredChildren::new();
    desired
        .prune_kind::<ResourceQuota>()
        .prune_kind::<LimitRange>()
        .prune_kind::<RoleBinding>()
        .prune_kind::<NetworkPolicy>()
        .prune_kind::<TenantPolicy>()
        // A RoleBinding's roleRef cannot change: a `roleBindings` entry bound to another
        // ClusterRole is deleted and created again.
        .allow_recreate::<RoleBinding>();
    for ns in released {
        desired.release_in(ns);
    }
    let spec = &tenant.spec;
    let own_namespaces = namespace_selector(namespaces);
    for name in namespaces {
        let hard = quotas.get(name);
        let quota_not_enforced = cordoned.contains(name);
        desired.add(&super::policy::parameters(tenant, name, quota_not_enforced))?;
        let ns = Some(name.as_str());
        if let Some(quota) = quota_with(tenant, ns, hard) {
            desired.add(&quota)?;
        }
        if let Some(limits) = limit_range(tenant, ns) {
            desired.add(&limits)?;
        }
        for binding in bindings(tenant, ns) {
            let key = (
                name.clone(),
                binding.metadata.name.clone().unwrap_or_default(),
            );
            if !held.contains(&key) {
                desired.add(&binding)?;
            }
        }
        if spec.isolation {
            desired.add(&NetworkPolicy {
                metadata: meta(ISOLATION, ns),
                spec: Some(NetworkPolicySpec {
                    pod_selector: Some(LabelSelector::default()),
                    policy_types: Some(vec!["Ingress".into()]),
                    ingress: Some(vec![NetworkPolicyIngressRule {
                        from: Some(vec![NetworkPolicyPeer {
                            namespace_selector: Some(own_namespaces.clone()),
                            ..NetworkPolicyPeer::default()
                        }]),
                        ..NetworkPolicyIngressRule::default()
                    }]),
                    ..NetworkPolicySpec::default()
                }),
            })?;
        }
    }
    Ok(desired)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::tenant::{Limits, Quota, ShortName, TenantRoleBinding, TenantSpec};
    use kube::CustomResourceExt;

    /// `maxItems` of the property at `path` in the Tenant CRD's schema.
    fn max_items(crd: &serde_json::Value, path: &[&str]) -> usize {
        let mut at = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        for p in path {
            at = &at["properties"][*p];
        }
        let max = at["maxItems"].as_u64();
        usize::try_from(max.unwrap_or_else(|| panic!("no maxItems at {path:?}"))).unwrap()
    }

    #[test]
    fn the_record_holds_every_child_of_the_largest_tenant_the_crd_admits_twice_over() {
        // The largest Tenant admission lets through, by the CRD's own bounds: every namespace,
        // every role binding, every per-namespace child. Its record must hold all of them
        // twice (a pass that fails between creating replacements and pruning what they
        // replace records both): a record that cannot be written leaves children unrecorded,
        // and so never pruned (a removed role binding never revoked).
        let crd = serde_json::to_value(Tenant::crd()).unwrap();
        let namespaces = max_items(&crd, &["spec", "namespaces"]);
        let bindings = max_items(&crd, &["spec", "roleBindings"]);
        let record = max_items(&crd, &["status", "createdChildren"]);
        let one = || Owner {
            kind: OwnerKind::User,
            name: "alice".into(),
            namespace: None,
        };
        let quantities = || [("cpu".to_owned(), Quantity("1".into()))].into();
        let spec = TenantSpec {
            owners: vec![one()],
            namespaces: (0..namespaces)
                .map(|i| ShortName::from(format!("n{i}").as_str()))
                .collect(),
            quota: Some(Quota {
                hard: quantities(),
                ..Quota::default()
            }),
            limits: Some(Limits {
                default: quantities(),
                default_request: quantities(),
            }),
            isolation: true,
            role_bindings: (0..bindings)
                .map(|i| TenantRoleBinding {
                    name: format!("rb{i}"),
                    cluster_role: "view".into(),
                    subjects: vec![one()],
                })
                .collect(),
            ..serde_json::from_value(serde_json::json!({"namespaces": []})).unwrap()
        };
        let tenant = Tenant::new("largest", spec);
        let names = namespace_names(&tenant);
        let children = namespaces_of(&tenant)
            + contents(
                &tenant,
                &names,
                &[],
                &BTreeMap::new(),
                &BTreeSet::new(),
                &BTreeSet::new(),
            )
            .unwrap()
            .len();
        assert_eq!(names.len(), namespaces);
        assert!(
            2 * children <= record,
            "the largest Tenant has {children} children; its record holds at most {record}"
        );
    }

    fn namespaces_of(tenant: &Tenant) -> usize {
        namespaces(tenant).unwrap().len()
    }

    #[test]
    fn the_isolation_selector_names_exactly_the_given_namespaces() {
        let selector = namespace_selector(&["t-b".into(), "t-a".into(), "t-a".into()]);
        assert_eq!(selector.match_labels, None);
        let req = &selector.match_expressions.unwrap()[0];
        assert_eq!(req.key, NAMESPACE_NAME_LABEL);
        assert_eq!(req.operator, "In");
        assert_eq!(
            req.values.as_deref(),
            Some(&["t-a".to_string(), "t-b".to_string()][..])
        );
    }
}
