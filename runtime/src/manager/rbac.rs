//! The permissions a manager's controllers use, as the RBAC objects of its ServiceAccount
//! (`rbac` prints them): a ClusterRole with each kind's verbs, and a Role for its Leases.
//!
//! What each rule is for:
//! - a primary kind: `get`, `list`, `watch`, and `patch` (finalizers, guarded by
//!   resourceVersion); `update` on `<plural>/status` (a resourceVersion-guarded PUT) and on
//!   `<plural>/finalizers` (which children's `blockOwnerDeletion` ownerReferences need); `get`
//!   on its own CustomResourceDefinition (a deleted object's cleanup asks whether the CRD is
//!   being deleted, [`crate::reconciler::retention`], and releases the children when it
//!   cannot tell);
//! - a child kind: `get`, `list`, `watch`, `create` (create-once children), `patch`
//!   (server-side apply, its dry runs, release) and `delete` (prune);
//! - `namespaces` `get`, `list`, `watch` for a kind whose tenant is a namespace's label;
//! - `events` (`events.k8s.io`) `create`, `patch`; with
//!   [`Manager::installing_crds`](super::Manager::installing_crds), `create` on
//!   `customresourcedefinitions` and `get`, `list`, `watch`, `patch` on the manager's own;
//! - in the Leases' namespace, `leases` `list` and `watch` (a replica outside a shard ring
//!   watches whether one runs; a ring's member probes the server's `shardSelector` with a
//!   list) and `get`, `create`, `update`, `delete` (`--leader-elect`, `--shards auto`; a
//!   member deletes its Lease when it leaves, and dead members' ones).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::ApiResource;

/// What a controller does with a child kind.
pub(crate) const CHILD_VERBS: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];

/// One rule: `verbs` on `resources` of API `group`.
pub fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    }
}

/// The rules of a primary kind (`group`, `plural`).
pub(crate) fn primary_rules(group: &str, plural: &str) -> Vec<PolicyRule> {
    let mut crd = rule(
        "apiextensions.k8s.io",
        &["customresourcedefinitions"],
        &["get"],
    );
    crd.resource_names = Some(vec![format!("{plural}.{group}")]);
    vec![
        rule(group, &[plural], &["get", "list", "watch", "patch"]),
        rule(
            group,
            &[&format!("{plural}/status"), &format!("{plural}/finalizers")],
            &["update"],
        ),
        crd,
    ]
}

/// The rule of a child kind.
pub(crate) fn child_rule(kind: &ApiResource) -> PolicyRule {
    rule(&kind.group, &[&kind.plural], CHILD_VERBS)
}

/// The rules of the manager itself: Events, and when it installs CRDs (`installing`: their
/// names), `create` on CRDs (RBAC cannot name what a create makes) and the rest on its own
/// CRDs only.
pub(crate) fn manager_rules(installing: &[String]) -> Vec<PolicyRule> {
    let mut rules = vec![rule("events.k8s.io", &["events"], &["create", "patch"])];
    if !installing.is_empty() {
        let crds = &["customresourcedefinitions"];
        rules.push(rule("apiextensions.k8s.io", crds, &["create"]));
        let mut own = rule(
            "apiextensions.k8s.io",
            crds,
            &["get", "list", "watch", "patch"],
        );
        own.resource_names = Some(installing.to_vec());
        rules.push(own);
    }
    rules
}

