//! Crash safety on the real control plane: an operator killed in the middle of converging a
//! large tenant, and started again (several times), ends in exactly the state an uninterrupted
//! run reaches — every child once, no duplicates, no leftovers.

mod common;

use std::time::Duration;

use common::tenants::{self, assert_full_children, full_spec, labelled};
use common::{Operator, TIMEOUT, install_crds};
use idem_tests::{shared, unique_name};
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;

/// Namespaces of the tenant under test: enough for its convergence to take a while.
const NAMESPACES: usize = 10;
/// Children per namespace with [`full_spec`] of the kinds [`progress`] counts: the Namespace,
/// quota, LimitRange, the owners' and the readers' RoleBindings and the NetworkPolicy.
const PER_NAMESPACE: usize = 6;

/// How many of the tenant's children exist (labelled for it), over every kind.
async fn progress(client: &kube::Client, name: &str) -> usize {
    labelled::<Namespace>(client, name).await.len()
        + labelled::<ResourceQuota>(client, name).await.len()
        + labelled::<LimitRange>(client, name).await.len()
        + labelled::<RoleBinding>(client, name).await.len()
        + labelled::<NetworkPolicy>(client, name).await.len()
}

#[tokio::test]
async fn an_operator_killed_mid_convergence_and_restarted_converges_without_duplicates() {
    let client = shared().client();
    install_crds(&client).await;
    let name = unique_name("kill");
    let shorts: Vec<String> = (0..NAMESPACES).map(|i| format!("ns{i}")).collect();
    let shorts: Vec<&str> = shorts.iter().map(String::as_str).collect();
    tenants::create(&client, &name, full_spec(&shorts)).await;
    let total = NAMESPACES * PER_NAMESPACE;

    // Start an operator, kill it as soon as it has made progress, and again, until the
    // children are complete (or the rounds run out).
    let mut seen = 0;
    let mut kills_mid_way = Vec::new();
    for _round in 0..12 {
        let operator = Operator::spawn(Duration::from_secs(3600));
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let now = loop {
            let now = progress(&client, &name).await;
            if now > seen {
                break now;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no progress past {seen} children"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        operator.kill();
        if now < total {
            kills_mid_way.push(now);
        }
        seen = now;
        if now >= total {
            break;
        }
    }
    eprintln!("killed with {kills_mid_way:?} of {total} children in place");
    assert!(
        !kills_mid_way.is_empty(),
        "the operator was never killed mid-convergence: the test proved nothing"
    );

    // A last operator converges to exactly the full state.
    let operator = Operator::start(Duration::from_secs(3600)).await;
    let tenant = tenants::wait_ready(&client, &name).await;
    assert_full_children(&client, &tenant, &shorts).await;
    assert_eq!(progress(&client, &name).await, total, "no extra children");
    operator.stop().await;
}
