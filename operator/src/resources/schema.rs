//! Admission rules shared by the CRDs' schemas: bounded maps of quantities with key patterns
//! (ResourceQuota and LimitRange names), DNS names, and image references.
//!
//! Each rule mirrors the validation the API server applies to the child idem makes from the
//! field (k8s.io/kubernetes `pkg/apis/core/validation`: `ValidateResourceQuotaSpec`,
//! `ValidateLimitRange`, `validateContainerResourceName`; `pkg/apis/rbac/validation`), so input
//! the child would reject is rejected at admission instead of failing every reconcile. CEL
//! rules are costed by the API server before it accepts the CRD (per-rule limit 10⁷, per-CRD
//! 10⁸): every string and map they touch has a `maxLength` / `maxProperties` bound.

use schemars::{Schema, SchemaGenerator, json_schema};

/// Most entries in `quota.hard`.
pub const MAX_QUOTA_ENTRIES: usize = 32;
/// Most entries in `limits.default` and `limits.defaultRequest` each.
pub const MAX_LIMIT_ENTRIES: usize = 16;
/// Longest quantity string (e.g. `"123456789012345678Mi"` is 20).
pub const MAX_QUANTITY_LENGTH: usize = 64;
/// Longest resource name: a qualified name, `<DNS subdomain ≤ 253>/<name ≤ 63>`.
pub const MAX_RESOURCE_NAME_LENGTH: usize = 317;

/// A qualified name (`[prefix/]name`, Kubernetes `IsQualifiedName`), as an RE2 pattern.
const QUALIFIED_NAME: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";

/// A qualified name's prefix has at most 253 characters (a DNS subdomain): [`QUALIFIED_NAME`]
/// alone cannot bound it (the size of the whole key can reach 253 + 1 + 63 with a longer
/// prefix and a shorter name, which the API server refuses), as an RE2 pattern.
const SHORT_PREFIX: &str = r"^([^/]{1,253}/)?[^/]*$";

/// ResourceQuota names without a `/` the API server accepts (`IsStandardQuotaResourceName`),
/// hugepages aside.
pub const STANDARD_QUOTA_NAMES: &[&str] = &[
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "services.nodeports",
    "services.loadbalancers",
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.storage",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
];

/// Quota names whose values must be whole numbers (`IsIntegerResourceName`).
pub const INTEGER_QUOTA_NAMES: &[&str] = &[
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "services.nodeports",
    "services.loadbalancers",
];

fn cel_list(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    format!("[{}]", quoted.join(", "))
}

/// The value schema of a quantity map: an int-or-string of bounded length.
fn quantity_value() -> serde_json::Value {
    serde_json::json!({
        "x-kubernetes-int-or-string": true,
        "maxLength": MAX_QUANTITY_LENGTH,
        "x-kubernetes-validations": [
            {"rule": "isQuantity(string(self))",
             "message": "must be a quantity such as 4, 500m or 8Gi"},
            {"rule": "!isQuantity(string(self)) || !quantity(string(self)).isLessThan(quantity('0'))",
             "message": "must not be negative"},
            // Quotas are split in exact whole units (milli-units for CPU).
            {"rule": "!isQuantity(string(self)) || quantity(string(self)).isLessThan(quantity('1e24'))",
             "message": "must be less than 1e24 (idem computes with quantities exactly)"},
        ],
    })
}

/// Rules common to the keys of every quantity map.
fn key_rules(what: &str) -> Vec<serde_json::Value> {
    vec![serde_json::json!({
        "rule": format!("self.all(k, size(k) <= {MAX_RESOURCE_NAME_LENGTH} && k.matches(r'{QUALIFIED_NAME}') && k.matches(r'{SHORT_PREFIX}'))"),
        "message": format!("{what} keys are resource names: a name or prefix/name (Kubernetes qualified names)"),
    })]
}

/// Whether a key is an extended resource (`IsExtendedResourceName`): has a `/`, is not in
/// `kubernetes.io/` and does not start with `requests.`. CEL, over key `k`.
fn extended(k: &str) -> String {
    format!(
        "({k}.contains('/') && !{k}.contains('kubernetes.io/') && !{k}.startsWith('requests.'))"
    )
}

