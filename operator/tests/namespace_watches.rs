//! The operator watches its namespaces twice, not three times: once as the Tenants' children
//! (the Tenant controller's child cache) and once for their tenants (the TenantApp
//! controller's map of namespace to tenant, which the reconciles read too), never as whole
//! Namespaces in a cache of their own. Counted by the API server: the WATCH requests on
//! namespaces it holds open (`apiserver_longrunning_requests`) while the operator runs, less
//! those open before it started and again after it stopped. This binary has a control plane
//! of its own and runs one operator.

mod common;

use std::time::Duration;

use common::{Operator, TIMEOUT, eventually, install_crds, why};
use idem_tests::metrics::open_watches;
use idem_tests::shared;

/// The namespace watches the API server holds open now.
async fn namespace_watches() -> Result<u64, String> {
    let text = shared().metrics().await.map_err(why)?;
    Ok(open_watches(&text, "", "namespaces"))
}

#[tokio::test]
async fn the_operator_holds_two_namespace_watches_one_for_children_one_for_tenants() {
    let client = shared().client();
    install_crds(&client).await;
    let before = namespace_watches()
        .await
        .expect("the API server's /metrics");
    let operator = Operator::start(Duration::from_secs(600)).await;
    // Ready: every watch of both controllers has listed and is open. Its own are those it
    // adds to what was open before.
    eventually("the operator's two namespace watches", TIMEOUT, || async {
        let running = namespace_watches().await?;
        match running.saturating_sub(before) {
            2 => Ok(()),
            n => Err(format!(
                "{n} namespace watches besides the {before} open before it started"
            )),
        }
    })
    .await;
    operator.stop().await;
    // Gone with it: what was open before is open again, so the count above was the operator's.
    eventually(
        "the operator's namespace watches closed",
        TIMEOUT,
        || async {
            match namespace_watches().await? {
                n if n == before => Ok(()),
                n => Err(format!("{n} open, {before} before the operator started")),
            }
        },
    )
    .await;
}
