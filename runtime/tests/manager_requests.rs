//! `run --requests-in-flight` against the real control plane: the example's `BaseTenant`
//! manager (runtime/examples/base_tenant.rs) puts its reconciles' requests through request
//! slots of the cap the flag says — pinned, self-tuning (the default) or none — and reconciles
//! with each. How the slots share and tune is unit-tested with `inflight`.

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;

use std::time::Duration;

use base_tenant::{BaseTenant, BaseTenantSpec, BaseTenants};
use idem_runtime::manager::{Manager, ManagerOptions, Reconciles, RequestsInFlight};
use idem_tests::ports::free_addr;
use idem_tests::{shared, unique_name};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

/// Longest wait for any condition (two cores, other builds beside the tests).
const TIMEOUT: Duration = Duration::from_secs(180);

/// The value of gauge `name` in a `/metrics` text.
fn gauge(metrics: &str, name: &str) -> Option<i64> {
    (metrics.lines())
        .find(|l| l.split([' ', '{']).next() == Some(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn ready(t: &BaseTenant) -> bool {
    t.status.as_ref().is_some_and(|s| {
        s.observed_generation == t.metadata.generation
            && (s.conditions.iter()).any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_sets_the_cap_of_the_reconciles_requests() {
    let client = shared().client();
    base_tenant::install_crd(&client).await.unwrap();
    let tenants = Api::<BaseTenant>::all(client.clone());
    // (flag, the gauge `idem_request_slots_limit` once the tenant is Ready): a pinned cap is
    // that cap; `auto` starts at 4 and moves within 1..=64; `0` installs no slots at all.
    let settings = [
        (RequestsInFlight::Fixed(1), Some(1..=1)),
        (RequestsInFlight::Auto, Some(1..=64)),
        (RequestsInFlight::Unlimited, None),
    ];
    for (setting, expected) in settings {
        let addr = free_addr();
        let options = ManagerOptions {
            kubeconfig: Some(shared().kubeconfig_path().to_path_buf()),
            workers: 2,
            metrics_addr: addr,
            health_addr: addr,
            shutdown_grace: Duration::from_secs(10),
            requests_in_flight: setting,
            ..ManagerOptions::default()
        };
        let manager = Manager::new(unique_name("slots"), options).add(Reconciles::new(BaseTenants));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(manager.run_until(async move {
            let _ = stopped.await;
        }));
        let name = unique_name("slots");
        let spec = BaseTenantSpec {
            owners: vec!["alice".into()],
            cpu: "1".into(),
            memory: "1Gi".into(),
        };
        tenants
            .create(&PostParams::default(), &BaseTenant::new(&name, spec))
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let text = loop {
            assert!(!task.is_finished(), "{setting:?}: the manager exited");
            let converged = tenants.get(&name).await.is_ok_and(|t| ready(&t));
            if let Some(text) = idem_tests::metrics::scrape(addr)
                .await
                .filter(|_| converged)
            {
                break text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{setting:?}: BaseTenant {name} not Ready within {TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let limit = gauge(&text, "idem_request_slots_limit");
        println!("{setting:?}: idem_request_slots_limit {limit:?}");
        match expected {
            Some(range) => assert!(
                limit.is_some_and(|l| range.contains(&l)),
                "{setting:?}: idem_request_slots_limit {limit:?}, expected in {range:?}"
            ),
            None => assert_eq!(limit, None, "{setting:?}: no slots, no gauge"),
        }
        let _ = stop.send(());
        let result = tokio::time::timeout(TIMEOUT, task).await;
        result.expect("stops in time").expect("no panic").unwrap();
        tenants
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    }
}
