//! The exact permissions the operator uses, one rule per API it calls: the single source of
//! the least-privilege ClusterRole, the leader-election Role and the aggregated TenantApp
//! ClusterRoles that `cargo xtask manifests` writes, and of the admission policy that confines
//! the operator's writes to the namespaces it manages.

use k8s_openapi::api::rbac::v1::PolicyRule;

/// One rule: API group, resources, verbs, and optional resource names.
struct Rule {
    group: &'static str,
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
    names: &'static [&'static str],
}

/// The ClusterRoles the operator may bind: its ClusterRole's `bind` rule names them, and its
/// admission policy refuses a RoleBinding of any other (RBAC alone would let it bind any
/// ClusterRole whose rules it holds, its own among them). A Tenant whose `roleBindings` name
/// another stalls with the API server's refusal until an administrator adds the name to both
/// (`deploy/operator/02-clusterrole.yaml`, `05-admission-policy.yaml`).
pub const BINDABLE_CLUSTER_ROLES: &[&str] = &["admin", "edit", "view"];

/// What the operator does with each resource and why (in the comment).
const RULES: &[Rule] = &[
    // Primary resources: watched, read again before a status write, finalizers added and
    // removed with merge patches guarded by resourceVersion.
    Rule {
        group: "tenancy.idem.dev",
        resources: &["tenants", "tenantapps"],
        verbs: &["get", "list", "watch", "patch"],
        names: &[],
    },
    // Status written through the status subresource with PUT (resourceVersion-guarded).
    Rule {
        group: "tenancy.idem.dev",
        resources: &["tenants/status", "tenantapps/status"],
        verbs: &["update"],
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
    // The parameters of the tenant admission policy, one per tenant namespace.
    Rule {
        group: "tenancy.idem.dev",
        resources: &["tenantpolicies"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        names: &[],
    },
    // Binding ClusterRole `admin` to tenant owners, and those of a Tenant's `roleBindings`,
    // needs `bind` on them (RBAC escalation check).
    Rule {
        group: "rbac.authorization.k8s.io",
        resources: &["clusterroles"],
        verbs: &["bind"],
        names: BINDABLE_CLUSTER_ROLES,
    },
    // The Tenant and TenantApp finalizers read their own CRD to tell "the CRD is being
    // deleted" (retain everything) from an ordinary deletion (`tenant/finalize.rs`,
    // `tenant_app/finalize.rs`); only those two CRDs.
    Rule {
        group: "apiextensions.k8s.io",
        resources: &["customresourcedefinitions"],
        verbs: &["get"],
        names: &["tenants.tenancy.idem.dev", "tenantapps.tenancy.idem.dev"],
    },
    // Kubernetes Events on child create/delete and condition changes.
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        names: &[],
    },
];

/// Leader election (`--leader-elect`): read and renew its own Lease in its own namespace
/// (a Role there). `create` cannot be limited by name (the name is not known to the
/// authorizer before the object exists). Shard membership (`--shards auto`): each replica
/// renews a Lease named after itself, lists and watches the members' Leases and deletes dead members'
/// ones, so these verbs cover every Lease of that namespace.
const LEADER_ELECTION_RULES: &[Rule] = &[
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "update"],
        names: &[crate::NAME],
    },
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["create"],
        names: &[],
    },
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "list", "watch", "update", "delete"],
        names: &[],
    },
];

/// What users with the built-in `admin` or `edit` role in a namespace (tenant owners get
/// `admin` in their tenant's namespaces) may do with TenantApps there: aggregated into those
/// roles by the `rbac.authorization.k8s.io/aggregate-to-*` labels (Kubernetes RBAC "aggregated
/// ClusterRoles").
const TENANT_APP_EDIT_RULES: &[Rule] = &[
    Rule {
        group: "tenancy.idem.dev",
        resources: &["tenantapps"],
        verbs: &[
            "get",
            "list",
            "watch",
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
        ],
        names: &[],
    },
    Rule {
        group: "tenancy.idem.dev",
        resources: &["tenantapps/status"],
        verbs: &["get"],
        names: &[],
    },
];

/// What the built-in `view` role gets: reading TenantApps, and the TenantPolicies that say
/// what the tenant may use (never writing them: they are not in the edit rules, so tenant
/// owners, who get `admin`, cannot change their own rules).
const TENANT_APP_VIEW_RULES: &[Rule] = &[Rule {
    group: "tenancy.idem.dev",
    resources: &["tenantapps", "tenantapps/status", "tenantpolicies"],
    verbs: &["get", "list", "watch"],
    names: &[],
}];

fn to_policy(rules: &[Rule]) -> Vec<PolicyRule> {
    rules
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

/// The rules of the Role in the operator's namespace that lets it hold its leader Lease.
pub fn leader_election_rules() -> Vec<PolicyRule> {
    to_policy(LEADER_ELECTION_RULES)
}

/// The rules aggregated into the built-in `admin` and `edit` ClusterRoles.
pub fn tenant_app_edit_rules() -> Vec<PolicyRule> {
    to_policy(TENANT_APP_EDIT_RULES)
}

/// The rules aggregated into the built-in `view` ClusterRole.
pub fn tenant_app_view_rules() -> Vec<PolicyRule> {
    to_policy(TENANT_APP_VIEW_RULES)
}

/// The kinds the operator writes inside namespaces (plural names, by API group), which the
/// admission policy confines to namespaces labelled as managed by the operator.
pub const NAMESPACED_WRITES: &[(&str, &[&str])] = &[
    (
        "",
        &["resourcequotas", "limitranges", "configmaps", "services"],
    ),
    ("apps", &["deployments"]),
    ("networking.k8s.io", &["networkpolicies"]),
    ("rbac.authorization.k8s.io", &["rolebindings"]),
    ("tenancy.idem.dev", &["tenantpolicies"]),
];

/// The operator's ClusterRole rules.
pub fn policy_rules() -> Vec<PolicyRule> {
    to_policy(RULES)
}
