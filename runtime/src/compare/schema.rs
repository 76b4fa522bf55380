//! Which fields of the known built-in kinds hold a `resource.Quantity`, by kind and path.
//!
//! The API server stores a quantity in canonical form ("1000m" becomes "1", "1024Mi" becomes
//! "1Gi"), so a desired quantity equals the live one by value, not by spelling. Only the fields
//! whose Go type is `resource.Quantity` (or a `ResourceList`, a map of them) are compared that
//! way; every other string, whatever its key is called, compares exactly. Source: the core/v1
//! and apps/v1 API types (`ResourceQuotaSpec.Hard`, `LimitRangeItem.{Max,Min,Default,
//! DefaultRequest,MaxLimitRequestRatio}`, `ResourceRequirements.{Limits,Requests}`,
//! `PodSpec.Overhead`, `EmptyDirVolumeSource.SizeLimit`).

/// One step of a path into an object: a field (or map key) name, or an element of a list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seg {
    /// A field of a struct or a key of a map.
    Field(String),
    /// An element of a list.
    Item,
}

/// A pattern step: a literal field, any field/key (`*`), or a list element (`[]`).
type Pattern = &'static [&'static str];

const RESOURCE_LISTS: &[&str] = &["limits", "requests"];
const LIMIT_RANGE_MAPS: &[&str] = &[
    "max",
    "min",
    "default",
    "defaultRequest",
    "maxLimitRequestRatio",
];
const CONTAINER_LISTS: &[&str] = &["containers", "initContainers", "ephemeralContainers"];

/// Where the pod spec sits in objects of `kind`, if it has one.
fn pod_spec_prefix(kind: &str) -> Option<Pattern> {
    match kind {
        "Pod" => Some(&["spec"]),
        "Deployment"
        | "ReplicaSet"
        | "StatefulSet"
        | "DaemonSet"
        | "Job"
        | "ReplicationController"
        | "PodTemplate" => Some(&["spec", "template", "spec"]),
        "CronJob" => Some(&["spec", "jobTemplate", "spec", "template", "spec"]),
        _ => None,
    }
}

fn matches(pattern: &[&str], path: &[Seg]) -> bool {
    pattern.len() == path.len()
        && pattern.iter().zip(path).all(|(p, s)| match (*p, s) {
            ("[]", Seg::Item) => true,
            ("*", Seg::Field(_)) => true,
            (lit, Seg::Field(f)) => lit == f,
            _ => false,
        })
}

/// Whether the field at `path` of an object of `kind` holds a `resource.Quantity`.
pub(crate) fn is_quantity(kind: &str, path: &[Seg]) -> bool {
    let field = |s: &Seg, set: &[&str]| matches!(s, Seg::Field(f) if set.contains(&f.as_str()));
    match kind {
        "ResourceQuota" => return matches(&["spec", "hard", "*"], path),
        "LimitRange" => {
            return path.len() == 5
                && matches(&["spec", "limits", "[]"], &path[..3])
                && field(&path[3], LIMIT_RANGE_MAPS)
                && matches!(path[4], Seg::Field(_));
        }
        "PersistentVolumeClaim" => {
            return path.len() == 4
                && matches(&["spec", "resources"], &path[..2])
                && field(&path[2], RESOURCE_LISTS)
                && matches!(path[3], Seg::Field(_));
        }
        _ => {}
    }
    let Some(prefix) = pod_spec_prefix(kind) else {
        return false;
    };
    if path.len() < prefix.len() || !matches(prefix, &path[..prefix.len()]) {
        return false;
    }
    let rest = &path[prefix.len()..];
    match rest.len() {
        // overhead.<resource>
        2 => matches(&["overhead", "*"], rest),
        // resources.{limits,requests}.<resource> (pod-level resources)
        3 => {
            matches(&["resources"], &rest[..1])
                && field(&rest[1], RESOURCE_LISTS)
                && matches!(rest[2], Seg::Field(_))
        }
        // volumes[].emptyDir.sizeLimit
        4 if matches(&["volumes", "[]", "emptyDir", "sizeLimit"], rest) => true,
        // <containers>[].resources.{limits,requests}.<resource>
        5 => {
            field(&rest[0], CONTAINER_LISTS)
                && rest[1] == Seg::Item
                && matches(&["resources"], &rest[2..3])
                && field(&rest[3], RESOURCE_LISTS)
                && matches!(rest[4], Seg::Field(_))
        }
        _ => false,
    }
}

