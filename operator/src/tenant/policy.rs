//! A Tenant's `allowed` classes and registries and its cordon, enforced by the API server: one
//! ValidatingAdmissionPolicy and one binding for every tenant, parameterised by the
//! `TenantPolicy` the operator keeps in each tenant namespace.
//!
//! Who decides what:
//! - **Which namespaces.** The policy matches namespaced writes in namespaces labelled
//!   `app.kubernetes.io/managed-by=idem-operator` that carry `tenancy.idem.dev/owner-uid`:
//!   only those who may update Namespaces (cluster admins, the operator) set these; tenant
//!   owners cannot edit their Namespace objects.
//! - **Which rules.** The binding's parameter is the TenantPolicy [`PARAMS`] in the namespace
//!   of the request. It counts only while its `owner-uid` label equals the namespace's: a
//!   namespace or a TenantPolicy released by its Tenant (deleted with `deletionPolicy:
//!   Retain`, orphaned, or released by an administrator) loses that label, so a released
//!   namespace is never held by rules nobody maintains any more. A missing TenantPolicy
//!   (the moment between a namespace's creation and its contents', a namespace being deleted)
//!   is no restriction (`parameterNotFoundAction: Allow`): with `Deny`, a deleted parameter
//!   would freeze the namespace for Kubernetes' own controllers too, since a missing
//!   parameter is decided before any exemption is read.
//! - **Who is refused by a cordon.** Everyone but Kubernetes' own components keeping the
//!   namespace working ([`EXEMPT_USERS`], [`EXEMPT_GROUPS`]: kubelets, controller-manager,
//!   scheduler, kube-system ServiceAccounts, the API server and the `system:masters`
//!   superusers it runs as) and the operator: the tenant's owners, their ServiceAccounts and
//!   admins bound by RBAC (`cluster-admin`) alike (an admin lifts the cordon on the Tenant).
//!   Deletes are never refused. Allowed classes and registries apply to everyone,
//!   controllers included: the ReplicaSet controller's Pods are judged like a user's.
//! - **Changes to old objects.** An update is judged only on what it changes: an image, or a
//!   class, that the old object already had is not refused, so tightening the rules does not
//!   block the status, label or finalizer updates of what already runs.
//!
//! - **A quota not enforced.** A namespace whose `idem-quota` was created again (someone
//!   deleted it) is refused as by a cordon until the quota controller has counted it
//!   (`quotaNotEnforced`, set by [`super::quota_gate`]): until then quota admission limits
//!   nothing.
//!
//! A paused Tenant's TenantPolicies are left as they are (still enforced); its status keeps
//! saying what they enforce.

use idem_runtime::apply::{MANAGED_BY_LABEL, OWNER_UID_LABEL};
use idem_runtime::status::Readiness;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use crate::resources::tenant_policy::{TenantPolicy, TenantPolicySpec};
use crate::resources::{FIELD_MANAGER, GROUP, Tenant};

/// The name of the TenantPolicy in each tenant namespace, and of the ValidatingAdmissionPolicy
/// and its binding.
pub const PARAMS: &str = "idem-tenant-policy";

/// Users a cordon does not refuse (besides the operator's own): Kubernetes' components.
pub const EXEMPT_USERS: &[&str] = &[
    "system:kube-controller-manager",
    "system:kube-scheduler",
    "system:apiserver",
];

/// Groups a cordon does not refuse: the kubelets, the kube-system ServiceAccounts the
/// controller-manager's controllers run as, and `system:masters`, the superuser group that
/// bypasses authorization, which the API server's own loopback client uses (and, in some
/// clusters and idem's local control plane, the controller-manager and scheduler too).
pub const EXEMPT_GROUPS: &[&str] = &[
    "system:nodes",
    "system:serviceaccounts:kube-system",
    "system:masters",
];

/// The TenantPolicy of `tenant` in its namespace `ns`: its `allowed` and `cordoned`, and
/// whether the namespace's quota is not enforced yet ([`super::quota_gate`]).
pub fn parameters(tenant: &Tenant, ns: &str, quota_not_enforced: bool) -> TenantPolicy {
    TenantPolicy {
        metadata: ObjectMeta {
            name: Some(PARAMS.to_string()),
            namespace: Some(ns.to_string()),
            ..ObjectMeta::default()
        },
        spec: TenantPolicySpec {
            tenant: tenant.metadata.name.clone().unwrap_or_default(),
            cordoned: tenant.spec.cordoned,
            allowed: tenant.spec.allowed.clone(),
            quota_not_enforced,
        },
    }
}

