//! A restart replays every Tenant at low priority: a user's change made while the new
//! operator replays the fleet is reconciled before the replay ends (issue 11, item 4).

mod common;

use std::time::Duration;

use common::tenants::{self, full_spec, quantities};
use common::{Operator, TIMEOUT, eventually, install_crds, why};
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Tenants in the fleet.
const N: usize = 120;

#[tokio::test]
async fn a_change_during_the_restart_replay_is_reconciled_before_the_replay_ends() {
    let client = shared().client();
    install_crds(&client).await;
    let prefix = unique_name("rp");
    let names: Vec<String> = (0..N).map(|i| format!("{prefix}-{i:03}")).collect();
    let operator = Operator::start(Duration::from_secs(3600)).await;
    for name in &names {
        tenants::create(&client, name, full_spec(&["a"])).await;
    }
    for name in &names {
        tenants::wait_ready(&client, name).await;
    }
    operator.stop().await;

    // Restart with one worker, so the replay of the whole fleet takes a while; then change
    // the tenant the list returns last among ours.
    let operator = Operator::spawn_configured(Duration::from_secs(3600), None, |o| {
        o.workers = 1;
    });
    let mut operator = operator;
    operator.wait_ready().await;
    let last = names.last().unwrap();
    tenants::api(&client)
        .patch(
            last,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"quota": {"hard": {"pods": "21"}}}})),
        )
        .await
        .unwrap();
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &format!("{last}-a"));
    let want = quantities(&[("pods", "21")]);
    eventually("the changed quota", TIMEOUT, || async {
        let q = quotas.get("idem-quota").await.map_err(why)?;
        let hard = q.spec.and_then(|s| s.hard).unwrap_or_default();
        (hard.get("pods") == want.get("pods"))
            .then_some(())
            .ok_or_else(|| format!("{hard:?}"))
    })
    .await;
    let replayed = operator.reconciles("tenant").await;
    println!("the change was applied after {replayed} Tenant reconciles of a {N}+ replay");
    assert!(
        replayed < (N / 2) as u64,
        "the change waited behind the replay: {replayed} reconciles first"
    );
    operator.stop().await;
}
