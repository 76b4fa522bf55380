//! A restart replays every Tenant at low priority: a user's change made while the new
//! operator replays the fleet is reconciled before the replay ends.

mod common;

use std::time::Duration;

use common::tenants::{self, full_spec, quantities};
use common::{Operator, TIMEOUT, install_crds, why};
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
    // With read-repair from the caches a converged replay reconcile makes no request and
    // takes milliseconds, so part of the replay may be done before the change is even made:
    // count only the reconciles after it.
    let before = operator.reconciles("tenant").await;
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
    // Polled tightly (not with `eventually`'s interval): a converged replay reconcile takes a
    // few milliseconds, so a coarse poll would count the replay done while it waited.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let hard = quotas
            .get_opt("idem-quota")
            .await
            .map_err(why)
            .unwrap()
            .and_then(|q| q.spec)
            .and_then(|s| s.hard)
            .unwrap_or_default();
        if hard.get("pods") == want.get("pods") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the changed quota was never applied: {hard:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let after = operator.reconciles("tenant").await;
    let left = (N as u64).saturating_sub(before);
    println!(
        "{before} Tenant reconciles before the change; applied after {} more, with {left} of the {N}+ replay left",
        after - before
    );
    assert!(
        left >= (N / 4) as u64,
        "the replay was nearly over before the change was made ({before} of {N}): the test shows nothing"
    );
    assert!(
        after - before < left / 2,
        "the change waited behind the replay: {} reconciles first, {left} were left",
        after - before
    );
    operator.stop().await;
}