/// A Ready tenant that is cordoned says so in its message.
pub fn readiness(tenant: &Tenant, readiness: Readiness) -> Readiness {
    match readiness {
        Readiness::Ready { reason, message } if tenant.spec.cordoned => Readiness::Ready {
            reason,
            message: format!(
                "{message}; cordoned: creates and updates in its namespaces are refused"
            ),
        },
        other => other,
    }
}

/// The annotation that named a claim's StorageClass before `spec.storageClassName`.
const BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// CEL: `i` (an image reference) as a full reference with its registry host, as container
/// runtimes read it: the first path component is the host when it contains a `.`, a `:` or
/// an upper-case letter, or is `localhost`; otherwise the image is on `docker.io`, under
/// `library/` when it has no path (`nginx` is `docker.io/library/nginx`).
fn normalised(i: &str) -> String {
    format!(
        "({i}.matches('^(localhost|[^/]*[.:A-Z][^/]*)/') ? {i} : ({i}.contains('/') ? 'docker.io/' + {i} : 'docker.io/library/' + {i}))"
    )
}

/// CEL: whether reference `n` is under registry entry `r`: below it (`r/...`) or, for an
/// entry with a path, that very repository with any tag or digest.
fn under(r: &str, n: &str) -> String {
    format!(
        "({n}.startsWith({r} + '/') || ({r}.contains('/') && ({n} == {r} || {n}.startsWith({r} + ':') || {n}.startsWith({r} + '@'))))"
    )
}

/// CEL: the images of every container, init container and ephemeral container of `obj`, and
/// of its image volumes (which the node pulls like a container's image).
fn images(obj: &str) -> String {
    let list = |field: &str| {
        format!("(has({obj}.spec.{field}) ? {obj}.spec.{field}.map(c, has(c.image), c.image) : [])")
    };
    format!(
        "{} + {} + {} + (has({obj}.spec.volumes) ? {obj}.spec.volumes.filter(v, has(v.image) && \
         has(v.image.reference)).map(v, v.image.reference) : [])",
        list("containers"),
        list("initContainers"),
        list("ephemeralContainers")
    )
}

/// CEL: whether image reference `i` names no repository: an image ID (`sha256:` and anything,
/// or hex alone, which a container runtime may take for the ID or a prefix of one of the
/// images it already holds, pulled by anyone from anywhere: it looks a prefix up whatever its
/// length, and `sha256:abcde` is no repository `sha256` with a tag to the kubelet either) or a
/// bare digest.
fn image_id(i: &str) -> String {
    format!(
        "({i}.startsWith('@') || {i}.startsWith('sha256:') || {i}.matches('^[0-9a-f]{{6,64}}$'))"
    )
}

/// CEL: the IngressClasses `obj` names (field and older annotation).
fn ingress_classes(obj: &str) -> String {
    let annotation = "kubernetes.io/ingress.class";
    format!(
        "(has({obj}.spec.ingressClassName) ? [{obj}.spec.ingressClassName] : []) + \
         (has({obj}.metadata.annotations) && '{annotation}' in {obj}.metadata.annotations ? \
         [{obj}.metadata.annotations['{annotation}']] : [])"
    )
}

/// CEL: `'Tenant <name> allows only <what> <list> (spec.allowed.<field>)`.
fn allows_only(what: &str, field: &str) -> String {
    format!(
        "'Tenant ' + params.spec.tenant + ' allows only {what} ' + \
         (size(params.spec.allowed.{field}) == 0 ? '(none)' : params.spec.allowed.{field}.join(', ')) + \
         ' (spec.allowed.{field})'"
    )
}

/// A validation of one class field of one kind: allowed when the tenant sets no list, the
/// object names no class (absent or `""`), names an allowed one, or keeps the old object's.
fn class_rule(kind: &str, what: &str, class_field: &str, field: &str) -> Value {
    let (object, old) = (
        format!("object.spec.{class_field}"),
        format!("oldObject.spec.{class_field}"),
    );
    json!({
        "expression": format!(
            "!variables.applies || !variables.{kind} || !has(params.spec.allowed) || \
             !has(params.spec.allowed.{field}) || !has({object}) || {object} == '' || \
             {object} in params.spec.allowed.{field} || (request.operation == 'UPDATE' && \
             has({old}) && {old} == {object})"
        ),
        "messageExpression": format!(
            "{} + '; ' + request.resource.resource + ' ' + object.metadata.name + ' names ' + {object}",
            allows_only(what, field)
        ),
        "reason": "Forbidden",
    })
}

