//! Tenant helpers for the end-to-end tests: building specs, creating tenants, waiting on their
//! conditions, and checking that exactly the expected children exist with the expected content.

use std::collections::{BTreeMap, BTreeSet};

use idem_operator::resources::tenant::{
    DeletionPolicy, Limits, NamespaceMetadata, Owner, OwnerKind, Quota, ShortName,
    TenantRoleBinding,
};
use idem_operator::resources::{FIELD_MANAGER, FINALIZER, TENANT_LABEL, Tenant, TenantSpec};
use idem_operator::tenant::desired::{
    ISOLATION, LIMITS, NAMESPACE_NAME_LABEL, OWNER_ROLE, OWNERS, QUOTA, ROLE_BINDING_PREFIX,
};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{Api, ListParams, PostParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::{TIMEOUT, eventually, why};

/// The Tenant API.
pub fn api(client: &kube::Client) -> Api<Tenant> {
    Api::all(client.clone())
}

/// A map of quantities from string pairs.
pub fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect()
}

/// A spec using every feature: the given namespaces, a User and a Group owner, quota
/// `{cpu: 4, memory: 8Gi, pods: 20}`, default requests `{cpu: 100m, memory: 128Mi}`,
/// network isolation, and `deletionPolicy: Delete` (deleting it cleans up its namespaces).
pub fn full_spec(namespaces: &[&str]) -> TenantSpec {
    TenantSpec {
        owners: vec![
            Owner {
                kind: OwnerKind::User,
                name: "alice".into(),
                namespace: None,
            },
            Owner {
                kind: OwnerKind::Group,
                name: "admins".into(),
                namespace: None,
            },
        ],
        namespaces: namespaces.iter().map(|n| ShortName::from(*n)).collect(),
        quota: Some(Quota {
            hard: quantities(&[("cpu", "4"), ("memory", "8Gi"), ("pods", "20")]),
            ..Quota::default()
        }),
        limits: Some(Limits {
            default_request: quantities(&[("cpu", "100m"), ("memory", "128Mi")]),
            default: BTreeMap::new(),
        }),
        isolation: true,
        weight: 1,
        paused: false,
        deletion_policy: DeletionPolicy::Delete,
        role_bindings: vec![TenantRoleBinding {
            name: "readers".into(),
            cluster_role: "view".into(),
            subjects: vec![Owner {
                kind: OwnerKind::Group,
                name: "auditors".into(),
                namespace: None,
            }],
        }],
        namespace_metadata: Some(NamespaceMetadata {
            labels: [("team".to_string(), "payments".to_string())].into(),
            annotations: [("example.com/cost-center".to_string(), "42".to_string())].into(),
        }),
        allowed: None,
        cordoned: false,
    }
}

/// A Tenant named after `prefix` with one namespace, `apps` (the full spec), created and
/// Ready; returns that namespace's name.
pub async fn ready_apps_namespace(client: &kube::Client, prefix: &str) -> String {
    let tenant = idem_tests::unique_name(prefix);
    create(client, &tenant, full_spec(&["apps"])).await;
    wait_ready(client, &tenant).await;
    format!("{tenant}-apps")
}

/// Creates tenant `name` with `spec`.
///
/// # Panics
/// When the API server rejects it.
pub async fn create(client: &kube::Client, name: &str, spec: TenantSpec) -> Tenant {
    api(client)
        .create(&PostParams::default(), &Tenant::new(name, spec))
        .await
        .unwrap_or_else(|e| panic!("creating tenant {name}: {e}"))
}

/// The condition of `type_` in the tenant's status.
pub fn condition<'a>(tenant: &'a Tenant, type_: &str) -> Option<&'a Condition> {
    tenant
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// Whether the status describes the current generation (status and conditions).
fn observed_current(tenant: &Tenant) -> bool {
    let generation = tenant.metadata.generation;
    tenant.status.as_ref().and_then(|s| s.observed_generation) == generation
        && tenant
            .status
            .iter()
            .flat_map(|s| &s.conditions)
            .all(|c| c.observed_generation == generation)
}

