//! The shipped cleanup guard, on the real control plane with the operator as deployed: an
//! administrator who removes a deleted Tenant's finalizer while the operator is down is refused
//! (the garbage collector would delete the namespaces `deletionPolicy: Retain` keeps, and the
//! data in them), also after a condition of another type got the mark's reason; the operator,
//! once back, marks the cleanup done and removes the finalizer itself; an administrator who
//! writes the mark on purpose may remove it; a Tenant not being deleted may lose it.

mod common;

use common::deployed::{install, operator_kubeconfig};
use common::process::OperatorProcess;
use common::users::{assert_user_data, user_data};
use common::{TIMEOUT, eventually, tenants};
use idem_operator::resources::{FINALIZER, Tenant};
use idem_runtime::reconciler::cleanup_guard::CLEANUP_DONE;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use idem_tests::{shared, unique_name};

/// Creates a Tenant `name` with one namespace `a`, as a user would (no deletion policy said).
async fn create(tenants: &Api<Tenant>, name: &str) {
    let tenant: Tenant = serde_json::from_value(json!({
        "apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": name},
        "spec": {"namespaces": ["a"], "owners": [{"kind": "User", "name": "alice"}]}
    }))
    .unwrap();
    tenants
        .create(&PostParams::default(), &tenant)
        .await
        .unwrap();
}

