//! The exact permissions the operator uses, one rule per API it calls: the single source of
//! the least-privilege ClusterRole that `cargo xtask manifests` writes.

use k8s_openapi::api::rbac::v1::PolicyRule;

/// One rule: API group, resources, verbs, and optional resource names.
struct Rule {
    group: &'static str,
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
    names: &'static [&'static str],
}

/// What the operator does with each resource and why (in the comment).
const RULES: &[Rule] = &[
    // Primary resources: watched; finalizers added/removed with guarded updates/patches.
    Rule {
        group: "tenancy.idem.dev",
        resources: &["tenants", "tenantapps"],
        verbs: &["get", "list", "watch", "patch", "update"],
        names: &[],
    },
    // Status written through the status subresource.
    Rule {
        group: "tenancy.idem.dev",
        resources: &["tenants/status", "tenantapps/status"],
        verbs: &["get", "patch", "update"],
        names: &[],
    },
    // Owner references with blockOwnerDeletion need update on the owner's finalizers.
    Rule {
        group: "tenancy.idem.dev",
        resources: &["tenants/finalizers", "tenantapps/finalizers"],
        verbs: &["update"],
        names: &[],
    },
    // Children, applied with server-side apply (patch), pruned with delete.
    Rule {
        group: "",
        resources: &[
            "namespaces",
            "resourcequotas",
            "limitranges",
            "configmaps",
            "services",
        ],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        names: &[],
    },
    Rule {
        group: "apps",
        resources: &["deployments"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        names: &[],
    },
    Rule {
        group: "networking.k8s.io",
        resources: &["networkpolicies"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        names: &[],
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resources: &["rolebindings"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        names: &[],
    },
    // Binding ClusterRole `admin` to tenant owners needs `bind` on it (RBAC escalation check).
    Rule {
        group: "rbac.authorization.k8s.io",
        resources: &["clusterroles"],
        verbs: &["bind"],
        names: &["admin"],
    },
    // Kubernetes Events on child create/delete and condition changes.
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        names: &[],
    },
    // Leader election (`--leader-elect`).
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "list", "watch", "create", "update", "patch"],
        names: &[],
    },
];

/// The operator's ClusterRole rules.
pub fn policy_rules() -> Vec<PolicyRule> {
    RULES
        .iter()
        .map(|r| PolicyRule {
            api_groups: Some(vec![r.group.to_string()]),
            resources: Some(r.resources.iter().map(|s| s.to_string()).collect()),
            verbs: r.verbs.iter().map(|s| s.to_string()).collect(),
            resource_names: (!r.names.is_empty())
                .then(|| r.names.iter().map(|s| s.to_string()).collect()),
            non_resource_urls: None,
        })
        .collect()
}