/// Waits until tenant `name` has condition `type_` = `"True"` with `reason`, for its current
/// generation, and returns it.
///
/// # Panics
/// After [`TIMEOUT`], with the last status seen.
pub async fn wait_condition(
    client: &kube::Client,
    name: &str,
    type_: &str,
    reason: &str,
) -> Tenant {
    let tenants = api(client);
    eventually(
        &format!("tenant {name} {type_}=True ({reason})"),
        TIMEOUT,
        || async {
            let t = tenants.get(name).await.map_err(why)?;
            match condition(&t, type_) {
                Some(c) if c.status == "True" && c.reason == reason && observed_current(&t) => {
                    Ok(t)
                }
                _ => Err(format!("{:?}", t.status)),
            }
        },
    )
    .await
}

/// Pauses tenant `name` and waits until the operator says so (`Stalled`, reason `Paused`).
pub async fn pause(client: &kube::Client, name: &str) -> Tenant {
    api(client)
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"paused": true}})),
        )
        .await
        .unwrap();
    wait_condition(client, name, "Stalled", "Paused").await
}

/// Waits until tenant `name` is `Ready` (reason `Reconciled`) at its current generation.
pub async fn wait_ready(client: &kube::Client, name: &str) -> Tenant {
    wait_condition(client, name, "Ready", "Reconciled").await
}

/// Lists every object of kind `K` in the cluster labelled as belonging to tenant `name`.
///
/// # Panics
/// When the list fails.
pub async fn labelled<K>(client: &kube::Client, name: &str) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    Api::<K>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{TENANT_LABEL}={name}")))
        .await
        .unwrap_or_else(|e| panic!("listing {}: {e}", K::kind(&())))
        .items
}

/// The `namespace/name` of each object, sorted (a multiset: duplicates stay visible).
pub fn keys<K: Resource>(objects: &[K]) -> Vec<String> {
    let mut keys: Vec<String> = objects
        .iter()
        .map(|o| {
            let m = o.meta();
            format!(
                "{}/{}",
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    keys.sort();
    keys
}

/// Checks that `meta` is the tenant's child: our labels and exactly one controller
/// ownerReference, to this tenant's uid.
///
/// # Panics
/// When it is not.
pub fn assert_owned(meta: &ObjectMeta, tenant: &Tenant) {
    let what = meta.name.as_deref().unwrap_or_default();
    let labels = meta.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get(TENANT_LABEL).map(String::as_str),
        tenant.metadata.name.as_deref(),
        "{what}: tenant label"
    );
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some(FIELD_MANAGER),
        "{what}: managed-by label"
    );
    let controllers: Vec<_> = meta
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.controller == Some(true))
        .collect();
    assert_eq!(controllers.len(), 1, "{what}: one controller reference");
    assert_eq!(
        Some(&controllers[0].uid),
        tenant.metadata.uid.as_ref(),
        "{what}: controlled by the tenant"
    );
    assert_eq!(controllers[0].kind, "Tenant", "{what}");
}

/// Lists the namespaced children of kind `K` labelled for tenant `name` and checks they are
/// exactly one object named `child` in each of `namespaces`.
async fn exactly_one_each<K>(
    client: &kube::Client,
    tenant: &Tenant,
    namespaces: &[String],
    child: &str,
) -> Vec<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    exactly_each(client, tenant, namespaces, &[child]).await
}

/// As [`exactly_one_each`], with one object of each name in `children` per namespace.
async fn exactly_each<K>(
    client: &kube::Client,
    tenant: &Tenant,
    namespaces: &[String],
    children: &[&str],
) -> Vec<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let objects: Vec<K> = labelled(client, &tenant.name_any()).await;
    let mut expected: Vec<String> = namespaces
        .iter()
        .flat_map(|ns| children.iter().map(move |child| format!("{ns}/{child}")))
        .collect();
    expected.sort();
    assert_eq!(keys(&objects), expected, "{} children", K::kind(&()));
    for o in &objects {
        assert_owned(o.meta(), tenant);
    }
    objects
}