/// `quota.hard`: at most [`MAX_QUOTA_ENTRIES`] quantities ≥ 0, keyed by a standard
/// ResourceQuota name, a hugepages name, or any qualified name with a `/` (`count/…`,
/// `<class>.storageclass.storage.k8s.io/…`, extended resources); counts are whole numbers.
pub fn quota_hard(_: &mut SchemaGenerator) -> Schema {
    let mut rules = key_rules("quota");
    rules.push(serde_json::json!({
        "rule": format!(
            "self.all(k, k.contains('/') || k in {} || k.startsWith('hugepages-') || k.startsWith('requests.hugepages-'))",
            cel_list(STANDARD_QUOTA_NAMES)
        ),
        "message": "a quota key is a standard ResourceQuota name (pods, cpu, requests.memory, configmaps, …) or contains a '/' (count/<resource>, extended resources)",
    }));
    rules.push(serde_json::json!({
        "rule": format!(
            "self.all(k, !(k in {} || {}) || !isQuantity(string(self[k])) || quantity(string(self[k])).isInteger())",
            cel_list(INTEGER_QUOTA_NAMES),
            extended("k")
        ),
        "message": "object counts and extended resources in a quota must be whole numbers",
    }));
    json_schema!({
        "description": "Hard limits by resource name.",
        "type": "object",
        "maxProperties": MAX_QUOTA_ENTRIES,
        "additionalProperties": quantity_value(),
        "x-kubernetes-validations": rules,
    })
}

/// `status.quotaSplit`: per namespace (at most 64, the most `namespaces` holds), at most
/// [`MAX_QUOTA_ENTRIES`] quantities. No rule is checked: the operator writes it, and a value
/// an administrator writes that does not parse only makes the split be made anew.
pub fn quota_split(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 64,
        "additionalProperties": {
            "type": "object",
            "maxProperties": MAX_QUOTA_ENTRIES,
            "additionalProperties": {"x-kubernetes-int-or-string": true},
        },
    })
}

/// `limits.default` / `limits.defaultRequest`: at most [`MAX_LIMIT_ENTRIES`] quantities ≥ 0,
/// keyed by a container resource (`cpu`, `memory`, `ephemeral-storage`, `hugepages-<size>`,
/// or an extended resource `<domain>/<name>`).
pub fn limit_map(_: &mut SchemaGenerator) -> Schema {
    let mut rules = key_rules("limits");
    rules.push(serde_json::json!({
        "rule": format!(
            "self.all(k, k in ['cpu', 'memory', 'ephemeral-storage'] || k.startsWith('hugepages-') || {})",
            extended("k")
        ),
        "message": "a limits key is a container resource: cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource <domain>/<name>",
    }));
    json_schema!({
        "type": "object",
        "maxProperties": MAX_LIMIT_ENTRIES,
        "additionalProperties": quantity_value(),
        "x-kubernetes-validations": rules,
    })
}

/// `env` of a TenantApp: at most 64 variables, names `[-._a-zA-Z][-._a-zA-Z0-9]*` of at most
/// 256 characters, not `.` and not starting with `..` (`IsEnvVarName`), values of at most 4096.
pub fn env(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 64,
        "additionalProperties": {"type": "string", "maxLength": 4096},
        "x-kubernetes-validations": [{
            "rule": "self.all(k, size(k) <= 256 && k.matches(r'^[-._a-zA-Z][-._a-zA-Z0-9]*$') && k != '.' && !k.startsWith('..'))",
            "message": "environment variable names consist of letters, digits, '_', '-' and '.', do not start with a digit, and are not '.' nor start with '..'",
        }],
    })
}

/// The most bytes of keys plus values a ConfigMap may hold (`validation.ValidateConfigMap`:
/// `core.MaxSecretSize`, 1 MiB).
pub const MAX_CONFIG_MAP_BYTES: usize = 1024 * 1024;

