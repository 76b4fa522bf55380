//! Stale reads are safe for the operator's Tenant: its controller (the operator's own, on a
//! client whose watch events arrive 4 s late, as behind a lagging API server of several) sees
//! the namespaces go [x] → [x, y] → [x] at once. The pass of the stale [x, y] creates
//! `<tenant>-y` and what goes in it; once the Tenant is `Ready` at the last generation, that
//! namespace must be gone (or going) and the record must name only what belongs to `x`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::tenants::{self, full_spec};
use common::{TIMEOUT, eventually, install_crds, why};
use futures::StreamExt;
use idem_operator::context::Context;
use idem_operator::resources::Tenant;
use idem_operator::tenant::reconcile::Tenants;
use idem_runtime::apply::MANAGED_BY_LABEL;
use idem_runtime::controller::ControllerConfig;
use idem_runtime::reconciler::Driver;
use idem_tests::faults::Faults;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use tokio::sync::oneshot;

/// How late the controller's watch events arrive.
const DELAY: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread")]
async fn namespaces_flipped_while_watch_events_arrive_late_leak_nothing() {
    let admin = idem_tests::shared().client();
    install_crds(&admin).await;

    // The Tenant controller as the manager builds it, on a client whose watch events the test
    // delays (its other requests are answered at once). Its context reads namespaces' tenants
    // from a namespace watch of its own (the manager's reads the TenantApp controller's, which
    // this test does not run).
    let faults = Faults::new();
    let client = faults
        .client(idem_tests::shared().config())
        .expect("a client");
    let (store, writer) = reflector::store::<Namespace>();
    let selector = format!("{MANAGED_BY_LABEL}={}", Tenant::FIELD_MANAGER);
    let ns_watch = tokio::spawn(
        watcher(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default().labels(&selector),
        )
        .default_backoff()
        .reflect(writer)
        .for_each(|_| futures::future::ready(())),
    );
    let ctx = Context::new(client.clone(), store);
    let driver = Driver::new(
        client.clone(),
        Tenants {
            ctx: Arc::clone(&ctx),
        },
    )
    .with_caches(ctx.caches.clone());
    let controller = idem_operator::tenant::source::controller(
        &client,
        ControllerConfig {
            resync_period: Duration::ZERO,
            ..ControllerConfig::default()
        },
        None,
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(driver.run(controller, async {
        let _ = stopped.await;
    }));

    let name = idem_tests::unique_name("stale");
    tenants::create(&admin, &name, full_spec(&["x"])).await;
    tenants::wait_ready(&admin, &name).await;

    faults.delay_watches(DELAY);
    let api = tenants::api(&admin);
    let pp = PatchParams::default();
    for namespaces in [json!(["x", "y"]), json!(["x"])] {
        api.patch(
            &name,
            &pp,
            &Patch::Merge(&json!({"spec": {"namespaces": namespaces}})),
        )
        .await
        .unwrap_or_else(|e| panic!("patching tenant {name}: {e}"));
    }
    let tenant = tenants::wait_ready(&admin, &name).await;
    assert_eq!(tenant.metadata.generation, Some(3));

    let y = format!("{name}-y");
    let leaked = Api::<Namespace>::all(admin.clone())
        .get_opt(&y)
        .await
        .expect("get the namespace")
        .filter(|ns| ns.metadata.deletion_timestamp.is_none());
    let record = tenant.status.clone().unwrap_or_default().created_children;
    let of_y: Vec<String> = record
        .iter()
        .filter(|c| c.name == y || c.namespace.as_deref() == Some(y.as_str()))
        .map(|c| {
            format!(
                "{} {}/{}",
                c.kind,
                c.namespace.as_deref().unwrap_or(""),
                c.name
            )
        })
        .collect();
    eprintln!(
        "Ready at generation 3; namespace {y}: {}; record entries of it: {of_y:?}",
        if leaked.is_some() {
            "still there"
        } else {
            "gone or going"
        }
    );
    assert!(
        leaked.is_none(),
        "namespace {y} of the stale generation leaked: the Tenant is Ready at generation 3 \
         while it stays (record entries of it: {of_y:?})"
    );
    assert!(
        of_y.is_empty(),
        "the record still names children of {y}: {of_y:?}"
    );
    let x = format!("{name}-x");
    assert!(
        record.iter().any(|c| c.kind == "Namespace" && c.name == x),
        "the record names namespace {x}: {record:?}"
    );
    // Deleting it (policy Delete) ends with nothing of it left.
    faults.delay_watches(Duration::ZERO);
    api.delete(&name, &Default::default())
        .await
        .expect("delete the tenant");
    eventually("the tenant gone", TIMEOUT, || async {
        match api.get_opt(&name).await.map_err(why)? {
            None => Ok(()),
            Some(t) => Err(format!("{:?}", t.status)),
        }
    })
    .await;

    stop.send(()).expect("stop the controller");
    let report = run.await.expect("join").expect("run");
    assert!(report.drained(), "{report:?}");
    ns_watch.abort();
}