/// Checks that the cluster holds exactly the children [`full_spec`] asks for — for each of
/// the tenant's namespaces, one Namespace (with the spec's labels and annotations), one quota,
/// one LimitRange, the owners' and the readers' RoleBindings and one NetworkPolicy, nothing else labelled for the tenant — with the spec's content, and that the
/// tenant's status and finalizers match. `shorts` are the expected short names.
///
/// # Panics
/// On the first difference.
pub async fn assert_full_children(client: &kube::Client, tenant: &Tenant, shorts: &[&str]) {
    let name = tenant.name_any();
    let mut expected: Vec<String> = shorts.iter().map(|s| format!("{name}-{s}")).collect();
    expected.sort();

    let namespaces: Vec<Namespace> = labelled(client, &name).await;
    let mut names: Vec<String> = namespaces.iter().map(|n| n.name_any()).collect();
    names.sort();
    assert_eq!(names, expected, "namespaces of {name}");
    for ns in &namespaces {
        assert_owned(&ns.metadata, tenant);
        assert!(
            ns.metadata.deletion_timestamp.is_none(),
            "{}",
            ns.name_any()
        );
    }

    let spec = full_spec(shorts);
    let metadata = spec.namespace_metadata.clone().unwrap();
    for ns in &namespaces {
        let (labels, annotations) = (ns.labels(), ns.annotations());
        for (k, v) in &metadata.labels {
            assert_eq!(labels.get(k), Some(v), "label {k} of {}", ns.name_any());
        }
        for (k, v) in &metadata.annotations {
            assert_eq!(
                annotations.get(k),
                Some(v),
                "annotation {k} of {}",
                ns.name_any()
            );
        }
    }
    for quota in exactly_one_each::<ResourceQuota>(client, tenant, &expected, QUOTA).await {
        let hard = quota.spec.and_then(|s| s.hard).unwrap_or_default();
        assert_eq!(hard, spec.quota.clone().unwrap().hard, "quota hard");
    }
    for limits in exactly_one_each::<LimitRange>(client, tenant, &expected, LIMITS).await {
        let items = limits.spec.map(|s| s.limits).unwrap_or_default();
        assert_eq!(items.len(), 1, "one LimitRange item");
        assert_eq!(items[0].type_, "Container");
        assert_eq!(
            items[0].default_request.clone().unwrap_or_default(),
            spec.limits.clone().unwrap().default_request,
            "LimitRange defaultRequest"
        );
    }
    let readers = format!("{ROLE_BINDING_PREFIX}readers");
    let bindings = [OWNERS, readers.as_str()];
    for binding in exactly_each::<RoleBinding>(client, tenant, &expected, &bindings).await {
        assert_eq!(binding.role_ref.kind, "ClusterRole");
        let subjects: BTreeSet<(String, String)> = binding
            .subjects
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|s| (s.kind, s.name))
            .collect();
        let (role, want) = if binding.name_any() == OWNERS {
            let owners = BTreeSet::from([
                ("User".to_string(), "alice".to_string()),
                ("Group".to_string(), "admins".to_string()),
            ]);
            (OWNER_ROLE, owners)
        } else {
            let auditors = BTreeSet::from([("Group".to_string(), "auditors".to_string())]);
            ("view", auditors)
        };
        assert_eq!(binding.role_ref.name, role, "{}", binding.name_any());
        assert_eq!(subjects, want, "subjects of {}", binding.name_any());
    }
    for policy in exactly_one_each::<NetworkPolicy>(client, tenant, &expected, ISOLATION).await {
        let spec = policy.spec.expect("NetworkPolicy spec");
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        let ingress = spec.ingress.unwrap_or_default();
        assert_eq!(ingress.len(), 1, "one ingress rule");
        let peers = ingress[0].from.clone().unwrap_or_default();
        assert_eq!(peers.len(), 1, "one peer");
        let selector = peers[0].namespace_selector.clone().unwrap_or_default();
        assert_eq!(
            selector.match_labels, None,
            "no forgeable label in the selector"
        );
        let requirements = selector.match_expressions.unwrap_or_default();
        assert_eq!(requirements.len(), 1, "{requirements:?}");
        assert_eq!(requirements[0].key, NAMESPACE_NAME_LABEL);
        assert_eq!(requirements[0].operator, "In");
        assert_eq!(
            requirements[0].values.clone().unwrap_or_default(),
            expected,
            "peer selects exactly the tenant's namespaces"
        );
    }

    let status = tenant.status.clone().expect("a status");
    assert_eq!(status.namespaces, expected, "status.namespaces");
    assert_eq!(status.namespace_count as usize, expected.len());
    let types: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
    let mut sorted = types.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["Ready", "Reconciling", "Stalled"],
        "one of each condition"
    );
    assert_eq!(
        tenant.finalizers(),
        [FINALIZER.to_string()],
        "exactly one finalizer"
    );
}

