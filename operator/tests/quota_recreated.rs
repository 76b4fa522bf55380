//! A tenant namespace's quota on the real control plane with the shipped admission policies
//! and the operator as its own ServiceAccount: an administrator bound by RBAC may neither
//! delete nor edit it (the policy `idem-operator-quota-guard` names the Tenant's
//! `spec.quota`); one a superuser deleted anyway is made again at once by the operator, but
//! quota admission limits nothing until the quota controller has counted the new quota. Until then the namespace is refused writes as by a cordon
//! (`quotaNotEnforced` in its TenantPolicy; deletes still go, and an owner deleting the
//! operator's RoleBinding does not lift it), the Tenant says `Reconciling`
//! (`QuotaNotEnforced`), and once the quota is enforced everything is as before.

mod common;

use common::tenants;
use common::users::client_as;
use common::{TIMEOUT, controller_manager, eventually, why};
use idem_operator::resources::tenant::{DeletionPolicy, Owner, OwnerKind, Quota};
use idem_operator::resources::{TenantPolicy, TenantSpec};
use idem_operator::tenant::desired::{OWNERS, QUOTA};
use idem_operator::tenant::policy::PARAMS;
use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

/// Whether the quota enforces something (the quota controller has filled `status.hard`).
fn enforced(q: &ResourceQuota) -> bool {
    (q.status.as_ref()).is_some_and(|s| s.hard.as_ref().is_some_and(|h| !h.is_empty()))
}

/// A Ready Tenant named after `prefix` with one owner, one namespace and a quota of 5
/// ConfigMaps there, in which the owner has created ConfigMap "before": its name, its owner,
/// its namespace and the owner's ConfigMaps there.
async fn ready_tenant(
    admin: &kube::Client,
    prefix: &str,
) -> (String, String, String, Api<ConfigMap>) {
    let tenant = idem_tests::unique_name(prefix);
    let owner = format!("{tenant}-owner");
    let ns = format!("{tenant}-dev");
    let spec = TenantSpec {
        owners: vec![Owner {
            kind: OwnerKind::User,
            name: owner.clone(),
            namespace: None,
        }],
        namespaces: vec!["dev".into()],
        weight: 1,
        deletion_policy: DeletionPolicy::Delete,
        quota: Some(Quota {
            hard: tenants::quantities(&[("configmaps", "5")]),
            ..Quota::default()
        }),
        ..TenantSpec::default()
    };
    tenants::create(admin, &tenant, spec).await;
    tenants::wait_ready(admin, &tenant).await;
    let as_owner = Api::<ConfigMap>::namespaced(client_as(&owner), &ns);
    eventually("the owner may create", TIMEOUT, || async {
        as_owner
            .create(&PostParams::default(), &config_map("before"))
            .await
            .map_err(why)
    })
    .await;
    (tenant, owner, ns, as_owner)
}