/// The desired value at `path` (a value owned as a whole) with the API server's defaulting of
/// `kind` applied, when that defaulting can add to it; `None` when nothing is defaulted there.
///
/// An atomic value is stored defaulted, so it equals the desired one only after the same
/// defaulting. Source: the Go defaulting functions of the types (`SetDefaults_LimitRangeItem`
/// in core/v1, `SetDefaults_NetworkPolicyPort` in networking/v1, `SetDefaults_Subject` in
/// rbac/v1); each default is computed from the desired value itself, so nothing another
/// writer put there can pass for one.
pub(crate) fn defaulted(
    kind: &str,
    path: &[Seg],
    d: &serde_json::Value,
) -> Option<serde_json::Value> {
    use serde_json::{Value, json};
    let at = |p: &[&str]| matches(p, path);
    match kind {
        "LimitRange" if at(&["spec", "limits"]) => {
            let items = d.as_array()?;
            let items = items
                .iter()
                .map(|item| {
                    let mut item = item.clone();
                    if item.get("type").and_then(Value::as_str) != Some("Container") {
                        return item;
                    }
                    let map = |item: &Value, k: &str| {
                        item.get(k)
                            .and_then(Value::as_object)
                            .cloned()
                            .unwrap_or_default()
                    };
                    let (max, min) = (map(&item, "max"), map(&item, "min"));
                    let mut default = map(&item, "default");
                    for (k, v) in max {
                        default.entry(k).or_insert(v);
                    }
                    let mut request = map(&item, "defaultRequest");
                    for (k, v) in default.iter().chain(min.iter()) {
                        request.entry(k.clone()).or_insert(v.clone());
                    }
                    for (k, m) in [("default", default), ("defaultRequest", request)] {
                        if !m.is_empty() {
                            item[k] = Value::Object(m);
                        }
                    }
                    item
                })
                .collect();
            Some(Value::Array(items))
        }
        "NetworkPolicy" if at(&["spec", "ingress"]) || at(&["spec", "egress"]) => {
            let mut rules = d.clone();
            for rule in rules.as_array_mut()? {
                if let Some(ports) = rule.get_mut("ports").and_then(Value::as_array_mut) {
                    for port in ports {
                        if let Some(p) = port.as_object_mut() {
                            p.entry("protocol").or_insert(json!("TCP"));
                        }
                    }
                }
            }
            Some(rules)
        }
        "RoleBinding" | "ClusterRoleBinding" if at(&["subjects"]) => {
            let mut subjects = d.clone();
            for s in subjects.as_array_mut()? {
                let Some(o) = s.as_object_mut() else { continue };
                let group = match o.get("kind").and_then(Value::as_str) {
                    Some("User" | "Group") => "rbac.authorization.k8s.io",
                    _ => continue,
                };
                if o.get("apiGroup")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    o.insert("apiGroup".into(), json!(group));
                }
            }
            Some(subjects)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Vec<Seg> {
        s.split('.')
            .map(|x| {
                if x == "[]" {
                    Seg::Item
                } else {
                    Seg::Field(x.to_owned())
                }
            })
            .collect()
    }

    #[test]
    fn quantity_fields_by_kind_and_path() {
        assert!(is_quantity("ResourceQuota", &p("spec.hard.cpu")));
        assert!(is_quantity(
            "LimitRange",
            &p("spec.limits.[].default.memory")
        ));
        assert!(is_quantity(
            "Deployment",
            &p("spec.template.spec.containers.[].resources.limits.cpu")
        ));
        assert!(is_quantity("Pod", &p("spec.volumes.[].emptyDir.sizeLimit")));
        // Same key names elsewhere are plain strings.
        assert!(!is_quantity("ConfigMap", &p("data.storage")));
        assert!(!is_quantity("ConfigMap", &p("data.hard")));
        assert!(!is_quantity("Deployment", &p("metadata.labels.cpu")));
        assert!(!is_quantity(
            "ResourceQuota",
            &p("metadata.annotations.cpu")
        ));
        assert!(!is_quantity("LimitRange", &p("spec.limits.[].type")));
    }
}
