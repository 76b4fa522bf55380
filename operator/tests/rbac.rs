//! The generated RBAC and admission policy (`deploy/operator/`, from `operator/src/rbac.rs`)
//! on the real control plane: the operator's account has the verbs it uses and no others, it
//! touches Leases only in its own namespace, its `bind` of `admin` and its writes are confined to the
//! namespaces it manages (by the shipped ValidatingAdmissionPolicy, checked with server-side
//! dry runs as the operator's ServiceAccount), and tenant owners (`admin` in their namespaces)
//! may manage TenantApps through the aggregated ClusterRoles, in those namespaces only.

mod common;

use std::process::Output;

use common::deployed::{OPERATOR, install, kubectl, operator_kubeconfig, text};
use common::{TIMEOUT, eventually};
use idem_operator::NAME as LEASE_NAME;
use idem_tests::{create_namespace, shared, unique_name};

const MANAGED: &str = "app.kubernetes.io/managed-by=idem-operator";

/// `kubectl auth can-i` as `user`: true for "yes".
fn can_i(user: &str, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
    // `kind/status` is the status subresource; any other `kind/x` names object x.
    let (resource, sub) = match resource.strip_suffix("/status") {
        Some(r) => (r, Some("--subresource=status")),
        None => (resource, None),
    };
    let mut args = vec!["auth", "can-i", verb, resource, "--as", user];
    args.extend(sub);
    if let Some(ns) = namespace {
        args.extend(["-n", ns]);
    }
    let out = kubectl(&args);
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

/// A namespace labelled as managed by the operator (as the operator's tenant namespaces are).
async fn managed_namespace() -> String {
    let ns = create_namespace(&shared().client(), "managed")
        .await
        .unwrap();
    let out = kubectl(&["label", "namespace", &ns, MANAGED]);
    assert!(out.status.success(), "{}", text(&out));
    ns
}

#[tokio::test]
async fn the_operator_account_has_exactly_the_verbs_it_uses() {
    install().await;
    let ns = managed_namespace().await;
    let op = OPERATOR;
    let lease = format!("leases/{LEASE_NAME}");
    let yes: &[(&str, &str, Option<&str>)] = &[
        ("watch", "tenants.tenancy.idem.dev", None),
        ("patch", "tenantapps.tenancy.idem.dev", Some(&ns)),
        ("update", "tenants.tenancy.idem.dev/status", None),
        ("update", "tenantapps.tenancy.idem.dev/status", Some(&ns)),
        ("create", "namespaces", None),
        ("delete", "namespaces", None),
        ("patch", "deployments.apps", Some(&ns)),
        ("patch", "tenantpolicies.tenancy.idem.dev", Some(&ns)),
        ("delete", "tenantpolicies.tenancy.idem.dev", Some(&ns)),
        (
            "create",
            "rolebindings.rbac.authorization.k8s.io",
            Some(&ns),
        ),
        ("bind", "clusterroles.rbac.authorization.k8s.io/admin", None),
        ("bind", "clusterroles.rbac.authorization.k8s.io/edit", None),
        ("bind", "clusterroles.rbac.authorization.k8s.io/view", None),
        ("create", "events.events.k8s.io", Some("default")),
        ("get", &lease, Some("idem-system")),
        ("update", &lease, Some("idem-system")),
        ("create", "leases.coordination.k8s.io", Some("idem-system")),
        // Shard membership (`--shards auto`): member Leases are named after the pods, and
        // members list them and delete dead members' ones, in its own namespace only; a
        // replica outside a ring watches them.
        ("update", "leases/other", Some("idem-system")),
        ("list", "leases.coordination.k8s.io", Some("idem-system")),
        ("watch", "leases.coordination.k8s.io", Some("idem-system")),
        ("delete", "leases/other", Some("idem-system")),
        (
            "get",
            "customresourcedefinitions.apiextensions.k8s.io/tenants.tenancy.idem.dev",
            None,
        ),
        (
            "get",
            "customresourcedefinitions.apiextensions.k8s.io/tenantapps.tenancy.idem.dev",
            None,
        ),
    ];
    let no: &[(&str, &str, Option<&str>)] = &[
        // Unused verbs on the primaries and their status.
        ("update", "tenants.tenancy.idem.dev", None),
        ("update", "tenantapps.tenancy.idem.dev", Some(&ns)),
        ("patch", "tenants.tenancy.idem.dev/status", None),
        ("get", "tenantapps.tenancy.idem.dev/status", Some(&ns)),
        ("create", "tenants.tenancy.idem.dev", None),
        // Children are applied (patch) and created, never replaced.
        ("update", "deployments.apps", Some(&ns)),
        ("update", "configmaps", Some(&ns)),
        ("get", "secrets", Some(&ns)),
        // Only its own two CRDs, only read.
        (
            "get",
            "customresourcedefinitions.apiextensions.k8s.io/widgets.example.com",
            None,
        ),
        (
            "delete",
            "customresourcedefinitions.apiextensions.k8s.io/tenants.tenancy.idem.dev",
            None,
        ),
        // Leases only in its own namespace.
        ("get", "leases/kube-controller-manager", Some("kube-system")),
        (
            "patch",
            "leases/kube-controller-manager",
            Some("kube-system"),
        ),
        ("list", "leases.coordination.k8s.io", Some("kube-system")),
        ("delete", "leases/other", Some("kube-system")),
        ("watch", "leases.coordination.k8s.io", Some("kube-system")),
        ("create", "leases.coordination.k8s.io", Some("kube-system")),
        (
            "bind",
            "clusterroles.rbac.authorization.k8s.io/cluster-admin",
            None,
        ),
        ("escalate", "clusterroles.rbac.authorization.k8s.io", None),
    ];
    let mut wrong = Vec::new();
    for (expected, cases) in [(true, yes), (false, no)] {
        for (verb, resource, ns) in cases {
            if can_i(op, verb, resource, *ns) != expected {
                wrong.push(format!("{verb} {resource} in {ns:?}: expected {expected}"));
            }
        }
    }
    assert!(wrong.is_empty(), "wrong rights:\n{}", wrong.join("\n"));
}

#[tokio::test]
async fn the_admission_policy_confines_the_operator_to_managed_namespaces() {
    install().await;
    let managed = managed_namespace().await;
    let other = create_namespace(&shared().client(), "unmanaged")
        .await
        .unwrap();
    // RBAC alone lets the account bind `admin` anywhere (it needs `bind` on it for tenant
    // owners); the policy is what keeps it out of kube-system.
    assert!(can_i(
        OPERATOR,
        "create",
        "rolebindings.rbac.authorization.k8s.io",
        Some("kube-system")
    ));
    let dry_run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--dry-run=server", "--as", OPERATOR]);
        kubectl(&all)
    };
    let bind = |ns: &str| {
        dry_run(&[
            "create",
            "rolebinding",
            "owners",
            "--clusterrole=admin",
            "--user=mallory",
            "-n",
            ns,
        ])
    };
    let new_ns = unique_name("made");
    let run = || -> Vec<(&str, Output, bool)> {
        vec![
            ("bind admin in a managed namespace", bind(&managed), true),
            ("bind admin in kube-system", bind("kube-system"), false),
            ("bind admin in an unmanaged namespace", bind(&other), false),
            (
                "label kube-system as managed",
                dry_run(&["label", "namespace", "kube-system", MANAGED]),
                false,
            ),
            (
                "delete an unmanaged namespace",
                dry_run(&["delete", "namespace", &other]),
                false,
            ),
            (
                "delete a managed namespace",
                dry_run(&["delete", "namespace", &managed]),
                true,
            ),
            (
                "create an unlabelled namespace",
                dry_run(&["create", "namespace", &new_ns]),
                false,
            ),
            (
                "create a ConfigMap in kube-system",
                dry_run(&[
                    "create",
                    "configmap",
                    "x",
                    "--from-literal=a=b",
                    "-n",
                    "kube-system",
                ]),
                false,
            ),
            (
                "create a ConfigMap in a managed namespace",
                dry_run(&[
                    "create",
                    "configmap",
                    "x",
                    "--from-literal=a=b",
                    "-n",
                    &managed,
                ]),
                true,
            ),
        ]
    };
    // A new policy takes effect once the API server has loaded it: poll until it does.
    eventually(
        "the admission policy to confine the operator",
        TIMEOUT,
        || async {
            let mut wrong = Vec::new();
            for (what, out, allowed) in run() {
                let said = text(&out);
                let denied_by_policy = said.contains("idem-operator-managed-namespaces");
                if out.status.success() != allowed || (!allowed && !denied_by_policy) {
                    wrong.push(format!("{what}: expected allowed={allowed}, got: {said}"));
                }
            }
            wrong
                .is_empty()
                .then_some(())
                .ok_or_else(|| wrong.join("\n"))
        },
    )
    .await;
}

