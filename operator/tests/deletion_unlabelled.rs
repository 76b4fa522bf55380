//! Deleting a Tenant with `deletionPolicy: Delete` whose namespace lost its `owner-uid` label
//! (removed while the operator was stopped, so nothing put it back; a paused Tenant's deletion
//! would keep its namespaces): the finalizer finds the namespace by its ownerReference, deletes
//! it and waits for it, so once the Tenant is gone, so is the namespace. A binary of its own:
//! it stops its operator, which the tests of other binaries share.

mod common;

use common::process::OperatorProcess;
use common::{install_crds, tenants};
use idem_runtime::apply::OWNER_UID_LABEL;
use idem_tests::{create_namespace, shared, unique_name};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// One operator process, alone (no leader election, no shard ring), its Leases in `ns`.
fn operator(ns: &str, log_name: &str) -> OperatorProcess {
    OperatorProcess::spawn_with(shared().kubeconfig_path(), ns, log_name, |args| {
        args.into_iter()
            .filter(|a| a != "--leader-elect" && !a.starts_with("--shards"))
            .collect()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_tenant_with_policy_delete_waits_for_a_namespace_whose_owner_uid_label_was_removed()
 {
    let client = shared().client();
    install_crds(&client).await;
    let leases = create_namespace(&client, "unlabelled").await.unwrap();
    let first = operator(&leases, "first");
    let name = unique_name("dlbl");
    tenants::create(&client, &name, tenants::full_spec(&["a"])).await;
    tenants::wait_ready(&client, &name).await;
    let ns = format!("{name}-a");

    drop(first);
    Api::<Namespace>::all(client.clone())
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {OWNER_UID_LABEL: null}}})),
        )
        .await
        .unwrap();
    tenants::api(&client)
        .delete(&name, &Default::default())
        .await
        .unwrap();
    let second = operator(&leases, "second");
    tenants::wait_tenant_object_gone(&client, &name).await;
    let left = Api::<Namespace>::all(client.clone())
        .get_opt(&ns)
        .await
        .unwrap();
    assert!(
        left.is_none(),
        "the Tenant went before its namespace {ns}: {:?}",
        left.map(|n| n.metadata.deletion_timestamp)
    );
    drop(second);
}
