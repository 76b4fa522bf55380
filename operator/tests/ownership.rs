//! What is idem's, on the real control plane: what the Tenant's `status.createdChildren`
//! records as created by idem, and what carries its ownerReference — never a label anyone
//! may remove.
//!
//! - A namespace an administrator releases (removes its ownerReference) keeps what idem made
//!   in it: those objects are released too, not deleted.
//! - Deleting a Tenant with `deletionPolicy: Retain` keeps a namespace whose `owner-uid` label
//!   was removed: the finalizer finds what to keep by ownerReference, as the garbage collector
//!   finds what to delete.
//! - A tenant owner who strips the ownerReference and labels from `idem-owners` cannot keep a
//!   revoked owner's rights: idem created it (its uid is in the record), so it is repaired.
//!
//! Where a test claims the garbage collector kept something, it first waits until the
//! collector deleted a canary owned by the same deleted Tenant: the collector had its chance.

mod common;
use common::users::{assert_user_data, client_as, user_data};

use common::{TIMEOUT, eventually, shared_operator, tenants, why};
use idem_operator::resources::Tenant;
use idem_operator::resources::tenant::DeletionPolicy;
use idem_operator::tenant::desired::{ISOLATION, LIMITS, OWNERS, QUOTA};
use idem_runtime::apply::OWNER_UID_LABEL;
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::{ConfigMap, LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

/// Metadata of the object `name` of kind `K` in `ns`, `None` when it does not exist.
async fn meta_of<K>(client: &kube::Client, ns: &str, name: &str) -> Option<ObjectMeta>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    Api::<K>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .map(|o| o.meta().clone())
}

/// The metadata of what idem makes in a tenant namespace (quota, limits, owners' RoleBinding,
/// isolation policy), as `(what, metadata)`; `None` for an object that does not exist.
async fn contents(client: &kube::Client, ns: &str) -> Vec<(String, Option<ObjectMeta>)> {
    vec![
        (
            format!("ResourceQuota {QUOTA}"),
            meta_of::<ResourceQuota>(client, ns, QUOTA).await,
        ),
        (
            format!("LimitRange {LIMITS}"),
            meta_of::<LimitRange>(client, ns, LIMITS).await,
        ),
        (
            format!("RoleBinding {OWNERS}"),
            meta_of::<RoleBinding>(client, ns, OWNERS).await,
        ),
        (
            format!("NetworkPolicy {ISOLATION}"),
            meta_of::<NetworkPolicy>(client, ns, ISOLATION).await,
        ),
    ]
}

/// Checks that `meta` (of `what`) exists and neither refers to nor is labelled with `uid`.
fn assert_released(what: &str, meta: Option<&ObjectMeta>, uid: &str) {
    let meta = meta.unwrap_or_else(|| panic!("{what} was deleted"));
    let refs = meta.owner_references.clone().unwrap_or_default();
    assert!(
        refs.iter().all(|r| r.uid != uid),
        "{what} still refers to the tenant {uid}: {refs:?}"
    );
    let labels = meta.labels.clone().unwrap_or_default();
    assert_ne!(
        labels.get(OWNER_UID_LABEL).map(String::as_str),
        Some(uid),
        "{what} still carries the tenant's owner-uid label"
    );
}

/// Creates a ConfigMap in namespace `default` owned by `tenant` (a plain ownerReference):
/// once the Tenant is gone, the garbage collector deletes it; see [`wait_collected`].
async fn canary(client: &kube::Client, tenant: &Tenant) -> String {
    let name = unique_name("canary");
    let body = json!({"metadata": {"name": name, "ownerReferences": [{
        "apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "Tenant",
        "name": tenant.name_any(), "uid": tenant.uid().unwrap(),
    }]}});
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
    name
}

/// Waits until the garbage collector deleted the canary `name` (its owner is gone).
async fn wait_collected(client: &kube::Client, name: &str) {
    let api = Api::<ConfigMap>::namespaced(client.clone(), "default");
    eventually(
        "the garbage collector to delete the canary",
        TIMEOUT,
        || async {
            match api.get_opt(name).await.map_err(why)? {
                None => Ok(()),
                Some(_) => Err("still there".to_string()),
            }
        },
    )
    .await;
}

/// Deletes tenant `name` and waits until the object is gone.
async fn delete_tenant(client: &kube::Client, name: &str) {
    tenants::api(client)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    tenants::wait_tenant_object_gone(client, name).await;
}