/// What `rbac` cannot know or decide for the user, printed as comments above its objects:
/// - controllers that write RoleBindings or ClusterRoleBindings may grant only the
///   permissions they hold or roles they may `bind` (RBAC's escalation check);
/// - controllers that write Roles or ClusterRoles may grant only what they hold, or need
///   `escalate`;
/// - a Role in a `kube-*` namespace lets the account update and delete the Leases of
///   Kubernetes' own components there.
pub(crate) fn notes(rules: &[PolicyRule], namespace: &str) -> Vec<String> {
    let writes = |kinds: &[&str]| {
        rules.iter().any(|r| {
            r.api_groups
                .iter()
                .flatten()
                .any(|g| g == "rbac.authorization.k8s.io")
                && (r.resources.iter().flatten()).any(|x| kinds.contains(&x.as_str()))
                && r.verbs.iter().any(|v| v == "create" || v == "patch")
        })
    };
    let mut notes = Vec::new();
    if writes(&["rolebindings", "clusterrolebindings"]) {
        notes.push(
            "The controllers write RoleBindings: RBAC lets this account grant only what it \
             holds. Add `bind` on `clusterroles` (and `roles`, for bindings to Roles; API group \
             rbac.authorization.k8s.io) with the resourceNames of the roles they grant to the \
             ClusterRole."
                .to_owned(),
        );
    }
    if writes(&["roles", "clusterroles"]) {
        notes.push(
            "The controllers write Roles: RBAC lets this account write only roles whose \
             permissions it holds. Add those permissions, or `escalate` on `roles` or \
             `clusterroles`, to the ClusterRole."
                .to_owned(),
        );
    }
    if namespace.starts_with("kube-") {
        notes.push(format!(
            "The Role lets this account update and delete every Lease in {namespace}, those \
             of Kubernetes' own components among them: give the manager a namespace of its own."
        ));
    }
    notes
}

/// `note` as YAML comment lines of at most 94 characters.
pub(crate) fn comment(note: &str) -> String {
    let mut out = String::new();
    let mut line = String::from("#");
    for word in note.split(' ') {
        if line.len() + word.len() > 92 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// `rules` with those of the same API groups, verbs and names in one, resources sorted and
/// each once, without a rule another one grants all of; the rules in the order of their first
/// appearance.
pub fn merged(rules: Vec<PolicyRule>) -> Vec<PolicyRule> {
    let out = merged_by_verbs(rules);
    let covers = |s: &PolicyRule, r: &PolicyRule| {
        let within = |a: &Option<Vec<String>>, b: &Option<Vec<String>>| {
            a.iter()
                .flatten()
                .all(|x| b.iter().flatten().any(|y| y == x))
        };
        s.api_groups == r.api_groups
            && s.resource_names == r.resource_names
            && s.non_resource_urls == r.non_resource_urls
            && within(&r.resources, &s.resources)
            && r.verbs.iter().all(|v| s.verbs.contains(v))
    };
    (0..out.len())
        .filter(|&i| !(0..out.len()).any(|j| j != i && covers(&out[j], &out[i])))
        .map(|i| out[i].clone())
        .collect()
}

fn merged_by_verbs(rules: Vec<PolicyRule>) -> Vec<PolicyRule> {
    let mut out: Vec<PolicyRule> = Vec::new();
    for mut rule in rules {
        let mut verbs = rule.verbs.clone();
        verbs.sort();
        verbs.dedup();
        rule.verbs = verbs;
        let same = out.iter_mut().find(|r| {
            r.api_groups == rule.api_groups
                && r.verbs == rule.verbs
                && r.resource_names == rule.resource_names
                && r.non_resource_urls == rule.non_resource_urls
        });
        match same {
            Some(r) => {
                let mut resources: BTreeSet<String> =
                    r.resources.take().unwrap_or_default().into_iter().collect();
                resources.extend(rule.resources.unwrap_or_default());
                r.resources = Some(resources.into_iter().collect());
            }
            None => {
                let resources: BTreeSet<String> = rule
                    .resources
                    .take()
                    .unwrap_or_default()
                    .into_iter()
                    .collect();
                rule.resources = Some(resources.into_iter().collect());
                out.push(rule);
            }
        }
    }
    out
}

/// The namespace (unless `default`), the ServiceAccount `name` in it, its ClusterRole
/// (`cluster_rules`) and binding, and the Role and binding of its Leases in `namespace`.
pub(crate) fn objects(
    name: &str,
    namespace: &str,
    cluster_rules: Vec<PolicyRule>,
) -> Vec<serde_json::Value> {
    let meta = |namespaced: bool| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespaced.then(|| namespace.to_owned()),
        ..ObjectMeta::default()
    };
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: name.to_owned(),
        namespace: Some(namespace.to_owned()),
        ..Subject::default()
    };
    let role_ref = |kind: &str| RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: name.to_owned(),
    };
    let leases = vec![rule(
        "coordination.k8s.io",
        &["leases"],
        &["get", "list", "watch", "create", "update", "delete"],
    )];
    let json = |v: Result<serde_json::Value, serde_json::Error>| {
        v.expect("k8s-openapi's objects serialise")
    };
    // The namespace, unless it is `default`: applied, it is created or left as it is.
    let ns = (namespace != "default").then(|| {
        let meta = ObjectMeta {
            name: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        };
        let ns = json(serde_json::to_value(Namespace {
            metadata: meta,
            ..Namespace::default()
        }));
        with_type(ns, "v1", "Namespace")
    });
    ns.into_iter()
        .chain([
            with_type(
                json(serde_json::to_value(ServiceAccount {
                    metadata: meta(true),
                    ..ServiceAccount::default()
                })),
                "v1",
                "ServiceAccount",
            ),
            with_type(
                json(serde_json::to_value(ClusterRole {
                    metadata: meta(false),
                    rules: Some(merged(cluster_rules)),
                    ..ClusterRole::default()
                })),
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
            ),
            with_type(
                json(serde_json::to_value(ClusterRoleBinding {
                    metadata: meta(false),
                    role_ref: role_ref("ClusterRole"),
                    subjects: Some(vec![subject.clone()]),
                })),
                "rbac.authorization.k8s.io/v1",
                "ClusterRoleBinding",
            ),
            with_type(
                json(serde_json::to_value(Role {
                    metadata: meta(true),
                    rules: Some(leases),
                })),
                "rbac.authorization.k8s.io/v1",
                "Role",
            ),
            with_type(
                json(serde_json::to_value(RoleBinding {
                    metadata: meta(true),
                    role_ref: role_ref("Role"),
                    subjects: Some(vec![subject]),
                })),
                "rbac.authorization.k8s.io/v1",
                "RoleBinding",
            ),
        ])
        .collect()
}