/// `config` of a TenantApp: at most 64 files, keys ConfigMap keys (`[-._a-zA-Z0-9]+`, at most
/// 253 characters, not `.` and not starting with `..`: `IsConfigMapKey`), contents of at most 16000 characters, and keys plus contents of at most
/// [`MAX_CONFIG_MAP_BYTES`] bytes in UTF-8 — the ConfigMap idem makes from them must pass the
/// API server's own size check (`maxLength` counts characters, and one character may take 4
/// bytes), or the app would be admitted and then fail on every reconcile.
pub fn config(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 64,
        "additionalProperties": {"type": "string", "maxLength": 16000},
        "x-kubernetes-validations": [{
            "rule": "self.all(k, size(k) <= 253 && k.matches(r'^[-._a-zA-Z0-9]+$') && k != '.' && !k.startsWith('..'))",
            "message": "config keys may hold only letters, digits, '-', '_' and '.', are not '.' nor start with '..', and have at most 253 characters (ConfigMap key rules)",
        }, {
            "rule": format!("self.map(k, size(k) + size(bytes(self[k]))).sum() <= {MAX_CONFIG_MAP_BYTES}"),
            "message": format!("config keys and contents may take at most {MAX_CONFIG_MAP_BYTES} bytes in UTF-8 (the size limit of a ConfigMap)"),
        }],
    })
}

/// Most labels, and most annotations, `namespaceMetadata` may set.
pub const MAX_NAMESPACE_METADATA: usize = 32;

/// Label and annotation keys a Tenant may not set on its namespaces: those in the domains
/// Kubernetes reserves for its own components and SIG projects (`kubernetes.io`, `k8s.io`,
/// `x-k8s.io` and their subdomains:
/// Pod Security's `pod-security.kubernetes.io/*`, `kubernetes.io/metadata.name`,
/// `app.kubernetes.io/managed-by`, …) and idem's own (`idem.dev` and its subdomains: the
/// operator's owner and shard labels). A CEL rule over key `k`, true when `k` is allowed.
pub fn unreserved_key(k: &str) -> String {
    format!(r"!{k}.matches(r'^([^/]*\.)?(kubernetes\.io|k8s\.io|x-k8s\.io|idem\.dev)/')")
}

/// The domains [`unreserved_key`] refuses, for messages and docs.
pub const RESERVED_KEY_DOMAINS: &str =
    "kubernetes.io, k8s.io, x-k8s.io, idem.dev and their subdomains";

/// Rules for the keys of `namespaceMetadata.labels` / `.annotations` (`what`): qualified
/// names outside the reserved domains.
fn metadata_key_rules(what: &str) -> Vec<serde_json::Value> {
    vec![
        serde_json::json!({
            "rule": format!("self.all(k, size(k) <= {MAX_RESOURCE_NAME_LENGTH} && k.matches(r'{QUALIFIED_NAME}') && k.matches(r'{SHORT_PREFIX}'))"),
            "message": format!("{what} keys are qualified names: a name or prefix/name"),
        }),
        serde_json::json!({
            "rule": format!("self.all(k, {})", unreserved_key("k")),
            "message": format!("{what} keys in {RESERVED_KEY_DOMAINS} are reserved for Kubernetes and idem: a tenant's namespaces may not set them"),
        }),
    ]
}

/// `namespaceMetadata.labels`: at most [`MAX_NAMESPACE_METADATA`] labels, keys as
/// [`unreserved_key`] allows, values label values (at most 63 characters of letters, digits,
/// `-`, `_` and `.`, starting and ending with a letter or digit; `IsValidLabelValue`).
pub fn namespace_labels(_: &mut SchemaGenerator) -> Schema {
    let mut rules = metadata_key_rules("label");
    rules.push(serde_json::json!({
        "rule": "self.all(k, self[k].matches(r'^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$'))",
        "message": "label values have at most 63 letters, digits, '-', '_' or '.', and start and end with a letter or digit",
    }));
    json_schema!({
        "type": "object",
        "maxProperties": MAX_NAMESPACE_METADATA,
        "additionalProperties": {"type": "string", "maxLength": 63},
        "x-kubernetes-validations": rules,
    })
}

/// `namespaceMetadata.annotations`: at most [`MAX_NAMESPACE_METADATA`] annotations, keys as
/// [`unreserved_key`] allows, values of at most 4096 characters (well under the API server's
/// 256 KiB for all of an object's annotations).
pub fn namespace_annotations(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": MAX_NAMESPACE_METADATA,
        "additionalProperties": {"type": "string", "maxLength": 4096},
        "x-kubernetes-validations": metadata_key_rules("annotation"),
    })
}

