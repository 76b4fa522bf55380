//! The operator watches its namespaces twice, not three times: once as the Tenants' children
//! (the Tenant controller's child cache) and once for their tenants (the TenantApp
//! controller's map of namespace to tenant, which the reconciles read too), never as whole
//! Namespaces in a cache of their own. Counted by the API server: the WATCH requests on
//! namespaces it holds open (`apiserver_longrunning_requests`) while the operator runs, less
//! those open before it started and again after it stopped. This binary has a control plane
//! of its own and runs one operator.

mod common;

use std::time::Duration;

use common::{Operator, POLL, TIMEOUT, install_crds, why};
use idem_tests::metrics::open_watches;
use idem_tests::shared;

/// Samples in a row that must agree before a count is taken: the other components' watches
/// (the API server's own, the controller-manager's, the scheduler's) open as they start and
/// reopen now and then, and a watch of the operator's opened late must show.
const STEADY: usize = 8;

/// The namespace watches the API server holds open now.
async fn namespace_watches() -> Result<u64, String> {
    let text = shared().metrics().await.map_err(why)?;
    Ok(open_watches(&text, "", "namespaces"))
}

/// Waits until [`STEADY`] samples in a row (one every [`POLL`]) agree on a count that `wanted`
/// accepts, and returns it.
///
/// # Panics
/// When none has within [`TIMEOUT`], naming `what` and the last count.
async fn steady(what: &str, wanted: impl Fn(u64) -> bool) -> u64 {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let (mut last, mut run, mut failed) = (None, 0, None);
    loop {
        match namespace_watches().await {
            Ok(now) if last == Some(now) => run += 1,
            Ok(now) => (last, run) = (Some(now), 1),
            Err(e) => (last, run, failed) = (None, 0, Some(e)),
        }
        if let Some(now) = last.filter(|n| run >= STEADY && wanted(*n)) {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {TIMEOUT:?} waiting for {what}; last: {last:?} open, {run} sample(s) in a row (last error: {failed:?})"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test]
async fn the_operator_holds_two_namespace_watches_one_for_children_one_for_tenants() {
    let client = shared().client();
    install_crds(&client).await;
    let before = steady("the control plane's namespace watches", |_| true).await;
    let operator = Operator::start(Duration::from_secs(600)).await;
    // Its own are those it adds to what was open before: two, and steadily so (a third opened
    // after `/readyz` said ready would break the run of samples and count).
    steady("two namespace watches of the operator's", |n| {
        n == before + 2
    })
    .await;
    operator.stop().await;
    // Gone with it, what was open before is open again: the count above was the operator's.
    steady("the namespace watches open before the operator", |n| {
        n == before
    })
    .await;
}
