//! The desired children of a Tenant: its namespaces (first pass), then in each namespace the
//! ResourceQuota, LimitRange, owners' RoleBinding and isolation NetworkPolicy (second pass).

use std::collections::BTreeMap;

use idem_runtime::apply::{ApplyError, DesiredChildren, TENANT_LABEL};
use k8s_openapi::api::core::v1::{
    LimitRange, LimitRangeItem, LimitRangeSpec, Namespace, ResourceQuota, ResourceQuotaSpec,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicySpec,
};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::resources::tenant::{OwnerKind, Tenant};

/// ResourceQuota name in each tenant namespace.
pub const QUOTA: &str = "idem-quota";
/// LimitRange name in each tenant namespace.
pub const LIMITS: &str = "idem-limits";
/// RoleBinding name in each tenant namespace.
pub const OWNERS: &str = "idem-owners";
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

/// First pass: one Namespace per short name; namespaces no longer listed are pruned.
///
/// # Errors
/// [`ApplyError`] when a child cannot be serialised.
pub fn namespaces(tenant: &Tenant) -> Result<DesiredChildren, ApplyError> {
    let mut desired = DesiredChildren::new();
    desired.prune_kind::<Namespace>();
    for name in namespace_names(tenant) {
        desired.add(&Namespace {
            metadata: meta(&name, None),
            ..Namespace::default()
        })?;
    }
    Ok(desired)
}

/// Second pass: the objects inside each of `namespaces` (those the tenant really owns).
/// Kinds that are not wanted any more (quota removed, isolation off) are pruned.
///
/// # Errors
/// [`ApplyError`] when a child cannot be serialised.
pub fn contents(tenant: &Tenant, namespaces: &[String]) -> Result<DesiredChildren, ApplyError> {
    let mut desired = DesiredChildren::new();
    desired
        .prune_kind::<ResourceQuota>()
        .prune_kind::<LimitRange>()
        .prune_kind::<RoleBinding>()
        .prune_kind::<NetworkPolicy>();
    let spec = &tenant.spec;
    let tenant_name = tenant.metadata.name.clone().unwrap_or_default();
    for ns in namespaces {
        let ns = Some(ns.as_str());
        if let Some(quota) = &spec.quota {
            desired.add(&ResourceQuota {
                metadata: meta(QUOTA, ns),
                spec: Some(ResourceQuotaSpec {
                    hard: Some(quota.hard.clone()),
                    ..ResourceQuotaSpec::default()
                }),
                ..ResourceQuota::default()
            })?;
        }
        if let Some(limits) = &spec.limits {
            let map = |m: &BTreeMap<_, _>| (!m.is_empty()).then(|| m.clone());
            desired.add(&LimitRange {
                metadata: meta(LIMITS, ns),
                spec: Some(LimitRangeSpec {
                    limits: vec![LimitRangeItem {
                        type_: "Container".into(),
                        default_request: map(&limits.default_request),
                        default: map(&limits.default),
                        ..LimitRangeItem::default()
                    }],
                }),
            })?;
        }
        if !spec.owners.is_empty() {
            desired.add(&RoleBinding {
                metadata: meta(OWNERS, ns),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "ClusterRole".into(),
                    name: OWNER_ROLE.into(),
                },
                subjects: Some(
                    spec.owners
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
            })?;
        }
        if spec.isolation {
            desired.add(&NetworkPolicy {
                metadata: meta(ISOLATION, ns),
                spec: Some(NetworkPolicySpec {
                    pod_selector: Some(LabelSelector::default()),
                    policy_types: Some(vec!["Ingress".into()]),
                    ingress: Some(vec![NetworkPolicyIngressRule {
                        from: Some(vec![NetworkPolicyPeer {
                            namespace_selector: Some(LabelSelector {
                                match_labels: Some(BTreeMap::from([(
                                    TENANT_LABEL.to_string(),
                                    tenant_name.clone(),
                                )])),
                                ..LabelSelector::default()
                            }),
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