/// The ValidatingAdmissionPolicy `idem-tenant-policy`; `operator` is the operator's user
/// name (its ServiceAccount's), which a cordon does not refuse.
pub fn admission_policy(operator: &str, labels: &Value) -> Value {
    let quoted = |names: &[&str]| {
        let q: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
        format!("[{}]", q.join(", "))
    };
    let mut users = EXEMPT_USERS.to_vec();
    users.push(operator);
    let applies = format!(
        "namespaceObject != null && has(namespaceObject.metadata.labels) && \
         '{OWNER_UID_LABEL}' in namespaceObject.metadata.labels && has(params.metadata.labels) && \
         '{OWNER_UID_LABEL}' in params.metadata.labels && \
         params.metadata.labels['{OWNER_UID_LABEL}'] == namespaceObject.metadata.labels['{OWNER_UID_LABEL}']"
    );
    let exempt = format!(
        "request.userInfo.username in {} || (has(request.userInfo.groups) && \
         request.userInfo.groups.exists(g, g in {}))",
        quoted(&users),
        quoted(EXEMPT_GROUPS)
    );
    let forbidden_images = format!(
        "has(params.spec.allowed) && has(params.spec.allowed.registries) ? \
         variables.images.filter(i, !(i in variables.oldImages) && ({} || \
         !params.spec.allowed.registries.exists(r, {}))) : []",
        image_id("i"),
        under("r", &normalised("i"))
    );
    json!({"apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": PARAMS, "labels": labels},
    "spec": {
        "failurePolicy": "Fail",
        "paramKind": {"apiVersion": format!("{GROUP}/v1alpha1"), "kind": "TenantPolicy"},
        "matchConstraints": {
            "namespaceSelector": {
                "matchLabels": {MANAGED_BY_LABEL: FIELD_MANAGER},
                "matchExpressions": [{"key": OWNER_UID_LABEL, "operator": "Exists"}],
            },
            "resourceRules": [{"apiGroups": ["*"], "apiVersions": ["*"],
                "resources": ["*/*"], "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}],
        },
        "variables": [
            {"name": "applies", "expression": applies},
            {"name": "exempt", "expression": exempt},
            {"name": "subresource", "expression": "has(request.subResource) ? request.subResource : ''"},
            {"name": "pod", "expression": "request.resource.group == '' && request.resource.resource == 'pods' && variables.subresource in ['', 'ephemeralcontainers']"},
            {"name": "podSpec", "expression": "request.resource.group == '' && request.resource.resource == 'pods' && variables.subresource == ''"},
            {"name": "claim", "expression": "request.resource.group == '' && request.resource.resource == 'persistentvolumeclaims' && variables.subresource == ''"},
            {"name": "ingress", "expression": "request.resource.group == 'networking.k8s.io' && request.resource.resource == 'ingresses' && variables.subresource == ''"},
            {"name": "images", "expression": images("object")},
            {"name": "oldImages", "expression": format!("request.operation == 'UPDATE' ? {} : []", images("oldObject"))},
            {"name": "forbiddenImages", "expression": forbidden_images},
            {"name": "ingressClasses", "expression": ingress_classes("object")},
            {"name": "oldIngressClasses", "expression": format!("request.operation == 'UPDATE' ? {} : []", ingress_classes("oldObject"))},
            // An update of an object being deleted that changes nothing but its finalizers
            // (and what the server keeps: resourceVersion, managedFields): finishing the
            // deletion. Its content, labels, annotations and references stay as they were.
            {"name": "finishesDeletion", "expression": "request.operation == 'UPDATE' && \
                has(oldObject.metadata.deletionTimestamp) && \
                object.all(k, k == 'metadata' || (k in oldObject && object[k] == oldObject[k])) && \
                oldObject.all(k, k == 'metadata' || k in object) && \
                ['labels', 'annotations', 'ownerReferences'].all(f, \
                    (f in object.metadata) == (f in oldObject.metadata) && \
                    (!(f in object.metadata) || object.metadata[f] == oldObject.metadata[f]))"},
        ],
        "validations": [
            // Finishing a deletion (a finalizer removed, nothing else changed) and evictions
            // are not refused: deletes are allowed, and a drain must work.
            {"expression": "!variables.applies || !params.spec.cordoned || variables.exempt || \
                variables.subresource == 'eviction' || variables.finishesDeletion",
             "messageExpression": "'Tenant ' + params.spec.tenant + ' is cordoned (spec.cordoned): ' + request.operation + ' of ' + request.resource.resource + ' in namespace ' + request.namespace + ' is refused; deletes are allowed'",
             "reason": "Forbidden"},
            // A quota created again limits nothing until the quota controller counts it.
            {"expression": "!variables.applies || !has(params.spec.quotaNotEnforced) || \
                !params.spec.quotaNotEnforced || variables.exempt || \
                variables.subresource == 'eviction' || variables.finishesDeletion",
             "messageExpression": "'the quota of namespace ' + request.namespace + ' is not enforced yet: ' + request.operation + ' of ' + request.resource.resource + ' is refused until the quota controller has counted it (seconds, unless it is down); deletes are allowed'",
             "reason": "Forbidden"},
            {"expression": "!variables.applies || !variables.pod || size(variables.forbiddenImages) == 0",
             "messageExpression": format!("{} + '; pod ' + object.metadata.name + ' has images from other registries: ' + variables.forbiddenImages.join(', ')",
                allows_only("images from the registries", "registries")),
             "reason": "Forbidden"},
            class_rule("podSpec", "the priority classes", "priorityClassName", "priorityClasses"),
            class_rule("podSpec", "the runtime classes", "runtimeClassName", "runtimeClasses"),
            class_rule("claim", "the storage classes", "storageClassName", "storageClasses"),
            // The older annotation, which Kubernetes and provisioners read before the field.
            {"expression": format!("!variables.applies || !variables.claim || !has(params.spec.allowed) || \
                !has(params.spec.allowed.storageClasses) || !has(object.metadata.annotations) || \
                !('{BETA_STORAGE_CLASS}' in object.metadata.annotations) || \
                object.metadata.annotations['{BETA_STORAGE_CLASS}'] in params.spec.allowed.storageClasses || \
                (request.operation == 'UPDATE' && has(oldObject.metadata.annotations) && \
                '{BETA_STORAGE_CLASS}' in oldObject.metadata.annotations && \
                oldObject.metadata.annotations['{BETA_STORAGE_CLASS}'] == object.metadata.annotations['{BETA_STORAGE_CLASS}'])"),
             "messageExpression": format!("{} + '; persistentvolumeclaim ' + object.metadata.name + ' names ' + object.metadata.annotations['{BETA_STORAGE_CLASS}'] + ' in annotation {BETA_STORAGE_CLASS}'",
                allows_only("the storage classes", "storageClasses")),
             "reason": "Forbidden"},
            {"expression": "!variables.applies || !variables.ingress || !has(params.spec.allowed) || \
                !has(params.spec.allowed.ingressClasses) || (size(variables.ingressClasses) > 0 && \
                variables.ingressClasses.all(c, c in params.spec.allowed.ingressClasses)) || \
                (request.operation == 'UPDATE' && variables.ingressClasses == variables.oldIngressClasses)",
             "messageExpression": format!("{} + '; ingress ' + object.metadata.name + (size(variables.ingressClasses) == 0 ? ' names no class' : ' names ' + variables.ingressClasses.join(', '))",
                allows_only("the ingress classes", "ingressClasses")),
             "reason": "Forbidden"},
        ],
    }})
}

/// The ValidatingAdmissionPolicyBinding of [`admission_policy`]: every tenant namespace, the
/// TenantPolicy [`PARAMS`] of the request's namespace as parameter.
pub fn admission_binding(labels: &Value) -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "ValidatingAdmissionPolicyBinding",
    "metadata": {"name": PARAMS, "labels": labels},
    "spec": {
        "policyName": PARAMS,
        "validationActions": ["Deny"],
        "paramRef": {"name": PARAMS, "parameterNotFoundAction": "Allow"},
    }})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::TenantSpec;
    use crate::resources::tenant_policy::{Allowed, Registry};

    #[test]
    fn the_parameters_copy_the_tenants_rules() {
        let mut tenant = Tenant::new(
            "acme",
            TenantSpec {
                cordoned: true,
                allowed: Some(Allowed {
                    registries: Some(vec![Registry::from("ghcr.io/acme")]),
                    ..Allowed::default()
                }),
                ..TenantSpec::default()
            },
        );
        let p = parameters(&tenant, "acme-dev", false);
        assert_eq!(p.metadata.namespace.as_deref(), Some("acme-dev"));
        assert_eq!(p.metadata.name.as_deref(), Some(PARAMS));
        assert_eq!(p.spec.tenant, "acme");
        assert!(p.spec.cordoned);
        let body = serde_json::to_value(&p.spec).unwrap();
        assert_eq!(
            body,
            json!({"tenant": "acme", "cordoned": true, "allowed": {"registries": ["ghcr.io/acme"]}})
        );
        tenant.spec.allowed = None;
        let body = serde_json::to_value(&parameters(&tenant, "acme-dev", false).spec).unwrap();
        assert_eq!(body, json!({"tenant": "acme", "cordoned": true}));
    }

    #[test]
    fn a_cordoned_ready_tenant_says_so() {
        let mut tenant = Tenant::new("acme", TenantSpec::default());
        let ready = || Readiness::Ready {
            reason: "Reconciled".into(),
            message: "1 namespaces".into(),
        };
        assert_eq!(readiness(&tenant, ready()), ready());
        tenant.spec.cordoned = true;
        match readiness(&tenant, ready()) {
            Readiness::Ready { message, .. } => assert!(message.contains("cordoned"), "{message}"),
            other => panic!("{other:?}"),
        }
    }
}