#[tokio::test]
async fn a_namespace_an_admin_releases_keeps_what_idem_made_in_it() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("rel");
    tenants::create(&client, &name, tenants::full_spec(&["keep", "other"])).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    let uid = tenant.uid().unwrap();
    let keep = format!("{name}-keep");
    user_data(&client, &keep).await;

    // The admin releases the namespace, as the README says: remove its ownerReference.
    Api::<Namespace>::all(client.clone())
        .patch(
            &keep,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": null}})),
        )
        .await
        .unwrap();

    // The Tenant reconciles (the namespace's event) and says what it kept, deleting nothing.
    let note = eventually("a Released event naming the namespace", TIMEOUT, || async {
        for (what, meta) in contents(&client, &keep).await {
            assert!(
                meta.is_some_and(|m| m.deletion_timestamp.is_none()),
                "{what} in the released namespace {keep} was deleted"
            );
        }
        tenants::events_about(&client, &name, "Released")
            .await
            .into_iter()
            .filter_map(|e| e.note)
            .find(|n| n.contains(&keep))
            .ok_or_else(|| "none yet".to_string())
    })
    .await;
    for what in [QUOTA, LIMITS, OWNERS, ISOLATION] {
        assert!(note.contains(what), "the Event names {what}: {note}");
    }
    for (what, meta) in contents(&client, &keep).await {
        assert_released(&what, meta.as_ref(), &uid);
    }
    let ns = tenants::assert_retained(&client, &keep, &uid).await;
    assert!(
        ns.owner_references().is_empty(),
        "the released namespace is not adopted back: {:?}",
        ns.owner_references()
    );
    // Free, as the Event says: the namespace lost the owner-uid label too.
    assert_released("the released namespace", Some(&ns.metadata), &uid);
    eventually(
        "the record to drop the released objects",
        TIMEOUT,
        || async {
            let t: Tenant = tenants::api(&client).get(&name).await.map_err(why)?;
            let record = t.status.map(|s| s.created_children).unwrap_or_default();
            let left: Vec<String> = record
                .iter()
                .map(|c| c.key().to_string())
                .filter(|k| k.contains(&keep))
                .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    )
    .await;

    // The Tenant goes (deletionPolicy Delete): its other namespace is deleted, the released
    // one keeps everything, also once the garbage collector has processed the Tenant's dependents.
    let canary = canary(&client, &tenant).await;
    delete_tenant(&client, &name).await;
    wait_collected(&client, &canary).await;
    tenants::assert_retained(&client, &keep, &uid).await;
    for (what, meta) in contents(&client, &keep).await {
        assert_released(&what, meta.as_ref(), &uid);
    }
    assert_user_data(&client, &keep).await;
}

#[tokio::test]
async fn retaining_a_tenant_keeps_a_namespace_whose_owner_uid_label_was_removed() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("lbl");
    let mut spec = tenants::full_spec(&["a"]);
    spec.deletion_policy = DeletionPolicy::Retain;
    tenants::create(&client, &name, spec).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    let uid = tenant.uid().unwrap();
    let ns = format!("{name}-a");
    user_data(&client, &ns).await;

    // Paused, so nothing puts the labels back; then the label goes from the namespace and from
    // one child inside it. Their ownerReferences still say whose they are.
    tenants::pause(&client, &name).await;
    let unlabel = json!({"metadata": {"labels": {OWNER_UID_LABEL: null}}});
    Api::<Namespace>::all(client.clone())
        .patch(&ns, &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .patch(OWNERS, &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .unwrap();

    let canary = canary(&client, &tenant).await;
    delete_tenant(&client, &name).await;
    wait_collected(&client, &canary).await;
    tenants::assert_retained(&client, &ns, &uid).await;
    assert_user_data(&client, &ns).await;
    for (what, meta) in contents(&client, &ns).await {
        assert_released(&what, meta.as_ref(), &uid);
    }
    let note = tenants::wait_retained_note(&client, &name, &ns).await;
    assert!(note.contains("deletionPolicy is Retain"), "{note}");
}

#[tokio::test]
async fn a_tenant_owner_who_unclaims_idem_owners_cannot_keep_revoked_rights() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("rev");
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    let uid = tenant.uid().unwrap();
    let ns = format!("{name}-a");

    // alice, a tenant owner (`admin` in the namespace), takes the RoleBinding away from idem:
    // no ownerReference, no owner-uid label.
    Api::<RoleBinding>::namespaced(client_as("alice"), &ns)
        .patch(
            OWNERS,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "ownerReferences": null, "labels": {OWNER_UID_LABEL: null},
            }})),
        )
        .await
        .expect("alice may edit idem-owners");

    // The admin revokes alice (and the group): only bob stays.
    tenants::api(&client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"owners": [{"kind": "User", "name": "bob"}]}})),
        )
        .await
        .unwrap();
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), &ns);
    eventually(
        "idem-owners repaired to the new owners",
        TIMEOUT,
        || async {
            let t: Tenant = tenants::api(&client).get(&name).await.map_err(why)?;
            if let Some(stalled) = tenants::condition(&t, "Stalled")
                && stalled.status == "True"
                && stalled.observed_generation == t.metadata.generation
            {
                panic!(
                    "the Tenant is stalled instead of repairing idem-owners: {} {}",
                    stalled.reason, stalled.message
                );
            }
            let rb = bindings.get(OWNERS).await.map_err(why)?;
            let subjects: Vec<(String, String)> = rb
                .subjects
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|s| (s.kind, s.name))
                .collect();
            let owned = rb
                .owner_references()
                .iter()
                .any(|r| r.uid == uid && r.controller == Some(true));
            let labelled = rb.labels().get(OWNER_UID_LABEL) == Some(&uid);
            if subjects == [("User".to_string(), "bob".to_string())] && owned && labelled {
                Ok(())
            } else {
                Err(format!(
                    "subjects {subjects:?}, ownerReferences {:?}, labels {:?}",
                    rb.owner_references(),
                    rb.labels()
                ))
            }
        },
    )
    .await;
    tenants::wait_ready(&client, &name).await;
    delete_tenant(&client, &name).await;
}

