//! A Tenant's `allowed` classes and registries and its `cordoned`, enforced by the shipped
//! ValidatingAdmissionPolicy `idem-tenant-policy` (`deploy/operator/07-tenant-policy.yaml`)
//! on the real control plane, with the operator running as its own ServiceAccount (the
//! shipped ClusterRole and the policy that confines its writes apply to it): refusals name
//! the tenant's rule, Kubernetes' components and the operator keep working in a cordoned
//! namespace, owners can neither change their rules nor escape them, and a namespace released
//! by its deleted Tenant is free again; and with no operator at all, the API server alone
//! enforces a TenantPolicy.

mod common;

use common::deployed::{OPERATOR, install};
use common::tenants::{self, api};
use common::users::client_as;
use common::{TIMEOUT, eventually, why};
use idem_operator::resources::tenant::{DeletionPolicy, Owner, OwnerKind};
use idem_operator::resources::tenant_policy::{Allowed, ClassName, Registry};
use idem_operator::resources::{TenantPolicy, TenantSpec};
use idem_operator::tenant::policy::PARAMS;
use idem_runtime::apply::OWNER_UID_LABEL;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The operator's user name: its ServiceAccount in the shipped manifests.
const OPERATOR_USER: &str = OPERATOR;

/// A client as `user` in `groups` (impersonated by the admin).
fn client_as_in(user: &str, groups: &[&str]) -> kube::Client {
    let mut config = idem_tests::shared().config();
    config.auth_info.impersonate = Some(user.into());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    kube::Client::try_from(config).expect("an impersonating client")
}

/// Binds ClusterRole `role` to `subject` (a group when it starts with `system:` and has no
/// further `:`-separated name, else a user), in namespace `ns` or cluster-wide.
async fn bind(admin: &kube::Client, ns: Option<&str>, subject: &str, role: &str) {
    let group = matches!(
        subject,
        "system:nodes" | "system:serviceaccounts:kube-system" | "system:masters"
    );
    let name = format!(
        "test-{}",
        subject.replace(':', "-").trim_start_matches("system-")
    );
    let body = json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io",
            "kind": if group { "Group" } else { "User" }, "name": subject}],
    });
    let pp = PatchParams::apply("idem-e2e").force();
    match ns {
        Some(ns) => {
            Api::<RoleBinding>::namespaced(admin.clone(), ns)
                .patch(&name, &pp, &Patch::Apply(&with_kind(body, "RoleBinding")))
                .await
                .unwrap();
        }
        None => {
            Api::<ClusterRoleBinding>::all(admin.clone())
                .patch(
                    &name,
                    &pp,
                    &Patch::Apply(&with_kind(body, "ClusterRoleBinding")),
                )
                .await
                .unwrap();
        }
    }
}

fn with_kind(mut body: Value, kind: &str) -> Value {
    body["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
    body["kind"] = json!(kind);
    body
}

/// A spec with one namespace `dev`, user `owner` as owner, and the given rules.
fn spec(owner: &str, allowed: Option<Allowed>, cordoned: bool) -> TenantSpec {
    TenantSpec {
        owners: vec![Owner {
            kind: OwnerKind::User,
            name: owner.into(),
            namespace: None,
        }],
        namespaces: vec!["dev".into()],
        weight: 1,
        deletion_policy: DeletionPolicy::Delete,
        allowed,
        cordoned,
        ..TenantSpec::default()
    }
}

/// Merge-patches tenant `name`'s spec with `patch` (as the admin).
async fn patch_spec(name: &str, patch: Value) {
    api(&idem_tests::shared().client())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": patch})),
        )
        .await
        .unwrap();
}

/// Creates `body` as `client` in `ns`, for real or as a server-side dry run.
async fn create<K>(client: &kube::Client, ns: &str, body: Value, dry_run: bool) -> kube::Result<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    K: Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let pp = PostParams {
        dry_run,
        ..PostParams::default()
    };
    Api::<K>::namespaced(client.clone(), ns)
        .create(&pp, &serde_json::from_value(body).unwrap())
        .await
}

/// How the API server names a refusal by the tenant policy.
fn by_policy() -> String {
    format!("ValidatingAdmissionPolicy '{PARAMS}'")
}

/// The policy's refusal message in `result`, or why it is not one.
fn refusal<T: std::fmt::Debug>(result: kube::Result<T>) -> Result<String, String> {
    match result {
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains(&by_policy()) => {
            Ok(e.message)
        }
        other => Err(format!("not refused by {PARAMS}: {other:?}")),
    }
}

