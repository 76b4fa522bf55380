//! Leader election on the real control plane: of two operators only the Lease holder
//! reconciles (the standby is live but not ready), and when the leader dies without releasing
//! the Lease the standby takes over once it expires.

mod common;

use std::time::Duration;

use common::tenants::{self, full_spec};
use common::{Operator, eventually, http_get, install_crds};
use idem_operator::leader::{LEASE_NAME, LEASE_SECONDS};
use idem_tests::{create_namespace, shared, unique_name};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

async fn holder(client: &kube::Client, ns: &str) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(LEASE_NAME)
        .await
        .ok()??;
    lease.spec?.holder_identity
}

#[tokio::test]
async fn the_standby_takes_over_when_the_leader_dies() {
    let client = shared().client();
    install_crds(&client).await;
    let ns = create_namespace(&client, "lease").await.unwrap();

    let leader = Operator::start_with(Duration::from_secs(600), Some((&ns, "op-a"))).await;
    assert_eq!(holder(&client, &ns).await.as_deref(), Some("op-a"));
    let mut standby = Operator::spawn_with(Duration::from_secs(600), Some((&ns, "op-b")));

    // The standby serves /healthz but is not ready: it runs no controllers.
    eventually("the standby's /healthz", common::TIMEOUT, || async {
        match http_get(standby.addr, "/healthz").await? {
            (200, _) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (code, _) = http_get(standby.addr, "/readyz").await.unwrap();
    assert_eq!(
        code, 503,
        "the standby must not be ready while the leader holds the Lease"
    );

    let first = unique_name("led-a");
    tenants::create(&client, &first, full_spec(&["x"])).await;
    tenants::wait_ready(&client, &first).await;
    assert_eq!(
        standby.reconciles("tenant").await,
        0,
        "the standby reconciled"
    );

    // The leader dies without releasing the Lease; the standby takes over after it expires.
    leader.kill();
    let second = unique_name("led-b");
    tenants::create(&client, &second, full_spec(&["y"])).await;
    let deadline = Duration::from_secs(LEASE_SECONDS * 4 + 30);
    eventually("the standby to hold the Lease", deadline, || async {
        match holder(&client, &ns).await.as_deref() {
            Some("op-b") => Ok(()),
            other => Err(format!("holder {other:?}")),
        }
    })
    .await;
    standby.wait_ready().await;
    tenants::wait_ready(&client, &second).await;
    assert!(
        standby.reconciles("tenant").await > 0,
        "the new leader did not reconcile"
    );
    standby.stop().await;
}
