//! `cargo xtask manifests [--check]`: `deploy/operator/` — Namespace, ServiceAccount,
//! least-privilege ClusterRole and its binding, the leader-election Role and its binding, the
//! TenantApp ClusterRoles aggregated into `admin`/`edit`/`view`, the Deployment with probes,
//! the ValidatingAdmissionPolicy that confines the operator's writes to the namespaces it
//! manages, the one that lets only the operator write the shard ring's member Leases, and the
//! FlowSchema that serves the operator's Lease requests at the API server's `leader-election`
//! priority level, the ValidatingAdmissionPolicy that enforces each Tenant's allowed classes
//! and registries and its cordon, and those that keep a Tenant's and a TenantApp's finalizer
//! until the operator has marked its cleanup done.

use std::path::Path;

use serde_json::{Value, json};

use crate::generated::{self, File};

/// The directory the manifests go to, relative to the repository root.
pub const DIR: &str = "deploy/operator";
/// The namespace the operator runs in.
pub const NAMESPACE: &str = "idem-system";
/// The operator's name (ServiceAccount, ClusterRole, Deployment).
pub const NAME: &str = "idem-operator";
/// The Role (and RoleBinding) that lets the operator hold its leader-election Lease.
pub const LEADER_ELECTION: &str = "idem-operator-leader-election";
/// The ValidatingAdmissionPolicy (and its binding) that confines the operator's writes.
pub const POLICY: &str = "idem-operator-managed-namespaces";
/// The ValidatingAdmissionPolicy (and its binding) that lets only the operator's
/// ServiceAccount write the shard ring's member Leases.
pub const RING_POLICY: &str = "idem-operator-shard-ring";
/// The FlowSchema that puts the operator's Lease requests in its namespace (leader election
/// and the shard ring's member Leases) into the `leader-election` priority level.
pub const LEASE_FLOWS: &str = "idem-operator-leases";
/// The `ValidatingAdmissionPolicy` that keeps the names of a Tenant's children in its
/// namespaces for the operator.
pub const NAMES_POLICY: &str = "idem-operator-reserved-names";
/// The `ValidatingAdmissionPolicy` keeping a tenant namespace's `idem-quota` the operator's to change.
pub const QUOTA_POLICY: &str = "idem-operator-quota-guard";
/// The ValidatingAdmissionPolicy that lets TenantApps be created only in tenant namespaces.
pub const APP_PLACEMENT_POLICY: &str = "idem-operator-tenantapp-placement";
/// The API server's priority level for leader-election traffic (one of its suggested
/// configurations, where Kubernetes' own controllers renew their Leases).
pub const LEADER_ELECTION_PRIORITY: &str = "leader-election";
/// The FlowSchema's matching precedence: that of the API server's suggested schema for
/// workloads' leader election, ahead of the schema every ServiceAccount's requests match.
pub const LEASE_FLOWS_PRECEDENCE: i32 = 200;
/// Namespaces the operator never writes nor writes into, whatever their labels and
/// ownerReferences: Kubernetes' own and the operator's.
pub const SYSTEM_NAMESPACES: &[&str] = &[
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "default",
    NAMESPACE,
];