/// Removes every finalizer of Tenant `name` as the admin, with `dry_run` or for real.
async fn remove_finalizers(tenants: &Api<Tenant>, name: &str, dry_run: bool) -> kube::Result<()> {
    let pp = PatchParams {
        dry_run,
        ..PatchParams::default()
    };
    tenants
        .patch(
            name,
            &pp,
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .map(|_| ())
}

/// One test at a time: each stops its operator to act as an administrator while the operator
/// is down, and another test's operator, running meanwhile on the same control plane, would
/// reconcile this test's Tenants (put a removed finalizer back before the deletion it tries).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The operator as deployed (its ServiceAccount, under the shipped policies).
fn deployed_operator() -> OperatorProcess {
    OperatorProcess::spawn_with(
        &operator_kubeconfig(),
        "idem-system",
        &unique_name("op"),
        |a| a,
    )
}

/// A Tenant named after `prefix`, Ready, with user data in its namespace `a`: its name, that
/// namespace and its uid.
async fn ready_with_data(client: &kube::Client, prefix: &str) -> (String, String, String) {
    let name = unique_name(prefix);
    let ns = format!("{name}-a");
    create(&tenants::api(client), &name).await;
    let uid = tenants::wait_ready(client, &name).await.uid().unwrap();
    user_data(client, &ns).await;
    (name, ns, uid)
}

/// Waits until a dry run of deleting Tenant `name` with `dp` is refused (the API server has
/// loaded the shipped policy: admission runs on dry runs too).
async fn refused_once_loaded(tenants: &Api<Tenant>, name: &str, dp: DeleteParams, what: &str) {
    let dry = DeleteParams {
        dry_run: true,
        ..dp
    };
    eventually(what, TIMEOUT, || async {
        match tenants.delete(name, &dry).await {
            Ok(_) => Err("admitted".to_string()),
            Err(e) => Ok(e),
        }
    })
    .await;
}

/// Waits until the operator has put its finalizer back on Tenant `name`, alone.
async fn finalizer_back(tenants: &Api<Tenant>, name: &str) {
    eventually("the operator puts the finalizer back", TIMEOUT, || async {
        let t = tenants.get(name).await.map_err(|e| e.to_string())?;
        match t.finalizers() {
            [f] if f == FINALIZER => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_tenants_finalizer_removed_by_hand_is_refused_until_its_cleanup_is_marked_done() {
    let _serial = SERIAL.lock().await;
    install().await;
    let client = shared().client();
    let tenants = tenants::api(&client);
    let (kept, skipped) = (unique_name("guard"), unique_name("guard-skip"));
    let ns = format!("{kept}-a");

    let operator = deployed_operator();
    create(&tenants, &kept).await;
    create(&tenants, &skipped).await;
    let uid = tenants::wait_ready(&client, &kept).await.uid().unwrap();
    tenants::wait_ready(&client, &skipped).await;
    user_data(&client, &ns).await;

    // The operator goes down; an administrator deletes a Tenant, and it waits on the
    // finalizer.
    drop(operator);
    tenants
        .delete(&kept, &DeleteParams::default())
        .await
        .unwrap();

    // Removing the finalizer is refused, with the way out in the message. (The dry run waits
    // until the API server has loaded the shipped policy: admission runs on dry runs too.)
    eventually("the guard refuses a dry-run removal", TIMEOUT, || async {
        match remove_finalizers(&tenants, &kept, true).await {
            Ok(()) => Err("admitted".to_string()),
            Err(e) => Ok(e),
        }
    })
    .await;
    let refused = remove_finalizers(&tenants, &kept, false)
        .await
        .expect_err("removing the finalizer of a Tenant not cleaned up is refused");
    let said = refused.to_string();
    assert!(
        said.contains(FINALIZER)
            && said.contains(CLEANUP_DONE)
            && said.contains("garbage collector"),
        "{said}"
    );
    let held = tenants.get(&kept).await.unwrap();
    assert_eq!(held.finalizers(), [FINALIZER.to_string()]);
    let namespace = Api::<Namespace>::all(client.clone())
        .get(&ns)
        .await
        .unwrap();
    assert!(
        namespace.metadata.deletion_timestamp.is_none(),
        "{ns} is being deleted"
    );
    assert!(
        namespace.owner_references().iter().any(|r| r.uid == uid),
        "{ns} still refers to its Tenant (what the garbage collector would follow)"
    );

    // A condition of another type with that reason is no mark.
    let forged = json!([{"op": "add", "path": "/status/conditions/-", "value": {
        "type": "example.com/Skip", "status": "True", "reason": CLEANUP_DONE,
        "message": "forged", "lastTransitionTime": "2026-01-01T00:00:00Z"}}]);
    tenants
        .patch_status(
            &kept,
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(forged).unwrap()),
        )
        .await
        .unwrap();
    remove_finalizers(&tenants, &kept, false)
        .await
        .expect_err("a condition of another type does not mark the cleanup done");

    // A Tenant not being deleted may lose it (a `kubectl replace` of a manifest without it):
    // the operator puts it back.
    remove_finalizers(&tenants, &skipped, true)
        .await
        .expect("the guard leaves a Tenant not being deleted alone");

    // Written on purpose, the mark lets an administrator remove the finalizer.
    tenants
        .delete(&skipped, &DeleteParams::default())
        .await
        .unwrap();
    let mark = json!({"status": {"conditions": [{"type": "Ready", "status": "False",
        "reason": CLEANUP_DONE, "message": "skipped on purpose",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    tenants
        .patch_status(&skipped, &PatchParams::default(), &Patch::Merge(mark))
        .await
        .unwrap();
    remove_finalizers(&tenants, &skipped, false)
        .await
        .expect("the finalizer may go once the status says the cleanup is done");
    tenants::wait_tenant_object_gone(&client, &skipped).await;

    // Back up, the operator does the cleanup, marks it and removes the finalizer under the
    // guard: the Tenant goes, its namespace and the data in it stay.
    let _operator = deployed_operator();
    tenants::wait_tenant_object_gone(&client, &kept).await;
    tenants::assert_retained(&client, &ns, &uid).await;
    assert_user_data(&client, &ns).await;
}

/// A Tenant deleted in the foreground (what `kubectl delete --cascade=foreground` and some
/// GitOps tools send) is refused: the garbage collector would have deleted its namespaces, and
/// the data in them, before the cleanup released them (`deletionPolicy: Retain`, the default;
/// found by an adversarial trial). Deleted in the background, it keeps them.
#[tokio::test]
async fn a_tenant_deleted_in_the_foreground_is_refused_and_in_the_background_keeps_its_data() {
    let _serial = SERIAL.lock().await;
    install().await;
    let client = shared().client();
    let tenants = tenants::api(&client);
    let _operator = deployed_operator();
    let (name, ns, uid) = ready_with_data(&client, "fore").await;

    refused_once_loaded(
        &tenants,
        &name,
        DeleteParams::foreground(),
        "the guard refuses a dry-run foreground deletion",
    )
    .await;
    let refused = tenants
        .delete(&name, &DeleteParams::foreground())
        .await
        .expect_err("a foreground deletion of a Tenant with the cleanup finalizer is refused");
    let said = refused.to_string();
    assert!(
        said.contains("foreground") && said.contains("garbage collector"),
        "{said}"
    );
    let live = tenants.get(&name).await.unwrap();
    assert!(
        live.metadata.deletion_timestamp.is_none(),
        "{name} is being deleted"
    );
    // Nor may it get the `foregroundDeletion` finalizer, which makes any deletion of it one in
    // the foreground (also the one deleting the CRD makes, which no admission sees); nor may a
    // Tenant be created with it.
    let mut finalizers = live.finalizers().to_vec();
    finalizers.push("foregroundDeletion".into());
    let refused = tenants
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
        )
        .await
        .expect_err("the foregroundDeletion finalizer added to a Tenant is refused");
    assert!(
        refused.to_string().contains("foregroundDeletion"),
        "{refused}"
    );
    let born: Tenant = serde_json::from_value(json!({
        "apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "Tenant",
        "metadata": {"name": unique_name("fore-born"), "finalizers": ["foregroundDeletion"]},
        "spec": {"namespaces": ["a"]}
    }))
    .unwrap();
    tenants
        .create(&PostParams::default(), &born)
        .await
        .expect_err("a Tenant created with the foregroundDeletion finalizer is refused");
    // Nor in two steps: the cleanup finalizer removed first (a Tenant not being deleted may
    // lose it), then `foregroundDeletion` given.
    remove_finalizers(&tenants, &name, false)
        .await
        .expect("a Tenant not being deleted may lose its finalizer");
    tenants
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["foregroundDeletion"]}})),
        )
        .await
        .expect_err(
            "foregroundDeletion given to a Tenant without the cleanup finalizer is refused",
        );
    finalizer_back(&tenants, &name).await;

    tenants
        .delete(&name, &DeleteParams::background())
        .await
        .unwrap();
    tenants::wait_tenant_object_gone(&client, &name).await;
    tenants::assert_retained(&client, &ns, &uid).await;
    assert_user_data(&client, &ns).await;
}

/// A Tenant whose finalizer was removed while it was not being deleted (a `kubectl replace` or
/// edit of a manifest without it) while the operator was down is not deleted until the
/// operator has put the finalizer back: deleted so, the garbage collector would delete its
/// namespaces and the data in them (found by an adversarial trial, also with a sharded replica
/// killed). Once it is back, the deletion keeps them.
#[tokio::test]
async fn a_tenant_that_lost_its_finalizer_is_not_deleted_until_its_operator_put_it_back() {
    let _serial = SERIAL.lock().await;
    install().await;
    let client = shared().client();
    let tenants = tenants::api(&client);
    let operator = deployed_operator();
    let (name, ns, uid) = ready_with_data(&client, "lost").await;
    drop(operator);
    remove_finalizers(&tenants, &name, false)
        .await
        .expect("a Tenant not being deleted may lose its finalizer");

    refused_once_loaded(
        &tenants,
        &name,
        DeleteParams::default(),
        "the guard refuses a dry-run deletion",
    )
    .await;
    let refused = tenants
        .delete(&name, &DeleteParams::default())
        .await
        .expect_err("deleting a Tenant that lost its finalizer is refused");
    let said = refused.to_string();
    assert!(
        said.contains("lost the finalizer") && said.contains(CLEANUP_DONE),
        "{said}"
    );

    let _operator = deployed_operator();
    finalizer_back(&tenants, &name).await;
    tenants
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    tenants::wait_tenant_object_gone(&client, &name).await;
    tenants::assert_retained(&client, &ns, &uid).await;
    assert_user_data(&client, &ns).await;
}