/// Waits until no namespace labelled for tenant `name` is left and the Tenant itself is gone.
///
/// # Panics
/// After [`TIMEOUT`].
pub async fn wait_gone(client: &kube::Client, name: &str) {
    let tenants = api(client);
    eventually(&format!("tenant {name} gone"), TIMEOUT, || async {
        let left: Vec<Namespace> = labelled(client, name).await;
        let tenant = tenants.get_opt(name).await.map_err(why)?;
        if left.is_empty() && tenant.is_none() {
            Ok(())
        } else {
            Err(format!(
                "namespaces {:?}, tenant {:?}",
                keys(&left),
                tenant.map(|t| t.status)
            ))
        }
    })
    .await;
}

/// Waits until the Tenant object `name` is gone (whatever happened to its namespaces).
pub async fn wait_tenant_object_gone(client: &kube::Client, name: &str) {
    let tenants = api(client);
    eventually(&format!("tenant {name} deleted"), TIMEOUT, || async {
        match tenants.get_opt(name).await.map_err(why)? {
            None => Ok(()),
            Some(t) => Err(format!("{:?} {:?}", t.metadata.finalizers, t.status)),
        }
    })
    .await;
}

/// Checks that namespace `name` exists, is not being deleted, and carries no ownerReference
/// to `uid`; returns it.
///
/// # Panics
/// When it does not hold.
pub async fn assert_retained(client: &kube::Client, name: &str, uid: &str) -> Namespace {
    let ns = Api::<Namespace>::all(client.clone())
        .get_opt(name)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("namespace {name} was deleted"));
    assert!(
        ns.metadata.deletion_timestamp.is_none(),
        "namespace {name} is being deleted"
    );
    let refs = ns.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        refs.iter().all(|r| r.uid != uid),
        "namespace {name} still refers to the deleted tenant: {refs:?}"
    );
    ns
}

/// The Events of kind `reason` about Tenant `name` (events.k8s.io, any namespace).
pub async fn events_about(
    client: &kube::Client,
    name: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    Api::<k8s_openapi::api::events::v1::Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("Tenant") && r.name.as_deref() == Some(name)
                })
        })
        .collect()
}

/// Waits for a `Retained` Event about Tenant `tenant` whose note names `namespace`; returns
/// the note.
///
/// # Panics
/// When none comes within [`TIMEOUT`].
pub async fn wait_retained_note(client: &kube::Client, tenant: &str, namespace: &str) -> String {
    let events = eventually("a Retained event", TIMEOUT, || async {
        let events: Vec<_> = events_about(client, tenant, "Retained")
            .await
            .into_iter()
            .filter(|e| e.note.as_deref().is_some_and(|n| n.contains(namespace)))
            .collect();
        if events.is_empty() {
            Err("none yet".to_string())
        } else {
            Ok(events)
        }
    })
    .await;
    events[0].note.clone().unwrap_or_default()
}