/// Waits until `attempt` is refused by the tenant policy (it takes effect once the API server
/// has loaded the policy, the binding and the TenantPolicy); returns the message.
async fn wait_refused<T, F, Fut>(what: &str, mut attempt: F) -> String
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    eventually(what, TIMEOUT, || {
        let fut = attempt();
        async move { refusal(fut.await) }
    })
    .await
}

/// Waits until `attempt` succeeds; returns its value.
async fn wait_admitted<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    eventually(what, TIMEOUT, || {
        let fut = attempt();
        async move { fut.await.map_err(why) }
    })
    .await
}

/// A Pod of one container per image (the first a container, the rest init containers).
fn pod(name: &str, images: &[&str], extra: Value) -> Value {
    let container = |i: usize, image: &str| json!({"name": format!("c{i}"), "image": image});
    let mut spec = json!({
        "containers": [container(0, images[0])],
        "initContainers": images[1..].iter().enumerate().map(|(i, im)| container(i + 1, im)).collect::<Vec<_>>(),
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

fn allowed_rules() -> Allowed {
    let classes = |names: &[&str]| Some(names.iter().map(|n| ClassName::from(*n)).collect());
    Allowed {
        storage_classes: classes(&["standard"]),
        ingress_classes: classes(&["public"]),
        priority_classes: classes(&[]),
        runtime_classes: None,
        registries: Some(vec![
            Registry::from("docker.io/library"),
            Registry::from("ghcr.io/acme"),
            Registry::from("localhost:5000/team/app"),
        ]),
    }
}

/// A Tenant named after `prefix` whose `allowed` is [`allowed_rules`], once its policy is
/// loaded (a pod from a registry it does not allow is refused): the admin's client, the
/// Tenant's name, its `dev` namespace, its owner's client and that refusal's message.
async fn tenant_with_allowed_rules(
    prefix: &str,
) -> (kube::Client, String, String, kube::Client, String) {
    common::deployed::operator_as_its_account().await;
    let admin = idem_tests::shared().client();
    let name = idem_tests::unique_name(prefix);
    let owner_name = format!("owner-{name}");
    tenants::create(
        &admin,
        &name,
        spec(&owner_name, Some(allowed_rules()), false),
    )
    .await;
    tenants::wait_ready(&admin, &name).await;
    let ns = format!("{name}-dev");
    let owner = client_as(&owner_name);
    let message = wait_refused("a pod from quay.io refused", || {
        create::<Pod>(
            &owner,
            &ns,
            pod("evil", &["quay.io/evil/miner:1"], json!({})),
            true,
        )
    })
    .await;
    (admin, name, ns, owner, message)
}

#[tokio::test(flavor = "multi_thread")]
async fn forbidden_registries_and_classes_are_refused_naming_the_tenants_rule() {
    // A forbidden registry, refused with the tenant's rule once the policy is loaded.
    let (admin, name, ns, owner, message) = tenant_with_allowed_rules("allow").await;
    for part in [
        &format!("Tenant {name} allows only images from the registries"),
        "docker.io/library, ghcr.io/acme, localhost:5000/team/app (spec.allowed.registries)",
        "quay.io/evil/miner:1",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    // A forbidden class (the list is empty: no priority class at all).
    let message = refusal(
        create::<Pod>(
            &owner,
            &ns,
            pod(
                "critical",
                &["nginx"],
                json!({"priorityClassName": "system-cluster-critical"}),
            ),
            true,
        )
        .await,
    )
    .unwrap();
    for part in [
        &format!(
            "Tenant {name} allows only the priority classes (none) (spec.allowed.priorityClasses)"
        ),
        "names system-cluster-critical",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }

    // How an image reference maps to a registry.
    let refused = [
        "quay.io/acme/app",
        "ghcr.io/acme-evil/app",    // a prefix only at a path boundary
        "ghcr.io/acmeapp:1",        // ditto
        "someone/nginx",            // docker.io/someone/nginx
        "Evil/nginx",               // an upper-case first component is a host
        "localhost/team/app",       // another host than localhost:5000
        "localhost:5000/team/app2", // another repository
        "docker.io:443/library/nginx",
        "index.docker.io/library/nginx",
    ];
    let admitted = [
        "nginx",      // docker.io/library/nginx
        "nginx:1.25", // with a tag
        "library/nginx@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "docker.io/library/busybox",
        "ghcr.io/acme/app:2",
        "ghcr.io/acme/team/app",
        "localhost:5000/team/app", // the entry is the repository itself
        "localhost:5000/team/app:3",
        "localhost:5000/team/app/sub",
    ];
    for image in refused {
        let result = create::<Pod>(&owner, &ns, pod("p", &["nginx", image], json!({})), true).await;
        let message = refusal(result).unwrap_or_else(|e| panic!("{image}: {e}"));
        assert!(message.contains(image), "{image} not named in {message}");
    }
    for image in admitted {
        create::<Pod>(&owner, &ns, pod("p", &[image], json!({})), true)
            .await
            .unwrap_or_else(|e| panic!("{image} refused: {e}"));
    }

    // Storage and ingress classes.
    let claim = |class: Option<&str>| {
        let mut spec = json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}});
        if let Some(c) = class {
            spec["storageClassName"] = json!(c);
        }
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"}, "spec": spec})
    };
    let message =
        refusal(create::<PersistentVolumeClaim>(&owner, &ns, claim(Some("fast")), true).await)
            .unwrap();
    assert!(
        message.contains("allows only the storage classes standard (spec.allowed.storageClasses)")
            && message.contains("names fast"),
        "{message}"
    );
    create::<PersistentVolumeClaim>(&owner, &ns, claim(Some("standard")), true)
        .await
        .unwrap();
    create::<PersistentVolumeClaim>(&owner, &ns, claim(None), true)
        .await
        .unwrap();
    let ingress = |class: Option<&str>, annotation: Option<&str>| {
        let mut body = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "web"},
            "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}});
        if let Some(c) = class {
            body["spec"]["ingressClassName"] = json!(c);
        }
        if let Some(a) = annotation {
            body["metadata"]["annotations"] = json!({"kubernetes.io/ingress.class": a});
        }
        body
    };
    for (class, annotation, expect) in [
        (Some("internal"), None, "names internal"),
        (None, None, "names no class"),
        (None, Some("internal"), "names internal"),
    ] {
        let message =
            refusal(create::<Ingress>(&owner, &ns, ingress(class, annotation), true).await)
                .unwrap();
        assert!(
            message
                .contains("allows only the ingress classes public (spec.allowed.ingressClasses)")
                && message.contains(expect),
            "{message}"
        );
    }
    create::<Ingress>(&owner, &ns, ingress(Some("public"), None), true)
        .await
        .unwrap();
    create::<Ingress>(&owner, &ns, ingress(None, Some("public")), true)
        .await
        .unwrap();

    // An allowed pod is admitted, for real.
    let good: Pod = create(
        &owner,
        &ns,
        pod("good", &["nginx:1.25", "ghcr.io/acme/init:1"], json!({})),
        false,
    )
    .await
    .unwrap();

    // Ephemeral containers (added through their subresource, which `admin` does not grant)
    // are judged too, and the registries bind everyone, a superuser included.
    let ephemeral = |image: &str| {
        Patch::Strategic(json!({"spec": {"ephemeralContainers": [
            {"name": format!("debug-{}", image.len()), "image": image}]}}))
    };
    let pods = Api::<Pod>::namespaced(admin.clone(), &ns);
    let message = refusal(
        pods.patch_subresource(
            "ephemeralcontainers",
            "good",
            &PatchParams::default(),
            &ephemeral("quay.io/evil/debug:1"),
        )
        .await,
    )
    .unwrap();
    assert!(message.contains("quay.io/evil/debug:1"), "{message}");
    pods.patch_subresource(
        "ephemeralcontainers",
        "good",
        &PatchParams::default(),
        &ephemeral("busybox"),
    )
    .await
    .expect("an ephemeral container from an allowed registry");

    // Tightening the rules does not block updates of what already runs (its images are
    // unchanged), only what is new.
    patch_spec(
        &name,
        json!({"allowed": {"registries": ["docker.io/library"]}}),
    )
    .await;
    wait_refused("ghcr.io/acme refused after the change", || {
        create::<Pod>(
            &owner,
            &ns,
            pod("p", &["ghcr.io/acme/init:1"], json!({})),
            true,
        )
    })
    .await;
    Api::<Pod>::namespaced(owner.clone(), &ns)
        .patch(
            &good.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .expect("a label change of a pod whose images were allowed when it was made");

    // Removing the rules lifts them.
    patch_spec(&name, json!({"allowed": null})).await;
    wait_admitted("quay.io admitted once the rules are removed", || {
        create::<Pod>(
            &owner,
            &ns,
            pod("p", &["quay.io/evil/miner:1"], json!({})),
            true,
        )
    })
    .await;
    tenants::wait_ready(&admin, &name).await;
}

fn config_map(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cordon_refuses_owners_and_admins_but_not_kubernetes_nor_the_operator() {
    common::deployed::operator_as_its_account().await;
    let admin = idem_tests::shared().client();
    let name = idem_tests::unique_name("cordon");
    let owner_name = format!("owner-{name}");
    let ns = format!("{name}-dev");
    let mut tenant_spec = spec(&owner_name, None, false);
    // The owners' ServiceAccount, in the tenant's own namespace.
    tenant_spec.owners.push(Owner {
        kind: OwnerKind::ServiceAccount,
        name: "ci".into(),
        namespace: Some(ns.clone()),
    });
    tenants::create(&admin, &name, tenant_spec).await;
    let tenant = tenants::wait_ready(&admin, &name).await;
    assert!(!tenant.status.unwrap().cordoned);
    let owner = client_as(&owner_name);
    let ci = client_as_in(
        &format!("system:serviceaccount:{ns}:ci"),
        &[
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{ns}"),
            "system:authenticated",
        ],
    );
    let config_maps = Api::<ConfigMap>::namespaced(owner.clone(), &ns);
    create::<ConfigMap>(&owner, &ns, config_map("kept"), false)
        .await
        .unwrap();
    create::<ConfigMap>(&owner, &ns, config_map("scratch"), false)
        .await
        .unwrap();
    // One with a finalizer of the owner's: deleting it while cordoned must be able to finish.
    let mut held = config_map("held");
    held["metadata"]["finalizers"] = json!(["example.com/cleanup"]);
    create::<ConfigMap>(&owner, &ns, held, false).await.unwrap();
    // A Deployment whose Pod the ReplicaSet controller must be able to replace while cordoned.
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}});
    create::<Deployment>(&owner, &ns, deployment, false)
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(admin.clone(), &ns);
    let scheduled = || async {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map_err(why)?;
        list.items
            .into_iter()
            .find(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
            })
            .ok_or_else(|| "no scheduled pod".to_string())
    };
    let first = eventually("the Deployment's pod scheduled", TIMEOUT, scheduled).await;

    patch_spec(&name, json!({"cordoned": true})).await;
    let tenant = tenants::wait_ready(&admin, &name).await;
    let status = tenant.status.clone().unwrap();
    assert!(status.cordoned, "{status:?}");
    let ready = tenants::condition(&tenant, "Ready").unwrap();
    assert!(ready.message.contains("cordoned"), "{ready:?}");

    // The owner is refused, naming the tenant's rule.
    let message = wait_refused("the owner's create refused", || {
        create::<ConfigMap>(&owner, &ns, config_map("new"), true)
    })
    .await;
    assert!(
        message.contains(&format!("Tenant {name} is cordoned (spec.cordoned)"))
            && message.contains("CREATE of configmaps"),
        "{message}"
    );
    // Updates too, by the owner, the owners' ServiceAccount and a cluster admin.
    let update = Patch::Merge(json!({"data": {"k": "changed"}}));
    let message = refusal(
        config_maps
            .patch("kept", &PatchParams::default(), &update)
            .await,
    )
    .unwrap();
    assert!(message.contains("UPDATE of configmaps"), "{message}");
    refusal(create::<ConfigMap>(&ci, &ns, config_map("new"), true).await).unwrap();
    // An admin bound to cluster-admin (not in the superuser group system:masters) is refused.
    let admin_user = format!("admin-{name}");
    bind(&admin, None, &admin_user, "cluster-admin").await;
    let cluster_admin = client_as_in(&admin_user, &["system:authenticated"]);
    wait_refused("a cluster-admin's create refused", || {
        create::<ConfigMap>(&cluster_admin, &ns, config_map("new"), true)
    })
    .await;
    // Deletes are allowed, and so is finishing one: removing the last finalizer of an object
    // being deleted is an update, which a cordon does not refuse.
    config_maps
        .delete("scratch", &DeleteParams::default())
        .await
        .expect("deletes are not refused");
    config_maps
        .delete("held", &DeleteParams::default())
        .await
        .expect("deletes are not refused");
    // Only finishing it: a change of its content, alone or beside the finalizer's removal,
    // is refused like any update.
    for change in [
        json!({"data": {"k": "changed"}}),
        json!({"metadata": {"finalizers": null, "labels": {"k": "changed"}}}),
        json!({"metadata": {"finalizers": null}, "data": {"k": "changed"}}),
    ] {
        let message = refusal(
            config_maps
                .patch("held", &PatchParams::default(), &Patch::Merge(&change))
                .await,
        )
        .unwrap_or_else(|e| panic!("{change} on an object being deleted: {e}"));
        assert!(message.contains("UPDATE of configmaps"), "{message}");
    }
    config_maps
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("a finalizer removed from an object being deleted is not refused");
    eventually("the held ConfigMap gone", TIMEOUT, || async {
        match config_maps.get_opt("held").await.map_err(why)? {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;

    // Kubernetes' components are not refused: by identity (each given `edit` here by RBAC,
    // none of them in system:masters) …
    bind(&admin, Some(&ns), "system:nodes", "edit").await;
    bind(
        &admin,
        Some(&ns),
        "system:serviceaccounts:kube-system",
        "edit",
    )
    .await;
    for user in [
        "system:kube-controller-manager",
        "system:kube-scheduler",
        "system:apiserver",
    ] {
        bind(&admin, Some(&ns), user, "edit").await;
    }
    for (user, groups) in [
        (
            "system:kube-controller-manager",
            vec!["system:authenticated"],
        ),
        ("system:kube-scheduler", vec!["system:authenticated"]),
        ("system:apiserver", vec!["system:authenticated"]),
        (
            "system:serviceaccount:kube-system:replicaset-controller",
            vec![
                "system:serviceaccounts",
                "system:serviceaccounts:kube-system",
            ],
        ),
        (
            "system:node:some-node",
            vec!["system:nodes", "system:authenticated"],
        ),
        ("someone", vec!["system:masters"]),
        (OPERATOR_USER, vec!["system:serviceaccounts"]),
    ] {
        let client = client_as_in(user, &groups);
        wait_admitted(&format!("{user} admitted"), || {
            create::<ConfigMap>(&client, &ns, config_map("component"), true)
        })
        .await;
    }
    // … and at work: a deleted pod is replaced by the ReplicaSet controller and scheduled.
    Api::<Pod>::namespaced(owner.clone(), &ns)
        .delete(&first.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    eventually("a replacement pod scheduled", TIMEOUT, || async {
        let pod = scheduled().await?;
        if pod.uid() == first.uid() {
            Err("still the first pod".to_string())
        } else {
            Ok(())
        }
    })
    .await;
    // The operator still keeps its children: a deleted RoleBinding comes back.
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .delete("idem-owners", &DeleteParams::default())
        .await
        .unwrap();
    eventually("idem-owners recreated by the operator", TIMEOUT, || async {
        Api::<RoleBinding>::namespaced(admin.clone(), &ns)
            .get_opt("idem-owners")
            .await
            .map_err(why)?
            .filter(|b| b.metadata.deletion_timestamp.is_none())
            .map(|_| ())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;

    // A TenantPolicy an admin deletes is put back (meanwhile, no parameter: no restriction).
    let params = Api::<TenantPolicy>::namespaced(admin.clone(), &ns);
    let old = params.get(PARAMS).await.unwrap();
    params
        .delete(PARAMS, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the TenantPolicy recreated by the operator",
        TIMEOUT,
        || async {
            match params.get_opt(PARAMS).await.map_err(why)? {
                Some(p) if p.uid() != old.uid() && p.spec.cordoned => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    wait_refused("cordoned again", || {
        create::<ConfigMap>(&owner, &ns, config_map("new"), true)
    })
    .await;

    // Lifted.
    patch_spec(&name, json!({"cordoned": false})).await;
    wait_admitted("the owner's create admitted after the cordon", || {
        create::<ConfigMap>(&owner, &ns, config_map("new"), true)
    })
    .await;
    let tenant = tenants::wait_ready(&admin, &name).await;
    assert!(!tenant.status.unwrap().cordoned);
    let kept = config_maps.get("kept").await.unwrap();
    assert_eq!(kept.data.unwrap()["k"], "v");
}

#[tokio::test(flavor = "multi_thread")]
async fn owners_can_read_their_rules_but_neither_change_them_nor_escape_them() {
    common::deployed::operator_as_its_account().await;
    let admin = idem_tests::shared().client();
    let name = idem_tests::unique_name("escape");
    let owner_name = format!("owner-{name}");
    let ns = format!("{name}-dev");
    tenants::create(
        &admin,
        &name,
        spec(&owner_name, Some(allowed_rules()), true),
    )
    .await;
    tenants::wait_ready(&admin, &name).await;
    let owner = client_as(&owner_name);
    let policies = Api::<TenantPolicy>::namespaced(owner.clone(), &ns);
    // Read access comes through `view` (aggregated by the controller-manager).
    let read = wait_admitted("the owner reads the TenantPolicy", || policies.get(PARAMS)).await;
    assert!(read.spec.cordoned);
    assert_eq!(read.spec.tenant, name);

    // Refused by RBAC, not by the cordon this tenant is under.
    let forbidden = |result: kube::Result<_>, what: &str| match result {
        Err(kube::Error::Api(e)) if e.code == 403 && !e.message.contains(&by_policy()) => {}
        other => panic!("{what}: {other:?}"),
    };
    let lift = Patch::Merge(json!({"spec": {"cordoned": false}}));
    forbidden(
        policies
            .patch(PARAMS, &PatchParams::default(), &lift)
            .await
            .map(|_| ()),
        "patch",
    );
    forbidden(
        policies
            .delete(PARAMS, &DeleteParams::default())
            .await
            .map(|_| ()),
        "delete",
    );
    let mut other = read.clone();
    other.metadata = kube::api::ObjectMeta {
        name: Some("mine".into()),
        ..Default::default()
    };
    forbidden(
        policies
            .create(&PostParams::default(), &other)
            .await
            .map(|_| ()),
        "create",
    );
    // Nor may they relabel their namespace out of the policy's selector.
    let namespaces = Api::<Namespace>::all(owner.clone());
    for label in [OWNER_UID_LABEL, "app.kubernetes.io/managed-by"] {
        let unlabel = Patch::Merge(json!({"metadata": {"labels": {label: null}}}));
        forbidden(
            namespaces
                .patch(&ns, &PatchParams::default(), &unlabel)
                .await
                .map(|_| ()),
            label,
        );
    }
    // The rules still hold.
    wait_refused("still cordoned", || {
        create::<ConfigMap>(&owner, &ns, config_map("x"), true)
    })
    .await;
    let live = Api::<TenantPolicy>::namespaced(admin.clone(), &ns)
        .get(PARAMS)
        .await
        .unwrap();
    assert!(live.spec.cordoned);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_tenant_keeps_its_rules_and_a_released_namespace_is_free() {
    common::deployed::operator_as_its_account().await;
    let admin = idem_tests::shared().client();
    let name = idem_tests::unique_name("release");
    let owner_name = format!("owner-{name}");
    let ns = format!("{name}-dev");
    let mut tenant_spec = spec(&owner_name, None, true);
    tenant_spec.deletion_policy = DeletionPolicy::Retain;
    tenants::create(&admin, &name, tenant_spec).await;
    tenants::wait_ready(&admin, &name).await;
    let owner = client_as(&owner_name);
    wait_refused("cordoned", || {
        create::<ConfigMap>(&owner, &ns, config_map("x"), true)
    })
    .await;

    // Paused: the operator leaves the TenantPolicy alone, so the cordon stays, and the status
    // keeps saying so.
    patch_spec(&name, json!({"paused": true, "cordoned": false})).await;
    let tenant = tenants::wait_condition(&admin, &name, "Stalled", "Paused").await;
    assert!(tenant.status.unwrap().cordoned);
    let params = Api::<TenantPolicy>::namespaced(admin.clone(), &ns);
    assert!(params.get(PARAMS).await.unwrap().spec.cordoned);
    refusal(create::<ConfigMap>(&owner, &ns, config_map("x"), true).await).unwrap();

    // Deleted with deletionPolicy Retain: the namespace is released with its contents (the
    // TenantPolicy too, never deleted) and no longer held by the cordon.
    patch_spec(&name, json!({"paused": false, "cordoned": true})).await;
    tenants::wait_ready(&admin, &name).await;
    api(&admin)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    tenants::wait_tenant_object_gone(&admin, &name).await;
    wait_admitted("a create in the released namespace", || {
        create::<ConfigMap>(&admin, &ns, config_map("after"), false)
    })
    .await;
    let kept = params.get(PARAMS).await.expect("the TenantPolicy is kept");
    assert!(
        !kept.labels().contains_key(OWNER_UID_LABEL),
        "{:?}",
        kept.labels()
    );
}

/// The API server alone enforces the rules: a namespace labelled as a tenant's and its
/// TenantPolicy, written here by the admin with no operator involved, refuse what they say,
/// and a TenantPolicy whose `owner-uid` is not the namespace's counts for nothing.
#[tokio::test(flavor = "multi_thread")]
async fn the_policy_is_enforced_without_the_operator() {
    install().await;
    let admin = idem_tests::shared().client();
    let ns = idem_tests::create_namespace(&admin, "no-operator")
        .await
        .unwrap();
    let uid = format!("uid-{ns}");
    Api::<Namespace>::all(admin.clone())
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "app.kubernetes.io/managed-by": "idem-operator", OWNER_UID_LABEL: uid}}})),
        )
        .await
        .unwrap();
    let params = Api::<TenantPolicy>::namespaced(admin.clone(), &ns);
    let policy = |owner_uid: &str| {
        serde_json::from_value::<TenantPolicy>(json!({
            "apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "TenantPolicy",
            "metadata": {"name": PARAMS, "labels": {OWNER_UID_LABEL: owner_uid}},
            "spec": {"tenant": "by-hand", "allowed": {"registries": ["ghcr.io/acme"]}},
        }))
        .unwrap()
    };
    params
        .create(&PostParams::default(), &policy(&uid))
        .await
        .unwrap();
    let message = wait_refused("nginx refused with no operator running", || {
        create::<Pod>(&admin, &ns, pod("p", &["nginx"], json!({})), true)
    })
    .await;
    assert!(
        message.contains("Tenant by-hand allows only images from the registries ghcr.io/acme"),
        "{message}"
    );
    // Another tenant's TenantPolicy (its owner-uid) does not hold this namespace.
    params
        .patch(
            PARAMS,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {OWNER_UID_LABEL: "someone-else"}}})),
        )
        .await
        .unwrap();
    wait_admitted("nginx admitted under another tenant's TenantPolicy", || {
        create::<Pod>(&admin, &ns, pod("p", &["nginx"], json!({})), true)
    })
    .await;
}

