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
use k8s_openapi::api::core::v1::Namespace;
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
/// it is still in effect until it is gone, so the Tenant is `Reconciling`
/// (`NamespaceTerminating`, naming it) and keeps it in its record until then, and is `Ready`
/// (without it in the record) once the hold is released.
#[tokio::test]
async fn a_removed_namespace_held_by_a_finalizer_keeps_the_tenant_from_ready() {
    shared_operator().await;
    let client = shared().client();
    let name = unique_name("heldns");
    tenants::create(&client, &name, tenants::full_spec(&["a", "b"])).await;
    tenants::wait_ready(&client, &name).await;
    let old = format!("{name}-b");
    let namespaces = Api::<Namespace>::all(client.clone());
    let keep = json!({"metadata": {"finalizers": ["example.com/keep"]}});
    namespaces
        .patch(&old, &PatchParams::default(), &Patch::Merge(&keep))
        .await
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
    assert!(
        reconciling.message.contains(&old) && reconciling.message.contains("example.com/keep"),
        "{reconciling:?}"
    );
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
    let release = json!({"metadata": {"finalizers": null}});
    namespaces
        .patch(&old, &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("the release");
    tenants::wait_ready(&client, &name).await;
    // Gone, it leaves the record (the pass that sees it gone may follow the first Ready).
    idem_tests::eventually("the namespace out of the record", || async {
        let t = tenants::api(&client).get(&name).await.map_err(why)?;
        if recorded(&t) {
            Err(format!("{:?}", t.status))
        } else {
            Ok(())
        }
    })
    .await;
}