/// `object` with `apiVersion` and `kind` first.
fn with_type(object: serde_json::Value, api_version: &str, kind: &str) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    out.insert("apiVersion".into(), api_version.into());
    out.insert("kind".into(), kind.into());
    if let serde_json::Value::Object(fields) = object {
        out.extend(fields);
    }
    serde_json::Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_of_the_same_groups_and_verbs_are_one_with_each_resource_once() {
        let rules = merged(vec![
            rule("", &["namespaces"], &["get", "list", "watch"]),
            rule("", &["configmaps"], CHILD_VERBS),
            rule("", &["resourcequotas", "configmaps"], CHILD_VERBS),
            rule("", &["namespaces"], &["watch", "list", "get", "get"]),
            rule("apps", &["deployments"], CHILD_VERBS),
            rule("apps", &["deployments"], &["get"]),
        ]);
        assert_eq!(
            rules.len(),
            3,
            "a rule another grants all of is left out: {rules:?}"
        );
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["namespaces".to_owned()][..])
        );
        assert_eq!(
            rules[1].resources.as_deref(),
            Some(&["configmaps".to_owned(), "resourcequotas".to_owned()][..])
        );
        assert_eq!(
            rules[2].api_groups.as_deref(),
            Some(&["apps".to_owned()][..])
        );
    }

    #[test]
    fn notes_say_what_granting_roles_needs_and_warn_of_kube_namespaces() {
        let group = "rbac.authorization.k8s.io";
        assert!(notes(&[rule("", &["configmaps"], CHILD_VERBS)], "ops").is_empty());
        assert!(notes(&[rule(group, &["rolebindings"], &["get", "list"])], "ops").is_empty());
        let note = notes(&[rule(group, &["rolebindings"], CHILD_VERBS)], "ops");
        assert!(note.len() == 1 && note[0].contains("`bind`"), "{note:?}");
        let note = notes(&[rule(group, &["clusterroles"], CHILD_VERBS)], "ops");
        assert!(
            note.len() == 1 && note[0].contains("`escalate`"),
            "{note:?}"
        );
        let note = notes(&[], "kube-system");
        let lines = comment(&note[0]);
        assert!(lines.lines().count() > 1, "{lines}");
        assert!(
            lines.lines().all(|l| l.starts_with("# ") && l.len() <= 94),
            "{lines}"
        );
        assert_eq!(
            lines.replace("\n# ", " ").trim_end(),
            format!("# {}", note[0])
        );
        assert!(
            note.len() == 1 && note[0].contains("kube-system"),
            "{note:?}"
        );
    }
}