/// The name of a ClusterRole a Tenant binds: a path segment name (RBAC object names may hold
/// `:`, e.g. `system:aggregate-to-view`), without `/` or `%`, not `.` or `..`.
pub const CLUSTER_ROLE_NAME: &str = r"^[^/%]+$";

/// A DNS-1123 subdomain (at most 253 characters), as an RE2 pattern.
pub const DNS_SUBDOMAIN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A DNS-1123 label (at most 63 characters), as an RE2 pattern.
pub const DNS_LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// A container image reference, `[registry[:port]/]path[:tag][@digest]` (the grammar of
/// distribution's `reference` package): no spaces, lower-case path components, a tag of at
/// most 128 characters, a digest `algorithm:hex` of at least 32 hex digits.
pub const IMAGE_REFERENCE: &str = r"^(([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]+)?|\[[0-9a-fA-F:]+\](:[0-9]+)?)/)?[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$";

#[cfg(test)]
mod tests {
    use super::*;

    fn re(p: &str) -> regex::Regex {
        regex::Regex::new(p).unwrap()
    }

    #[test]
    fn image_references() {
        let image = re(IMAGE_REFERENCE);
        for good in [
            "nginx",
            "nginx:1.27",
            "docker.io/library/nginx:1.27",
            "registry.example.com:5000/team/app_x:v1.2-rc.3",
            "localhost/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "[::1]:5000/app:v1",
        ] {
            assert!(image.is_match(good), "{good}");
        }
        for bad in [
            "nginx:1.27 ",
            " nginx",
            "NOT A VALID IMAGE::@@",
            "Nginx",
            "nginx:",
            "nginx@sha256:abc",
            "a//b",
            "",
        ] {
            assert!(!image.is_match(bad), "{bad:?}");
        }
    }

    #[test]
    fn reserved_metadata_keys() {
        // The CEL rule's regex, checked with the same RE2 syntax.
        let rule = unreserved_key("k");
        let pattern = rule.split("r'").nth(1).unwrap().trim_end_matches("')");
        let reserved = re(pattern);
        for key in [
            "pod-security.kubernetes.io/enforce",
            "kubernetes.io/metadata.name",
            "app.kubernetes.io/managed-by",
            "k8s.io/x",
            "node.k8s.io/x",
            "tenancy.idem.dev/owner-uid",
            "idem.dev/x",
            "t1-dev.tree.hnc.x-k8s.io/depth",
        ] {
            assert!(reserved.is_match(key), "{key} must be reserved");
        }
        for key in [
            "team",
            "example.com/team",
            "kubernetes.io.example.com/x",
            "notidem.dev/x",
        ] {
            assert!(!reserved.is_match(key), "{key} must be allowed");
        }
    }

    #[test]
    fn qualified_names() {
        let q = re(QUALIFIED_NAME);
        for good in [
            "cpu",
            "count/pods",
            "requests.nvidia.com/gpu",
            "gold.storageclass.storage.k8s.io/requests.storage",
        ] {
            assert!(q.is_match(good), "{good}");
        }
        for bad in ["", "a b", "/x", "x/", "Foo.com/x", &"x".repeat(64)] {
            assert!(!q.is_match(bad), "{bad}");
        }
    }

    #[test]
    fn qualified_name_prefixes_have_at_most_253_characters() {
        let (q, short) = (re(QUALIFIED_NAME), re(SHORT_PREFIX));
        // Four 60-character labels and `.com`: 247; with `.example.com`, 255.
        let label = "a".repeat(60);
        let prefix = [label.as_str(); 4].join(".");
        let ok = format!("{prefix}.com/team");
        let long = format!("{prefix}.example.com/team");
        let longest = format!("{}/x", "a".repeat(253));
        for key in [ok.as_str(), longest.as_str(), "team", "example.com/team"] {
            assert!(q.is_match(key) && short.is_match(key), "{key}");
        }
        // A qualified name by its form, and short enough as a whole, but refused by the API
        // server: `prefix part must be no more than 253 bytes`.
        assert!(q.is_match(&long) && long.len() <= MAX_RESOURCE_NAME_LENGTH);
        assert!(!short.is_match(&long), "{long}");
        assert!(!short.is_match(&format!("{}/x", "a".repeat(254))));
    }
}