/// The manifests, one file per object kind, in apply order.
pub fn files() -> anyhow::Result<Vec<File>> {
    let labels = json!({"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "idem"});
    use idem_operator::rbac;
    use idem_operator::resources::{FIELD_MANAGER, MANAGED_BY_LABEL};
    use idem_operator::tenant::policy as tenant_policy;
    let rules = serde_json::to_value(rbac::policy_rules())?;
    let lease_rules = serde_json::to_value(rbac::leader_election_rules())?;
    let edit_rules = serde_json::to_value(rbac::tenant_app_edit_rules())?;
    let view_rules = serde_json::to_value(rbac::tenant_app_view_rules())?;
    let aggregated = |to: &[&str]| {
        let mut l = labels.clone();
        for role in to {
            l[format!("rbac.authorization.k8s.io/aggregate-to-{role}")] = json!("true");
        }
        l
    };
    let service_account = format!("system:serviceaccount:{NAMESPACE}:{NAME}");
    // Each policy below is bound cluster-wide, denying what it refuses.
    let binding = |policy: &str| {
        json!({"apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy, "labels": labels},
        "spec": {"policyName": policy, "validationActions": ["Deny"]}})
    };
    // Each admission policy's frame: the policy refuses (`Fail`) when it cannot be evaluated.
    let admission_policy = |name: &str, spec: Value| {
        let mut framed = serde_json::Map::new();
        framed.insert("failurePolicy".into(), json!("Fail"));
        if let Value::Object(spec) = spec {
            framed.extend(spec);
        }
        json!({"apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": framed})
    };
    let managed = |obj: &str| {
        format!(
            "has({obj}.metadata.labels) && '{MANAGED_BY_LABEL}' in {obj}.metadata.labels \
             && {obj}.metadata.labels['{MANAGED_BY_LABEL}'] == '{FIELD_MANAGER}'"
        )
    };
    // A namespace is the operator's when it carries the label, or when a Tenant is its
    // controller: only those who may update Namespaces (cluster admins, and the operator on
    // namespaces already its own) can set either, so removing the label alone (one field, as
    // easy to drop by mistake as any other) does not take a Tenant's namespace from its repair.
    let tenant_api_version = format!("{}/v1alpha1", idem_operator::resources::GROUP);
    let controlled = |obj: &str| {
        format!(
            "has({obj}.metadata.ownerReferences) && {obj}.metadata.ownerReferences.exists(r, \
             r.apiVersion == '{tenant_api_version}' && r.kind == 'Tenant' \
             && has(r.controller) && r.controller)"
        )
    };
    let ours = |obj: &str| format!("({}) || ({})", managed(obj), controlled(obj));
    // `namespaceObject` carries no ownerReferences (the API server gives policies a subset of
    // its metadata): for writes into a namespace, the owner-uid label the operator puts on the
    // namespaces it controls stands in for the reference (again only namespace updaters can set
    // it, and the operator only on namespaces already its own).
    let owner_uid = idem_runtime::apply::OWNER_UID_LABEL;
    let ours_inside = format!(
        "({}) || (has(namespaceObject.metadata.labels) && '{owner_uid}' in namespaceObject.metadata.labels)",
        managed("namespaceObject")
    );
    let bindable: Vec<String> = rbac::BINDABLE_CLUSTER_ROLES
        .iter()
        .map(|n| format!("'{n}'"))
        .collect();
    let bindable = format!("[{}]", bindable.join(", "));
    let system: Vec<String> = SYSTEM_NAMESPACES.iter().map(|n| format!("'{n}'")).collect();
    let system = format!("[{}]", system.join(", "));
    let operations = json!(["CREATE", "UPDATE", "DELETE"]);
    let mut resource_rules = vec![json!({"apiGroups": [""], "apiVersions": ["*"],
        "resources": ["namespaces"], "operations": operations})];
    for (group, resources) in rbac::NAMESPACED_WRITES {
        resource_rules.push(json!({"apiGroups": [group], "apiVersions": ["*"],
            "resources": resources, "operations": operations}));
    }
    let label = format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}");
    let owned = format!("labelled {label} or controlled by a Tenant");
    let policy = admission_policy(
        POLICY,
        json!({
            "matchConstraints": {"resourceRules": resource_rules},
            "matchConditions": [{"name": "the-operator-only",
                "expression": format!("request.userInfo.username == '{service_account}'")}],
            "validations": [
                {"expression": format!("!((request.resource.resource == 'namespaces' ? request.name : request.namespace) in {system})"),
                 "message": format!("idem-operator may never write the system namespaces {} or anything in them", SYSTEM_NAMESPACES.join(", ")),
                 "reason": "Forbidden"},
                {"expression": format!("request.resource.resource != 'namespaces' || request.operation != 'CREATE' || ({})", managed("object")),
                 "message": format!("idem-operator may only create namespaces labelled {label}"),
                 "reason": "Forbidden"},
                {"expression": format!("request.resource.resource != 'namespaces' || request.operation == 'CREATE' || {}", ours("oldObject")),
                 "message": format!("idem-operator may only change or delete namespaces {owned}"),
                 "reason": "Forbidden"},
                {"expression": format!("request.resource.resource != 'namespaces' || request.operation != 'UPDATE' || !({}) || ({})", managed("oldObject"), managed("object")),
                 "message": format!("idem-operator may not remove the label {label} from a namespace"),
                 "reason": "Forbidden"},
                {"expression": format!("request.resource.resource == 'namespaces' || (namespaceObject != null && ({ours_inside}))"),
                 "message": format!("idem-operator may only write into namespaces labelled {label} or {owner_uid}"),
                 "reason": "Forbidden"},
                // RBAC lets an account bind any ClusterRole whose rules it holds, `bind` or not: the
                // operator's own, or any narrower one. Only the names it has `bind` on may be bound.
                {"expression": format!("request.resource.resource != 'rolebindings' || request.operation == 'DELETE' || (object.roleRef.kind == 'ClusterRole' && object.roleRef.name in {bindable})"),
                 "message": format!("idem-operator may only bind the ClusterRoles {} (its ClusterRole's `bind` rule and this policy name them)", rbac::BINDABLE_CLUSTER_ROLES.join(", ")),
                 "reason": "Forbidden"},
            ],
        }),
    );
    let policy_binding = binding(POLICY);
    // Every replica waits until each live member Lease acknowledges a ring: a Lease forged by
    // anyone else who may write Leases there would hold all of them (README "Running N
    // replicas"). Only the operator's own account may write a Lease of the ring, admins included.
    let member = idem_runtime::shard::membership::MEMBER_LABEL;
    let in_ring = |obj: &str| {
        format!(
            "{obj} != null && has({obj}.metadata.labels) && '{member}' in {obj}.metadata.labels"
        )
    };
    let ring_policy = admission_policy(
        RING_POLICY,
        json!({
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                "resourceRules": [{"apiGroups": ["coordination.k8s.io"], "apiVersions": ["*"],
                    "resources": ["leases"], "operations": operations}]},
            "matchConditions": [{"name": "a-member-lease",
                "expression": format!("({}) || ({})", in_ring("object"), in_ring("oldObject"))}],
            "validations": [
                {"expression": format!("request.userInfo.username == '{service_account}'"),
                 "message": format!("only {service_account} may write the shard ring's member Leases (label {member})"),
                 "reason": "Forbidden"},
            ],
        }),
    );
    let ring_binding = binding(RING_POLICY);
    // A tenant owner (`admin` in the namespace) who deletes one of the Tenant's RoleBindings or
    // NetworkPolicies and creates their own under its name would keep it: idem never adopts an
    // object it did not create (the Tenant stalls with `ChildNotOwned`). In namespaces the
    // operator manages, only it (and cluster administrators) may create objects of those names.
    let names = {
        use idem_operator::tenant::desired::{
            ISOLATION, LIMITS, OWNERS, QUOTA, ROLE_BINDING_PREFIX,
        };
        let exact: Vec<String> = [OWNERS, QUOTA, LIMITS, ISOLATION]
            .iter()
            .map(|n| format!("'{n}'"))
            .collect();
        (
            format!(
                "request.name in [{}] || request.name.startsWith('{ROLE_BINDING_PREFIX}')",
                exact.join(", ")
            ),
            format!(
                "{}, {ROLE_BINDING_PREFIX}*",
                [OWNERS, QUOTA, LIMITS, ISOLATION].join(", ")
            ),
        )
    };
    let names_policy = admission_policy(
        NAMES_POLICY,
        json!({
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {MANAGED_BY_LABEL: FIELD_MANAGER}},
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["*"], "operations": ["CREATE"],
                     "resources": ["resourcequotas", "limitranges"]},
                    {"apiGroups": ["rbac.authorization.k8s.io"], "apiVersions": ["*"],
                     "operations": ["CREATE"], "resources": ["rolebindings"]},
                    {"apiGroups": ["networking.k8s.io"], "apiVersions": ["*"],
                     "operations": ["CREATE"], "resources": ["networkpolicies"]},
                ]},
            "matchConditions": [{"name": "a-tenant-child-name", "expression": names.0}],
            "validations": [
                {"expression": format!("request.userInfo.username == '{service_account}' || 'system:masters' in request.userInfo.groups"),
                 "message": format!("in a namespace idem manages, the names {} are kept for its Tenant's own objects: only {service_account} creates them", names.1),
                 "reason": "Forbidden"},
            ],
        }),
    );
    let names_binding = binding(NAMES_POLICY);
    // A tenant namespace's quota deleted or edited limits nothing (a quota made again counts
    // nothing until the quota controller has) or the wrong amount until the operator puts it
    // back: 5 to 9 objects got past it per deletion in a trial. In namespaces a Tenant holds,
    // only the operator and Kubernetes' own components (the namespace controller and garbage
    // collector deleting it with its namespace) change or delete it; an administrator changes
    // the Tenant's `spec.quota`. A released namespace (no owner-uid label) is free.
    let quota_guard = {
        use idem_operator::tenant::desired::QUOTA;
        let owner_uid = idem_runtime::apply::OWNER_UID_LABEL;
        admission_policy(
            QUOTA_POLICY,
            json!({
                "matchConstraints": {
                    "namespaceSelector": {
                        "matchLabels": {MANAGED_BY_LABEL: FIELD_MANAGER},
                        "matchExpressions": [{"key": owner_uid, "operator": "Exists"}],
                    },
                    "resourceRules": [{"apiGroups": [""], "apiVersions": ["*"],
                        "operations": ["UPDATE", "DELETE"], "resources": ["resourcequotas"]}]},
                // A collection's delete (the namespace controller emptying a namespace, `kubectl
                // delete quota --all`) names no object: `request.name` is absent, and reading it
                // would be an error, which `Fail` turns into a refusal. It takes `idem-quota` too.
                "matchConditions": [{"name": "the-tenant-quota",
                    "expression": format!("!has(request.name) || request.name == '' || request.name == '{QUOTA}'")}],
                "validations": [
                    {"expression": format!("request.userInfo.username in ['{service_account}', 'system:kube-controller-manager'] || \
                        (has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in ['system:masters', 'system:serviceaccounts:kube-system']))"),
                     "message": format!("ResourceQuota {QUOTA} is kept by {service_account} from the Tenant's spec.quota: change the Tenant instead (a quota deleted or edited here limits nothing, or the wrong amount, until the operator puts it back)"),
                     "reason": "Forbidden"},
                ],
            }),
        )
    };
    let quota_guard_binding = binding(QUOTA_POLICY);
    // `edit` in any namespace grants TenantApp creation there (the aggregated roles), and the
    // operator keeps every TenantApp it watches in memory, each up to ~1.3 MB, whether or not
    // its namespace is a tenant's: anyone with `edit` somewhere could grow every replica without
    // bound, where no Tenant's `count/tenantapps` quota applies. Outside the namespaces a Tenant
    // holds an app does nothing anyway (`NotInTenantNamespace`), so only cluster administrators
    // may create one there, or change the spec of one left in a namespace released since.
    let app_placement = {
        let owner_uid = idem_runtime::apply::OWNER_UID_LABEL;
        let held = format!(
            "namespaceObject != null && ({}) && '{owner_uid}' in namespaceObject.metadata.labels",
            managed("namespaceObject")
        );
        admission_policy(
            APP_PLACEMENT_POLICY,
            json!({
                "matchConstraints": {
                    "resourceRules": [{"apiGroups": [idem_operator::resources::GROUP], "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"], "resources": ["tenantapps"]}]},
                // Metadata-only updates (finalizers, labels) go on everywhere.
                "matchConditions": [{"name": "a-new-spec",
                    "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec"}],
                "validations": [
                    {"expression": format!("({held}) || (has(request.userInfo.groups) && 'system:masters' in request.userInfo.groups)"),
                     "message": format!("TenantApps may be created, or their spec changed, only in a namespace a Tenant holds (labelled {MANAGED_BY_LABEL}={FIELD_MANAGER} and {owner_uid}): outside one an app does nothing"),
                     "reason": "Forbidden"},
                ],
            }),
        )
    };
    let app_placement_binding = binding(APP_PLACEMENT_POLICY);
    // Under load, the operator's reconcile traffic fills the priority level of every
    // ServiceAccount; a member Lease renewed behind it would expire and change the shard ring
    // (every replica stops and relists). Its Lease requests get the level the API server gives
    // its own components' Leases instead.
    let flow_schema = json!({"apiVersion": "flowcontrol.apiserver.k8s.io/v1",
    "kind": "FlowSchema",
    "metadata": {"name": LEASE_FLOWS, "labels": labels},
    "spec": {
        "priorityLevelConfiguration": {"name": LEADER_ELECTION_PRIORITY},
        "matchingPrecedence": LEASE_FLOWS_PRECEDENCE,
        "distinguisherMethod": {"type": "ByUser"},
        "rules": [{
            "subjects": [{"kind": "ServiceAccount",
                "serviceAccount": {"name": NAME, "namespace": NAMESPACE}}],
            "resourceRules": [{"verbs": ["get", "list", "watch", "create", "update", "delete"],
                "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                "namespaces": [NAMESPACE]}],
        }],
    }});
    // Removing a Tenant's (or TenantApp's) finalizer by hand while the operator is down would
    // let the garbage collector delete the namespaces a `Retain` cleanup keeps: only the
    // operator, once its cleanup is marked done in the status, removes it.
    let cleanup_guards = idem_operator::controllers::cleanup_guards(&labels);
    anyhow::ensure!(
        cleanup_guards.len() == 12,
        "Tenant and TenantApp each have a cleanup guard, a foreground-deletion guard and an unguarded-deletion guard (Ready and Reconciling declared)"
    );
    let image = format!("{NAME}:{}", env!("CARGO_PKG_VERSION"));
    let objects: Vec<(&str, Vec<Value>)> = vec![
        (
            "00-namespace",
            vec![
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}}),
            ],
        ),
        (
            "01-serviceaccount",
            vec![json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels}})],
        ),
        (
            "02-clusterrole",
            vec![
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": NAME, "labels": labels}, "rules": rules}),
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "idem-tenantapps-edit", "labels": aggregated(&["admin", "edit"])},
                "rules": edit_rules}),
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "idem-tenantapps-view", "labels": aggregated(&["view"])},
                "rules": view_rules}),
            ],
        ),
        (
            "03-clusterrolebinding",
            vec![
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}),
            ],
        ),
        (
            "03-leader-election-role",
            vec![
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": LEADER_ELECTION, "namespace": NAMESPACE, "labels": labels},
                "rules": lease_rules}),
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": LEADER_ELECTION, "namespace": NAMESPACE, "labels": labels},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LEADER_ELECTION},
                "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}),
            ],
        ),
        (
            "04-deployment",
            vec![json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": NAME,
                        // SIGKILL comes this long after SIGTERM: the manager's shutdown grace
                        // for in-flight reconciles, then time to drain their writes (up to the
                        // fence's margin for an abandoned one) and to write that it left the
                        // shard ring, so the others take its share at once rather than after
                        // its Lease expires.
                        "terminationGracePeriodSeconds": termination_grace_seconds(),
                        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "operator",
                            "image": image,
                            "args": ["run", "--shards=auto", "--metrics-addr=0.0.0.0:8080", "--health-addr=0.0.0.0:8081"],
                            // glibc's malloc: a fixed mmap threshold (setting it turns off the
                            // dynamic one, which rises to the largest block freed) gives each
                            // block of 128 KiB or more back to the system when it is freed, so a
                            // watch event of a large object does not stay in the resident set.
                            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                                    {"name": "GLIBC_TUNABLES", "value": "glibc.malloc.mmap_threshold=131072"}],
                            "ports": [{"name": "metrics", "containerPort": 8080}, {"name": "health", "containerPort": 8081}],
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 10},
                            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "health"}, "periodSeconds": 5},
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                            "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                                "capabilities": {"drop": ["ALL"]}},
                        }],
                    },
                },
            }})],
        ),
        (
            "05-admission-policy",
            vec![
                policy,
                policy_binding,
                ring_policy,
                ring_binding,
                names_policy,
                names_binding,
                quota_guard,
                quota_guard_binding,
                app_placement,
                app_placement_binding,
            ],
        ),
        ("06-flowschema", vec![flow_schema]),
        (
            "07-tenant-policy",
            vec![
                tenant_policy::admission_policy(&service_account, &labels),
                tenant_policy::admission_binding(&labels),
            ],
        ),
        ("08-cleanup-guard", cleanup_guards),
    ];
    objects
        .into_iter()
        .map(|(name, objs)| generated::yaml_file(&format!("{DIR}/{name}.yaml"), "manifests", &objs))
        .collect()
}

/// The Deployment's `terminationGracePeriodSeconds`: the manager's default shutdown grace and
/// 15 s more (the fence's abandoned-write margin, a Lease round to write that it left).
fn termination_grace_seconds() -> u64 {
    idem_runtime::manager::ManagerOptions::default()
        .shutdown_grace
        .as_secs()
        + idem_runtime::leader::fence::ABANDONED_MARGIN.as_secs()
        + 10
}

/// Writes the manifests, or checks them.
pub fn run(root: &Path, check: bool) -> anyhow::Result<()> {
    generated::write_or_check(root, DIR, &files()?, check, "manifests")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_crds_and_manifests_are_current() {
        let root = generated::repo_root();
        crate::crds::run(&root, true).unwrap();
        run(&root, true).unwrap();
    }

    #[test]
    fn the_check_fails_on_a_stale_file() {
        let root = tempfile::tempdir().unwrap();
        run(root.path(), false).unwrap();
        run(root.path(), true).unwrap();
        let file = root.path().join(DIR).join("02-clusterrole.yaml");
        std::fs::write(&file, "# edited by hand\n").unwrap();
        let err = run(root.path(), true).unwrap_err().to_string();
        assert!(err.contains("02-clusterrole.yaml"), "{err}");
    }
}
