//! The generated RBAC and admission policy (`deploy/operator/`, from `operator/src/rbac.rs`)
//! on the real control plane: the operator's account has the verbs it uses and no others, it
//! touches Leases only in its own namespace, its `bind` of `admin` and its writes are confined to the
//! namespaces it manages (by the shipped ValidatingAdmissionPolicy, checked with server-side
//! dry runs as the operator's ServiceAccount), and tenant owners (`admin` in their namespaces)
//! may manage TenantApps through the aggregated ClusterRoles.

mod common;

use std::path::Path;
use std::process::Output;

use common::{TIMEOUT, eventually, install_crds};
use idem_operator::leader::LEASE_NAME;
use idem_tests::{create_namespace, shared, unique_name};

const OPERATOR: &str = "system:serviceaccount:idem-system:idem-operator";
const MANAGED: &str = "app.kubernetes.io/managed-by=idem-operator";

fn kubectl(args: &[&str]) -> Output {
    shared()
        .kubectl()
        .args(args)
        .output()
        .expect("running kubectl")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Applies every generated manifest but the Deployment (there is no image to run here).
async fn install() {
    install_crds(&shared().client()).await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/operator");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.to_string_lossy().contains("deployment"))
        .collect();
    files.sort();
    for file in files {
        let out = kubectl(&["apply", "--server-side", "-f", file.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "applying {}: {}",
            file.display(),
            text(&out)
        );
    }
}

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
        (
            "create",
            "rolebindings.rbac.authorization.k8s.io",
            Some(&ns),
        ),
        ("bind", "clusterroles.rbac.authorization.k8s.io/admin", None),
        ("create", "events.events.k8s.io", Some("default")),
        ("get", &lease, Some("idem-system")),
        ("update", &lease, Some("idem-system")),
        ("create", "leases.coordination.k8s.io", Some("idem-system")),
        // Shard membership (`--shards auto`): member Leases are named after the pods, and
        // members list them and delete dead members' ones, in its own namespace only.
        ("update", "leases/other", Some("idem-system")),
        ("list", "leases.coordination.k8s.io", Some("idem-system")),
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
        // Leases only in its own namespace, and never watched.
        ("get", "leases/kube-controller-manager", Some("kube-system")),
        (
            "patch",
            "leases/kube-controller-manager",
            Some("kube-system"),
        ),
        ("list", "leases.coordination.k8s.io", Some("kube-system")),
        ("delete", "leases/other", Some("kube-system")),
        ("watch", "leases.coordination.k8s.io", Some("idem-system")),
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

/// A member Lease of the shard ring written by anyone but the operator's account — an admin
/// included — is refused by the generated policy: a forged live member would keep every replica
/// waiting for its acknowledgement (README "Running N replicas"). Other Leases stay writable.
#[tokio::test]
async fn only_the_operator_may_write_the_shard_rings_member_leases() {
    use idem_operator::shard::membership::MEMBER_LABEL;
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
