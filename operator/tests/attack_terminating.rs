//! Attack: a tenant owner tries to keep rights an administrator revoked by leaving
//! `idem-owners` terminating (a finalizer of theirs, then a delete). A terminating binding
//! still grants, so the operator repairs it in place while it waits for the deletion to finish:
//! the revocation takes effect at once.

mod common;
use common::users::client_as;

use std::time::Duration;

use common::{shared_operator, tenants, why};
use idem_operator::tenant::desired::{OWNERS, ROLE_BINDING_PREFIX};
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

#[tokio::test]
async fn a_revoked_owner_cannot_keep_rights_through_a_terminating_idem_owners() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("term");
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;
    tenants::wait_ready(&client, &name).await;
    let ns = format!("{name}-a");

    // alice, an owner (`admin` in the namespace), pins idem-owners with a finalizer of hers
    // and deletes it: it stays, terminating, and still grants.
    let as_alice = Api::<RoleBinding>::namespaced(client_as("alice"), &ns);
    as_alice
        .patch(
            OWNERS,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/keep"]}})),
        )
        .await
        .expect("alice may edit idem-owners");
    as_alice
        .delete(OWNERS, &DeleteParams::default())
        .await
        .expect("alice may delete idem-owners");

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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let outcome = loop {
        let rb = bindings.get_opt(OWNERS).await.map_err(why).unwrap();
        let alice = rb
            .as_ref()
            .and_then(|rb| rb.subjects.as_ref())
            .is_some_and(|s| s.iter().any(|s| s.name == "alice"));
        if !alice {
            break Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            let t = tenants::api(&client).get(&name).await.unwrap();
            break Err(format!(
                "60 s after the revocation idem-owners still binds alice (deletionTimestamp {:?}); Tenant conditions: {:?}",
                rb.and_then(|rb| rb.metadata.deletion_timestamp),
                t.status.map(|s| s
                    .conditions
                    .into_iter()
                    .map(|c| (c.type_, c.reason, c.message))
                    .collect::<Vec<_>>())
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Clean up before asserting.
    let _ = bindings
        .patch(
            OWNERS,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await;
    if let Err(e) = outcome {
        panic!("a revoked owner kept admin through a terminating idem-owners: {e}");
    }
}

/// The same pin on a binding the administrator then removes from `roleBindings`: deleted, it
/// still grants while the finalizer holds it, so the Tenant is not `Ready` until it is gone.
#[tokio::test]
async fn a_removed_binding_held_by_an_owners_finalizer_keeps_the_tenant_from_ready() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("held");
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;
    tenants::wait_ready(&client, &name).await;
    let ns = format!("{name}-a");
    let readers = format!("{ROLE_BINDING_PREFIX}readers");
    let as_alice = Api::<RoleBinding>::namespaced(client_as("alice"), &ns);
    as_alice
        .patch(
            &readers,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/keep"]}})),
        )
        .await
        .expect("alice may edit the binding");
    tenants::api(&client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"roleBindings": []}})),
        )
        .await
        .unwrap();
    let t = tenants::wait_condition(&client, &name, "Reconciling", "ChildTerminating").await;
    let reconciling = tenants::condition(&t, "Reconciling").unwrap();
    assert!(
        reconciling.message.contains(&readers) && reconciling.message.contains("example.com/keep"),
        "{reconciling:?}"
    );
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), &ns);
    let held = bindings.get(&readers).await.map_err(why).unwrap();
    assert!(held.metadata.deletion_timestamp.is_some(), "deleted, held");
    // Released, it goes, and the Tenant is Ready.
    bindings
        .patch(
            &readers,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    tenants::wait_ready(&client, &name).await;
}

/// A namespace the administrator removes from the Tenant, held by a finalizer on it: what is in
/// it is still in effect until it is gone, so the Tenant is not `Ready` until then.
#[tokio::test]
async fn a_removed_namespace_held_by_a_finalizer_keeps_the_tenant_from_ready() {
    removed_namespace_held(Hold::Namespace).await;
}

/// The usual hold: an owner's finalizer on an object in a namespace the administrator removes
/// from the Tenant. The namespace waits for its contents (no finalizer of its own), and is in
/// effect until it is gone.
#[tokio::test]
async fn a_removed_namespace_held_by_its_contents_keeps_the_tenant_from_ready() {
    removed_namespace_held(Hold::Contents).await;
}

/// What holds the deletion of a namespace in [`removed_namespace_held`].
#[derive(Clone, Copy)]
enum Hold {
    /// The administrator's finalizer on the Namespace.
    Namespace,
    /// Owner alice's finalizer on a ConfigMap of hers in it.
    Contents,
}