/// The tests here stop the shared controller-manager: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_quota_made_again_refuses_writes_until_it_is_enforced() {
    let _serial = SERIAL.lock().await;
    common::deployed::operator_as_its_account().await;
    let admin = idem_tests::shared().client();
    let (tenant, owner, ns, as_owner) = ready_tenant(&admin, "qr").await;
    let quotas = Api::<ResourceQuota>::namespaced(admin.clone(), &ns);
    let before = quotas.get(QUOTA).await.expect("the quota");

    // Access of the owner's own making, beside the operator's RoleBinding.
    let own: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "self-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": owner}],
    }))
    .unwrap();
    let owners_bindings =
        Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client_as(&owner), &ns);
    owners_bindings
        .create(&PostParams::default(), &own)
        .await
        .expect("the owner binds themself");

    // A cluster administrator bound by RBAC (not a system:masters superuser) may not delete
    // or edit the quota: the shipped policy refuses it, naming the Tenant's spec.quota.
    let careless = format!("{tenant}-admin");
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": careless},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": careless}],
    }))
    .unwrap();
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("a cluster-admin");
    let as_careless = Api::<ResourceQuota>::namespaced(client_as(&careless), &ns);
    let refused = eventually("the administrator's deletion refused", TIMEOUT, || async {
        match as_careless.delete(QUOTA, &DeleteParams::default()).await {
            Err(kube::Error::Api(e))
                if e.code == 403 && e.message.contains("change the Tenant instead") =>
            {
                Ok(e.message)
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(refused.contains("spec.quota"), "{refused}");
    // Nor all quotas of the namespace at once (a collection's delete names no object).
    let all = as_careless
        .delete_collection(&DeleteParams::default(), &Default::default())
        .await;
    assert!(
        matches!(&all, Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("change the Tenant instead")),
        "{all:?}"
    );
    let edit = as_careless
        .patch(
            QUOTA,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"hard": {"configmaps": "2000"}}})),
        )
        .await;
    assert!(
        matches!(&edit, Err(kube::Error::Api(e)) if e.code == 403),
        "{edit:?}"
    );

    // The quota controller stopped, a superuser (system:masters) deletes the quota.
    let resume = controller_manager::stop();
    quotas
        .delete(QUOTA, &DeleteParams::default())
        .await
        .expect("delete the quota");
    let waiting = tenants::wait_condition(&admin, &tenant, "Reconciling", "QuotaNotEnforced").await;
    let message = waiting
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Reconciling"))
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains(&format!("creates and updates in {ns} are refused")),
        "{message}"
    );
    let again = quotas.get(QUOTA).await.expect("the quota made again");
    assert_ne!(again.uid(), before.uid());
    assert!(!enforced(&again), "{:?}", again.status);
    let policy = Api::<TenantPolicy>::namespaced(admin.clone(), &ns)
        .get(PARAMS)
        .await
        .expect("the TenantPolicy");
    assert!(policy.spec.quota_not_enforced, "{:?}", policy.spec);

    // Nothing the quota would count gets in meanwhile: 6 ConfigMaps where 5 are allowed (with
    // kube-root-ca.crt and "before", two already) would pass an unenforced quota.
    let refusal = eventually("the owner's create refused", TIMEOUT, || async {
        match as_owner
            .create(&PostParams::default(), &config_map("during"))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 403 => Ok(e.message),
            other => Err(format!("not refused: {other:?}")),
        }
    })
    .await;
    assert!(
        refusal.contains(&format!("the quota of namespace {ns} is not enforced yet"))
            && refusal.contains("deletes are allowed"),
        "{refusal}"
    );
    for i in 0..6 {
        let created = as_owner
            .create(&PostParams::default(), &config_map(&format!("flood-{i}")))
            .await;
        assert!(created.is_err(), "admitted while unenforced: {created:?}");
    }
    as_owner
        .delete("before", &DeleteParams::default())
        .await
        .expect("deletes go on");
    // The owner deletes the operator's RoleBinding (deletes go on): the cordon stays, since
    // their own binding still grants them access.
    owners_bindings
        .delete(OWNERS, &DeleteParams::default())
        .await
        .expect("the owner deletes idem-owners");
    eventually("the pass that sees idem-owners gone", TIMEOUT, || async {
        let t = tenants::api(&admin).get(&tenant).await.map_err(why)?;
        let recorded = (t.status.iter())
            .flat_map(|s| s.created_children.iter())
            .any(|c| c.name == OWNERS && c.namespace.as_deref() == Some(ns.as_str()));
        if recorded {
            Err("still recorded".to_string())
        } else {
            Ok(())
        }
    })
    .await;
    let policy = Api::<TenantPolicy>::namespaced(admin.clone(), &ns)
        .get(PARAMS)
        .await
        .expect("the TenantPolicy");
    assert!(policy.spec.quota_not_enforced, "lifted: {:?}", policy.spec);
    let created = as_owner
        .create(&PostParams::default(), &config_map("through-own-binding"))
        .await;
    assert!(created.is_err(), "admitted while unenforced: {created:?}");

    // The quota controller counts the new quota: writes are admitted again, within it.
    drop(resume);
    tenants::wait_ready(&admin, &tenant).await;
    assert!(enforced(&quotas.get(QUOTA).await.unwrap()));
    let policy = Api::<TenantPolicy>::namespaced(admin.clone(), &ns)
        .get(PARAMS)
        .await
        .expect("the TenantPolicy");
    assert!(!policy.spec.quota_not_enforced, "{:?}", policy.spec);
    eventually("the owner may create again", TIMEOUT, || async {
        as_owner
            .create(&PostParams::default(), &config_map("after"))
            .await
            .map_err(why)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replacing_a_quotas_keys_cordons_nothing() {
    let _serial = SERIAL.lock().await;
    common::deployed::operator_as_its_account().await;
    let admin = idem_tests::shared().client();
    let (tenant, _owner, ns, as_owner) = ready_tenant(&admin, "qk").await;

    // The quota controller stopped, an administrator replaces the quota's only key.
    let resume = controller_manager::stop();
    tenants::api(&admin)
        .patch(
            &tenant,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"spec": {"quota": {"hard": {"configmaps": null, "secrets": "5"}}}}),
            ),
        )
        .await
        .expect("replace the key");
    // Ready at the new generation: the namespace is not cordoned.
    tenants::wait_ready(&admin, &tenant).await;
    let quota = Api::<ResourceQuota>::namespaced(admin.clone(), &ns)
        .get(QUOTA)
        .await
        .expect("the quota");
    let spec_keys: Vec<&String> = (quota.spec.as_ref())
        .and_then(|s| s.hard.as_ref())
        .map(|h| h.keys().collect())
        .unwrap_or_default();
    assert_eq!(spec_keys, ["secrets"], "{:?}", quota.spec);
    let enforced_keys: Vec<&String> = (quota.status.as_ref())
        .and_then(|s| s.hard.as_ref())
        .map(|h| h.keys().collect())
        .unwrap_or_default();
    assert_eq!(
        enforced_keys,
        ["configmaps"],
        "the old key is still what is enforced: {:?}",
        quota.status
    );
    let policy = Api::<TenantPolicy>::namespaced(admin.clone(), &ns)
        .get(PARAMS)
        .await
        .expect("the TenantPolicy");
    assert!(
        !policy.spec.quota_not_enforced,
        "cordoned: {:?}",
        policy.spec
    );
    as_owner
        .create(&PostParams::default(), &config_map("during"))
        .await
        .expect("the owner may still create, within the old key");
    drop(resume);
}