/// Found by review: ways past `allowed` that the policy once did not read. A
/// PersistentVolumeClaim's `volume.beta.kubernetes.io/storage-class` annotation (the volume
/// controller and provisioners take it over `storageClassName`); a Pod's image volume
/// (`volumes[].image.reference`, pulled like a container image); and an image given by its ID
/// (`sha256:…` or a bare hex prefix), which container runtimes resolve to whatever image of
/// that ID a node already holds, from any registry, while the policy reads it as
/// `docker.io/library/…`.
#[tokio::test(flavor = "multi_thread")]
async fn images_and_classes_the_policy_does_not_read_are_refused() {
    let (_, _, ns, owner, _) = tenant_with_allowed_rules("sneak").await;

    let mut escaped = Vec::new();
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data",
            "annotations": {"volume.beta.kubernetes.io/storage-class": "fast"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "standard"}});
    if let Err(e) = refusal(create::<PersistentVolumeClaim>(&owner, &ns, claim, true).await) {
        escaped.push(format!("claim with the beta storage-class annotation: {e}"));
    }
    let image_volume = pod(
        "vol",
        &["nginx"],
        json!({"volumes": [{"name": "v", "image": {"reference": "quay.io/evil/payload:1"}}]}),
    );
    if let Err(e) = refusal(create::<Pod>(&owner, &ns, image_volume, true).await) {
        escaped.push(format!("image volume: {e}"));
    }
    for image in [
        "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "0123456789ab",
        // A short prefix: no hex length makes `sha256:` a repository's name.
        "sha256:abcde",
        "sha256:a",
    ] {
        if let Err(e) =
            refusal(create::<Pod>(&owner, &ns, pod("id", &[image], json!({})), true).await)
        {
            escaped.push(format!("image by ID {image}: {e}"));
        }
    }
    assert!(escaped.is_empty(), "admitted past the policy: {escaped:#?}");
}