#[tokio::test]
async fn a_child_a_tenant_owner_unclaims_and_opens_up_is_repaired_at_once() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("unc");
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    let uid = tenant.uid().unwrap();
    let ns = format!("{name}-a");

    // alice strips the isolation policy's ownerReference and owner-uid label and opens it to
    // every namespace; no spec change follows: the edit itself must bring the repair.
    Api::<NetworkPolicy>::namespaced(client_as("alice"), &ns)
        .patch(
            ISOLATION,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"ownerReferences": null, "labels": {OWNER_UID_LABEL: null}},
                "spec": {"ingress": [{}]},
            })),
        )
        .await
        .expect("alice may edit idem-isolation");
    let policies = Api::<NetworkPolicy>::namespaced(client.clone(), &ns);
    eventually("idem-isolation repaired", TIMEOUT, || async {
        let p = policies.get(ISOLATION).await.map_err(why)?;
        let owned = p
            .owner_references()
            .iter()
            .any(|r| r.uid == uid && r.controller == Some(true));
        let labelled = p.labels().get(OWNER_UID_LABEL) == Some(&uid);
        let from = p
            .spec
            .as_ref()
            .and_then(|s| s.ingress.as_ref())
            .and_then(|i| i.first())
            .and_then(|r| r.from.clone())
            .unwrap_or_default();
        if owned && labelled && from.len() == 1 {
            Ok(())
        } else {
            Err(format!(
                "{:?} {:?} {from:?}",
                p.owner_references(),
                p.labels()
            ))
        }
    })
    .await;
    delete_tenant(&client, &name).await;
}

#[tokio::test]
async fn a_recorded_child_a_tenant_owner_gives_another_controller_is_taken_back() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("ctl");
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    let uid = tenant.uid().unwrap();
    let ns = format!("{name}-a");

    // alice makes a ConfigMap of hers the controller of idem-owners (an owner that exists,
    // so the garbage collector leaves the RoleBinding alone), then the admin revokes her.
    let alice = client_as("alice");
    let mine: ConfigMap = Api::<ConfigMap>::namespaced(alice.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "alices"}})).unwrap(),
        )
        .await
        .expect("alice creates a ConfigMap");
    Api::<RoleBinding>::namespaced(alice, &ns)
        .patch(
            OWNERS,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "alices",
                "uid": mine.uid().unwrap(), "controller": true,
            }]}})),
        )
        .await
        .expect("alice may edit idem-owners");
    tenants::api(&client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"owners": [{"kind": "User", "name": "bob"}]}})),
        )
        .await
        .unwrap();
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), &ns);
    eventually("idem-owners taken back", TIMEOUT, || async {
        let rb = bindings.get(OWNERS).await.map_err(why)?;
        let controllers: Vec<&str> = rb
            .owner_references()
            .iter()
            .filter(|r| r.controller == Some(true))
            .map(|r| r.uid.as_str())
            .collect();
        let subjects: Vec<String> = rb
            .subjects
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|s| s.name)
            .collect();
        if controllers == [uid.as_str()] && subjects == ["bob"] {
            Ok(())
        } else {
            Err(format!(
                "controllers {controllers:?}, subjects {subjects:?}"
            ))
        }
    })
    .await;
    tenants::wait_ready(&client, &name).await;
    delete_tenant(&client, &name).await;
}