#[tokio::test]
async fn tenant_owners_may_manage_tenantapps_through_the_aggregated_roles() {
    install().await;
    let ns = managed_namespace().await;
    let elsewhere = managed_namespace().await;
    for (user, role) in [("owner", "admin"), ("editor", "edit"), ("viewer", "view")] {
        let out = kubectl(&[
            "create",
            "rolebinding",
            user,
            &format!("--clusterrole={role}"),
            &format!("--user={user}"),
            "-n",
            &ns,
        ]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let apps = "tenantapps.tenancy.idem.dev";
    let policies = "tenantpolicies.tenancy.idem.dev";
    // The clusterrole-aggregation controller folds the rules into admin/edit/view.
    eventually(
        "TenantApp rights aggregated into admin, edit, view",
        TIMEOUT,
        || async {
            let got = [
                can_i("owner", "create", apps, Some(&ns)),
                can_i("editor", "create", apps, Some(&ns)),
                can_i("viewer", "get", apps, Some(&ns)),
            ];
            (got == [true; 3])
                .then_some(())
                .ok_or_else(|| format!("{got:?}"))
        },
    )
    .await;
    let expected: &[(&str, &str, &str, &str, bool)] = &[
        ("owner", "create", apps, &ns, true),
        ("owner", "delete", apps, &ns, true),
        ("owner", "update", apps, &ns, true),
        (
            "owner",
            "update",
            "tenantapps.tenancy.idem.dev/status",
            &ns,
            false,
        ),
        ("owner", "create", apps, &elsewhere, false),
        ("owner", "create", "tenants.tenancy.idem.dev", "", false),
        ("editor", "patch", apps, &ns, true),
        ("viewer", "list", apps, &ns, true),
        ("viewer", "create", apps, &ns, false),
        // The tenant admission policy's parameters: owners read their rules, never write them.
        ("owner", "get", policies, &ns, true),
        ("owner", "list", policies, &ns, true),
        ("owner", "patch", policies, &ns, false),
        ("owner", "update", policies, &ns, false),
        ("owner", "delete", policies, &ns, false),
        ("owner", "create", policies, &ns, false),
        ("editor", "patch", policies, &ns, false),
    ];
    let mut wrong = Vec::new();
    for (user, verb, resource, namespace, want) in expected {
        let ns = (!namespace.is_empty()).then_some(*namespace);
        if can_i(user, verb, resource, ns) != *want {
            wrong.push(format!(
                "{user} {verb} {resource} in {ns:?}: expected {want}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `edit` in any namespace grants creating TenantApps there (the aggregated roles), and the
/// operator keeps every TenantApp in memory: the shipped policy refuses one outside the
/// namespaces a Tenant holds, where it would do nothing (`NotInTenantNamespace`) and no
/// Tenant's `count/` quota bounds how many, and a spec change of one left there (a namespace
/// released since). Cluster administrators still may; metadata changes go on.
#[tokio::test]
async fn tenantapps_are_created_only_in_namespaces_a_tenant_holds() {
    use idem_operator::resources::TenantApp;
    use kube::api::{Api, PostParams};

    install().await;
    let plain = create_namespace(&shared().client(), "plain").await.unwrap();
    let held = managed_namespace().await;
    let owner_uid = format!("{}=0f0c9a6e", idem_runtime::apply::OWNER_UID_LABEL);
    let out = kubectl(&["label", "namespace", &held, &owner_uid]);
    assert!(out.status.success(), "{}", text(&out));
    for ns in [&plain, &held] {
        // The tenant policy, matching the managed namespace, refuses writes until its
        // parameter kind is synced, a moment after it is installed.
        eventually("the editor's RoleBinding", TIMEOUT, || async {
            let out = kubectl(&[
                "create",
                "rolebinding",
                "editor",
                "--clusterrole=edit",
                "--user=editor",
                "-n",
                ns,
            ]);
            (out.status.success() || text(&out).contains("AlreadyExists"))
                .then_some(())
                .ok_or_else(|| text(&out))
        })
        .await;
    }
    let apps = "tenantapps.tenancy.idem.dev";
    eventually("TenantApp rights aggregated into edit", TIMEOUT, || async {
        (can_i("editor", "create", apps, Some(&plain))
            && can_i("editor", "create", apps, Some(&held)))
        .then_some(())
        .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let app = TenantApp::new("web", common::apps::spec(1, "x = 1"));
    let create = |client: kube::Client, ns: &str| {
        let api = Api::<TenantApp>::namespaced(client, ns);
        let (app, dry_run) = (app.clone(), dry_run.clone());
        async move { api.create(&dry_run, &app).await }
    };
    let editor = common::users::client_as("editor");
    // Policies take effect a moment after they are created.
    let refused = eventually(
        "a TenantApp outside a tenant namespace refused",
        TIMEOUT,
        || {
            let creating = create(editor.clone(), &plain);
            async move {
                match creating.await {
                    Err(e) => Ok(e.to_string()),
                    Ok(_) => Err("admitted".to_owned()),
                }
            }
        },
    )
    .await;
    assert!(
        refused.contains("only in a namespace a Tenant holds"),
        "{refused}"
    );
    create(editor.clone(), &held)
        .await
        .expect("in a namespace a Tenant holds");
    // An administrator's, anywhere; there its spec is the administrator's to change, its
    // metadata anyone's who may update it.
    Api::<TenantApp>::namespaced(shared().client(), &plain)
        .create(&PostParams::default(), &app)
        .await
        .expect("an administrator's, anywhere");
    let apps = Api::<TenantApp>::namespaced(editor, &plain);
    let patch = |body: serde_json::Value| {
        let apps = apps.clone();
        async move {
            apps.patch(
                "web",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(body),
            )
            .await
        }
    };
    let refused = patch(serde_json::json!({"spec": {"image": "nginx:1.28"}}))
        .await
        .expect_err("a spec change outside a tenant namespace");
    assert!(
        refused
            .to_string()
            .contains("only in a namespace a Tenant holds"),
        "{refused}"
    );
    patch(serde_json::json!({"metadata": {"labels": {"team": "a"}}}))
        .await
        .expect("a metadata change");
}

/// A member Lease of the shard ring written by anyone but the operator's account — an admin
/// included — is refused by the generated policy: a forged live member would keep every replica
/// waiting for its acknowledgement (README "Running N replicas"). Other Leases stay writable.
#[tokio::test]
async fn only_the_operator_may_write_the_shard_rings_member_leases() {
    use idem_runtime::shard::membership::MEMBER_LABEL;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, PostParams};

    install().await;
    let lease = |labelled: bool| -> Lease {
        let mut labels = serde_json::Map::new();
        if labelled {
            labels.insert(MEMBER_LABEL.into(), "idem-operator".into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": unique_name("ghost"), "labels": labels},
            "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 15},
        }))
        .unwrap()
    };
    let api_as = |user: Option<&str>| {
        let mut config = shared().config();
        config.auth_info.impersonate = user.map(Into::into);
        Api::<Lease>::namespaced(kube::Client::try_from(config).unwrap(), "idem-system")
    };
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    // A new policy takes effect once the API server has loaded it: poll until it does.
    eventually(
        "the shard ring policy to guard member Leases",
        TIMEOUT,
        || {
            let (lease, api_as, dry_run) = (&lease, &api_as, &dry_run);
            async move {
                let mut wrong = Vec::new();
                match api_as(None).create(dry_run, &lease(true)).await {
                    Err(e) if e.to_string().contains("idem-operator-shard-ring") => {}
                    other => wrong.push(format!("an admin's member Lease: {other:?}")),
                }
                if let Err(e) = api_as(None).create(dry_run, &lease(false)).await {
                    wrong.push(format!("an admin's other Lease: {e}"));
                }
                if let Err(e) = api_as(Some(OPERATOR)).create(dry_run, &lease(true)).await {
                    wrong.push(format!("the operator's member Lease: {e}"));
                }
                wrong
                    .is_empty()
                    .then_some(())
                    .ok_or_else(|| wrong.join("\n"))
            }
        },
    )
    .await;
}

/// A Tenant namespace whose `app.kubernetes.io/managed-by` label an admin removed is still
/// the Tenant's (its controller ownerReference says so): the operator, running as its
/// ServiceAccount under the shipped RBAC and admission policy with the shipped flags, puts the
/// label back and repairs what is in the namespace, the Tenant is `Ready` again, and deleting
/// the Tenant while another namespace lacks the label deletes its namespaces. The account still
/// cannot write a system namespace, even one an admin labelled as managed, nor make a namespace
/// its own by adding the label or a Tenant ownerReference.
#[tokio::test]
async fn the_operator_repairs_a_tenant_namespace_whose_managed_by_label_was_removed() {
    use common::process::OperatorProcess;
    use common::tenants;
    use idem_operator::tenant::desired::QUOTA;
    use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
    use kube::api::Api;

    install().await;
    let client = shared().client();
    let kubeconfig = operator_kubeconfig();
    let operator =
        OperatorProcess::spawn_with(&kubeconfig, "idem-system", &unique_name("op"), |a| a);
    let as_operator = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--dry-run=server", "--as", OPERATOR]);
        kubectl(&all)
    };
    let refused_by_policy = |out: &Output| {
        !out.status.success() && text(out).contains("idem-operator-managed-namespaces")
    };
    // A new policy takes effect once the API server has loaded it: without it in force, the
    // repair below would prove nothing.
    eventually("the admission policy in force", TIMEOUT, || async {
        let out = as_operator(&["label", "namespace", "kube-system", MANAGED]);
        refused_by_policy(&out)
            .then_some(())
            .ok_or_else(|| text(&out))
    })
    .await;
    let name = unique_name("unlab");
    let created = tenants::create(&client, &name, tenants::full_spec(&["dev", "prod"])).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    let (dev, prod) = (format!("{name}-dev"), format!("{name}-prod"));
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let managed_by = |ns: &Namespace| {
        ns.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/managed-by"))
            .cloned()
    };

    // An admin removes the label (and, to see the namespace's contents repaired, the quota).
    let out = kubectl(&["label", "namespace", &dev, "app.kubernetes.io/managed-by-"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = kubectl(&["delete", "resourcequota", QUOTA, "-n", &dev]);
    assert!(out.status.success(), "{}", text(&out));
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &dev);
    eventually("the label and the quota repaired", TIMEOUT, || async {
        let ns = namespaces.get(&dev).await.map_err(common::why)?;
        let quota = quotas.get_opt(QUOTA).await.map_err(common::why)?;
        let t = tenants::api(&client)
            .get(&name)
            .await
            .map_err(common::why)?;
        (managed_by(&ns).as_deref() == Some("idem-operator") && quota.is_some())
            .then_some(())
            .ok_or_else(|| {
                format!(
                    "label {:?}, quota {}, status {:?}; operator log:\n{}",
                    managed_by(&ns),
                    quota.is_some(),
                    t.status,
                    operator.log_tail()
                )
            })
    })
    .await;
    let ready = tenants::wait_ready(&client, &name).await;
    let dev_ns = namespaces.get(&dev).await.unwrap();
    tenants::assert_owned(&dev_ns.metadata, &ready);
    assert_eq!(ready.metadata.uid, tenant.metadata.uid);

    // What the account still may not do, with a real Tenant's namespace beside it.
    let other = create_namespace(&client, "unowned").await.unwrap();
    let reference = format!(
        r#"{{"metadata":{{"ownerReferences":[{{"apiVersion":"tenancy.idem.dev/v1alpha1","kind":"Tenant","name":"{name}","uid":"{}","controller":true}}]}}}}"#,
        created.metadata.uid.as_deref().unwrap()
    );
    // An admin's mistake: a system namespace labelled as managed stays out of the account's reach.
    let out = kubectl(&["label", "namespace", "kube-public", MANAGED]);
    assert!(out.status.success(), "{}", text(&out));
    let refused = [
        (
            "label kube-system as managed",
            as_operator(&["label", "namespace", "kube-system", MANAGED]),
        ),
        (
            "bind admin in kube-system",
            as_operator(&[
                "create",
                "rolebinding",
                "owners",
                "--clusterrole=admin",
                "--user=mallory",
                "-n",
                "kube-system",
            ]),
        ),
        (
            "create a ConfigMap in kube-public labelled as managed",
            as_operator(&[
                "create",
                "configmap",
                "x",
                "--from-literal=a=b",
                "-n",
                "kube-public",
            ]),
        ),
        (
            "annotate kube-public labelled as managed",
            as_operator(&["annotate", "namespace", "kube-public", "x=y"]),
        ),
        (
            "label an unowned namespace as managed",
            as_operator(&["label", "namespace", &other, MANAGED]),
        ),
        (
            "give an unowned namespace a Tenant ownerReference",
            as_operator(&[
                "patch",
                "namespace",
                &other,
                "--type=merge",
                "-p",
                &reference,
            ]),
        ),
        (
            "remove the label from a managed namespace",
            as_operator(&["label", "namespace", &prod, "app.kubernetes.io/managed-by-"]),
        ),
    ];
    let wrong: Vec<String> = refused
        .iter()
        .filter(|(_, out)| !refused_by_policy(out))
        .map(|(what, out)| format!("{what}: {}", text(out)))
        .collect();
    let out = kubectl(&[
        "label",
        "namespace",
        "kube-public",
        "app.kubernetes.io/managed-by-",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        wrong.is_empty(),
        "not refused by the policy:\n{}",
        wrong.join("\n")
    );

    // Deleting the Tenant (deletionPolicy Delete) while a namespace lacks the label (the
    // operator stopped first, so the label is not put back before: a paused Tenant's deletion
    // would keep its namespaces); meanwhile the account may still write into it (its
    // owner-uid label stands for the reference, which the policy cannot see on a namespace it
    // writes into).
    drop(operator);
    let out = kubectl(&["label", "namespace", &prod, "app.kubernetes.io/managed-by-"]);
    assert!(out.status.success(), "{}", text(&out));
    let create_in_prod = || {
        as_operator(&[
            "create",
            "configmap",
            "x",
            "--from-literal=a=b",
            "-n",
            &prod,
        ])
    };
    eventually(
        "a write into the unlabelled tenant namespace",
        TIMEOUT,
        || async {
            let out = create_in_prod();
            out.status.success().then_some(()).ok_or_else(|| text(&out))
        },
    )
    .await;
    tenants::api(&client)
        .delete(&name, &Default::default())
        .await
        .unwrap();
    let operator =
        OperatorProcess::spawn_with(&kubeconfig, "idem-system", &unique_name("op"), |a| a);
    tenants::wait_gone(&client, &name).await;

    // deletionPolicy Retain, a namespace without the label: released (the Tenant's references
    // removed from it and from what idem made in it), and the Tenant goes.
    let kept = unique_name("unlab-r");
    let mut spec = tenants::full_spec(&["dev"]);
    spec.deletion_policy = idem_operator::resources::tenant::DeletionPolicy::Retain;
    let retained = tenants::create(&client, &kept, spec).await;
    tenants::wait_ready(&client, &kept).await;
    common::tenants::pause(&client, &kept).await;
    let kept_ns = format!("{kept}-dev");
    let out = kubectl(&[
        "label",
        "namespace",
        &kept_ns,
        "app.kubernetes.io/managed-by-",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    tenants::api(&client)
        .delete(&kept, &Default::default())
        .await
        .unwrap();
    tenants::wait_tenant_object_gone(&client, &kept).await;
    let uid = retained.metadata.uid.as_deref().unwrap();
    tenants::assert_retained(&client, &kept_ns, uid).await;
    let quota = Api::<ResourceQuota>::namespaced(client.clone(), &kept_ns)
        .get(QUOTA)
        .await
        .unwrap();
    assert!(
        quota
            .metadata
            .owner_references
            .unwrap_or_default()
            .iter()
            .all(|r| r.uid != uid),
        "the quota still refers to the deleted tenant"
    );
    drop(operator);
}

/// The shipped FlowSchema puts the operator's Lease requests in its namespace into the API
/// server's `leader-election` priority level (its reconcile traffic stays where every
/// ServiceAccount's goes): the server names the schema and level it served each request at in
/// the response headers.
#[tokio::test]
async fn the_operators_lease_requests_are_served_at_the_leader_election_priority_level() {
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    use kube::ResourceExt;
    use kube::api::Api;

    install().await;
    let client = shared().client();
    let schema = Api::<FlowSchema>::all(client.clone())
        .get("idem-operator-leases")
        .await
        .expect("the shipped FlowSchema");
    let level = Api::<PriorityLevelConfiguration>::all(client.clone())
        .get("leader-election")
        .await
        .expect("the API server's leader-election priority level");
    let (schema_uid, level_uid) = (schema.uid().unwrap(), level.uid().unwrap());
    let mut config = shared().config();
    config.auth_info.impersonate = Some(OPERATOR.into());
    let operator = kube::Client::try_from(config).unwrap();
    // The schema and level the server served a GET of `path` as the operator at.
    let served_at = |path: &'static str| {
        let operator = operator.clone();
        async move {
            let request = http::Request::get(path)
                .body(Vec::new().into())
                .map_err(|e| e.to_string())?;
            let response = operator.send(request).await.map_err(|e| e.to_string())?;
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string()
            };
            Ok::<_, String>((
                header("X-Kubernetes-PF-FlowSchema-UID"),
                header("X-Kubernetes-PF-PriorityLevel-UID"),
            ))
        }
    };
    // A new FlowSchema takes effect once the API server has loaded it: poll until it does.
    eventually(
        "the operator's Lease requests at leader-election",
        TIMEOUT,
        || {
            let (served_at, schema_uid, level_uid) = (&served_at, &schema_uid, &level_uid);
            async move {
                for path in [
                    "/apis/coordination.k8s.io/v1/namespaces/idem-system/leases",
                    "/apis/coordination.k8s.io/v1/namespaces/idem-system/leases/idem-operator",
                ] {
                    let (schema, level) = served_at(path).await?;
                    if (&schema, &level) != (schema_uid, level_uid) {
                        return Err(format!("{path}: schema {schema}, level {level}"));
                    }
                }
                Ok(())
            }
        },
    )
    .await;
    // Its other requests are not.
    let (schema, level) = served_at("/api/v1/namespaces/idem-system/configmaps")
        .await
        .unwrap();
    assert!(
        schema != schema_uid && level != level_uid,
        "a ConfigMap list served at the Lease schema {schema} / level {level}"
    );
}