/// The Tenant is `Reconciling` (`NamespaceTerminating`, naming the namespace) while the
/// namespace removed from its spec is held, keeps it in its record meanwhile, and is `Ready`
/// (without it in the record) once the hold is released.
async fn removed_namespace_held(hold: Hold) {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("heldns");
    tenants::create(&client, &name, tenants::full_spec(&["a", "b"])).await;
    tenants::wait_ready(&client, &name).await;
    let old = format!("{name}-b");
    let keep = json!({"metadata": {"finalizers": ["example.com/keep"]}});
    let release = json!({"metadata": {"finalizers": null}});
    let namespaces = Api::<Namespace>::all(client.clone());
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), &old);
    match hold {
        Hold::Namespace => namespaces
            .patch(&old, &PatchParams::default(), &Patch::Merge(&keep))
            .await
            .map(drop),
        Hold::Contents => {
            let mut held: ConfigMap = serde_json::from_value(keep.clone()).unwrap();
            held.metadata.name = Some("held".into());
            Api::<ConfigMap>::namespaced(client_as("alice"), &old)
                .create(&Default::default(), &held)
                .await
                .map(drop)
        }
    }
    .expect("the hold");
    tenants::api(&client)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"namespaces": ["a"]}})),
        )
        .await
        .unwrap();
    let t = tenants::wait_condition(&client, &name, "Reconciling", "NamespaceTerminating").await;
    let reconciling = tenants::condition(&t, "Reconciling").unwrap();
    assert!(reconciling.message.contains(&old), "{reconciling:?}");
    if let Hold::Namespace = hold {
        assert!(
            reconciling.message.contains("example.com/keep"),
            "{reconciling:?}"
        );
    }
    let recorded = |t: &idem_operator::resources::Tenant| {
        t.status.as_ref().is_some_and(|s| {
            s.created_children
                .iter()
                .any(|c| c.kind == "Namespace" && c.name == old)
        })
    };
    assert!(recorded(&t), "still recorded while it is there");
    let ns = namespaces.get(&old).await.map_err(why).unwrap();
    assert!(ns.metadata.deletion_timestamp.is_some(), "deleted, held");
    match hold {
        Hold::Namespace => namespaces
            .patch(&old, &PatchParams::default(), &Patch::Merge(&release))
            .await
            .map(drop),
        Hold::Contents => config_maps
            .patch("held", &PatchParams::default(), &Patch::Merge(&release))
            .await
            .map(drop),
    }
    .expect("the release");
    let t = tenants::wait_ready(&client, &name).await;
    assert!(!recorded(&t), "gone: out of the record");
}

/// A Tenant deleted with `deletionPolicy: Delete` whose namespace an owner's finalizer (on an
/// object in it) holds: the Tenant stays, `Reconciling` (`Deleting`, naming the namespace),
/// until the namespace is gone, and goes once the hold is released.
#[tokio::test]
async fn a_deleted_tenants_held_namespace_keeps_the_tenant_until_it_is_gone() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("helddel");
    let mut spec = tenants::full_spec(&["a"]);
    spec.deletion_policy = idem_operator::resources::tenant::DeletionPolicy::Delete;
    tenants::create(&client, &name, spec).await;
    tenants::wait_ready(&client, &name).await;
    let ns = format!("{name}-a");
    let mut held: ConfigMap =
        serde_json::from_value(json!({"metadata": {"finalizers": ["example.com/keep"]}})).unwrap();
    held.metadata.name = Some("held".into());
    Api::<ConfigMap>::namespaced(client_as("alice"), &ns)
        .create(&Default::default(), &held)
        .await
        .expect("alice's held ConfigMap");
    tenants::api(&client)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let t = tenants::wait_condition(&client, &name, "Reconciling", "Deleting").await;
    let message = &tenants::condition(&t, "Reconciling").unwrap().message;
    assert!(message.contains(&ns), "{message}");
    let namespaces = Api::<Namespace>::all(client.clone());
    let live = namespaces.get(&ns).await.map_err(why).unwrap();
    assert!(live.metadata.deletion_timestamp.is_some(), "deleted, held");
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("the release");
    tenants::wait_tenant_object_gone(&client, &name).await;
    assert!(
        namespaces
            .get_opt(&ns)
            .await
            .map_err(why)
            .unwrap()
            .is_none(),
        "the Tenant went only once its namespace was gone"
    );
}
