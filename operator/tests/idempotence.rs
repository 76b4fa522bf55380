//! Write counting on the real control plane: once a fleet has converged, reconciling it again
//! (after a restart, on resync) makes no API writes, and a fleet left alone makes neither
//! writes nor reconciles. Writes are counted from the API server's own `/metrics`.
//!
//! This binary is the only writer of its control plane while it measures: its tests run one
//! at a time (a lock), each with an operator of its own.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Operator, apps, eventually, install_crds, tenants};
use idem_operator::resources::{TENANT_LABEL, Tenant};
use idem_tests::{shared, unique_name};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tokio::sync::{Mutex, OnceCell};

/// Every resource the operator writes, as `(API group, plural)`.
const OPERATOR_RESOURCES: [(&str, &str); 12] = [
    ("", "namespaces"),
    ("", "resourcequotas"),
    ("", "limitranges"),
    ("rbac.authorization.k8s.io", "rolebindings"),
    ("networking.k8s.io", "networkpolicies"),
    ("tenancy.idem.dev", "tenants"),
    ("tenancy.idem.dev", "tenantapps"),
    ("", "configmaps"),
    ("apps", "deployments"),
    ("", "services"),
    ("", "events"),
    ("events.k8s.io", "events"),
];

/// The measurements of this binary run one at a time.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// Write requests on each of [`OPERATOR_RESOURCES`], from the API server's `/metrics`.
async fn writes() -> BTreeMap<String, u64> {
    let text = shared().metrics().await.expect("apiserver /metrics");
    OPERATOR_RESOURCES
        .iter()
        .map(|(group, resource)| {
            let key = format!("{resource}.{group}");
            (key, idem_tests::metrics::writes(&text, group, resource))
        })
        .collect()
}

/// The resources whose write count grew from `before` to `after`, with the growth.
fn grown(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// The fleet every measurement starts from: three tenants (five namespaces in all, with every
/// kind of child) and one TenantApp with two pods, converged.
struct Fleet {
    tenants: Vec<String>,
}

/// Creates the fleet once with a temporary operator, waits until it is converged and the
/// cluster's own controllers are quiet on it, then stops that operator.
async fn fleet() -> &'static Fleet {
    static FLEET: OnceCell<Fleet> = OnceCell::const_new();
    FLEET
        .get_or_init(|| async {
            let client = shared().client();
            install_crds(&client).await;
            let operator = Operator::start(Duration::from_secs(3600)).await;
            let layout: [&[&str]; 3] = [&["dev", "prod"], &["a", "b"], &["apps"]];
            let mut names = Vec::new();
            for shorts in layout {
                let name = unique_name("idem");
                tenants::create(&client, &name, tenants::full_spec(shorts)).await;
                names.push(name);
            }
            for name in &names {
                tenants::wait_ready(&client, name).await;
            }
            let app_ns = format!("{}-apps", names[2]);
            apps::create(&client, &app_ns, "web", apps::spec(2, "greeting = 'hi'")).await;
            apps::wait_ready(&client, &app_ns, "web").await;
            operator.stop().await;
            settle().await;
            Fleet { tenants: names }
        })
        .await
}

/// Waits until no write happens on [`OPERATOR_RESOURCES`] for 5 s in a row (the controller-
/// manager finishing quota usage, deployment status, root-CA ConfigMaps and so on).
async fn settle() {
    eventually(
        "the cluster to be quiet for 5 s",
        common::TIMEOUT,
        || async {
            let before = writes().await;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let delta = grown(&before, &writes().await);
            if delta.is_empty() {
                Ok(())
            } else {
                Err(format!("{delta:?}"))
            }
        },
    )
    .await;
}

/// `Ok` when the operator's `/metrics` show no ready key (`workqueue_depth` 0) and no
/// reconcile in flight (every dispatch has finished: `idem_tenant_dispatches_total` summed
/// equals `controller_runtime_reconcile_total` summed).
fn idle(text: &str) -> Result<(), String> {
    let sum = |prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let depth = sum("workqueue_depth{");
    let dispatched = sum("idem_tenant_dispatches_total{");
    let finished = sum("controller_runtime_reconcile_total{");
    (depth == 0.0 && dispatched == finished)
        .then_some(())
        .ok_or_else(|| format!("depth {depth}, dispatched {dispatched}, finished {finished}"))
}

/// Reconciles so far by both controllers, with the error count.
async fn reconciles(operator: &Operator) -> (u64, u64, u64) {
    let text = operator.metrics().await;
    let errors: u64 = text
        .lines()
        .filter(|l| l.starts_with("controller_runtime_reconcile_total{") && l.contains("error"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum();
    (
        common::reconciles_in(&text, "tenant"),
        common::reconciles_in(&text, "tenantapp"),
        errors,
    )
}

/// Checks that the tenants are still Ready and every child is still in place.
async fn assert_still_converged(fleet: &Fleet) {
    let client = shared().client();
    for name in &fleet.tenants {
        let tenant = Api::<Tenant>::all(client.clone()).get(name).await.unwrap();
        let ready = tenants::condition(&tenant, "Ready").unwrap();
        assert_eq!(ready.status, "True", "{name}: {ready:?}");
        let shorts: Vec<String> = tenant
            .spec
            .namespaces
            .iter()
            .map(|s| s.as_str().to_string())
            .collect();
        let shorts: Vec<&str> = shorts.iter().map(String::as_str).collect();
        tenants::assert_full_children(&client, &tenant, &shorts).await;
    }
}

#[tokio::test]
async fn reconciling_a_converged_fleet_again_makes_no_writes() {
    let _serial = SERIAL.lock().await;
    let fleet = fleet().await;
    let objects = fleet.tenants.len() as u64;

    // A restarted operator reconciles every object once from a cold cache ...
    let before = writes().await;
    let operator = Operator::start(Duration::from_secs(5)).await;
    eventually("a reconcile of every object", common::TIMEOUT, || async {
        match reconciles(&operator).await {
            (t, a, _) if t >= objects && a >= 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let after_restart = writes().await;
    let (t, a, errors) = reconciles(&operator).await;
    eprintln!(
        "restart: {t} tenant + {a} app reconciles, writes grew by {:?}",
        grown(&before, &after_restart)
    );
    assert_eq!(errors, 0, "reconciles failed");
    assert_eq!(
        grown(&before, &after_restart),
        BTreeMap::new(),
        "writes while re-reconciling a converged fleet after a restart"
    );

    // ... and then again on each resync (5 s here): two more rounds, still no write.
    eventually("two resync rounds", common::TIMEOUT, || async {
        match reconciles(&operator).await {
            (t2, a2, _) if t2 >= t + 2 * objects && a2 > a => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let (t2, a2, errors) = reconciles(&operator).await;
    let after_resync = writes().await;
    eprintln!(
        "resync: {} tenant + {} app reconciles, writes grew by {:?}",
        t2 - t,
        a2 - a,
        grown(&after_restart, &after_resync)
    );
    assert_eq!(errors, 0, "reconciles failed");
    assert_eq!(
        grown(&after_restart, &after_resync),
        BTreeMap::new(),
        "writes on resync of a converged fleet"
    );
    operator.stop().await;
    assert_still_converged(fleet).await;
}

/// The operator's own `idem_rest_client_requests_total` by method (GETs, lists included, as
/// `LIST+GET`), summed over status codes.
fn own_requests(metrics: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("idem_rest_client_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Some(method) = labels
            .split(',')
            .find_map(|l| l.strip_prefix("method=\""))
            .map(|m| m.trim_end_matches('"'))
        else {
            continue;
        };
        let method = if method == "GET" { "LIST+GET" } else { method };
        *out.entry(method.to_owned()).or_default() +=
            value.trim().parse::<f64>().unwrap_or(0.0) as u64;
    }
    out
}

#[tokio::test]
async fn a_converged_fleet_left_alone_for_60_s_makes_no_writes_and_no_reconciles() {
    let _serial = SERIAL.lock().await;
    let fleet = fleet().await;
    let objects = fleet.tenants.len() as u64;
    let operator = Operator::start(Duration::from_secs(3600)).await;
    eventually("the start-up reconciles", common::TIMEOUT, || async {
        match reconciles(&operator).await {
            (t, a, _) if t >= objects && a >= 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Let the start-up round finish (the app's Deployment watch events come in too).
    eventually("the operator to be idle", common::TIMEOUT, || async {
        idle(&operator.metrics().await)
    })
    .await;

    let writes_before = writes().await;
    let reconciles_before = reconciles(&operator).await;
    let own_before = own_requests(&operator.metrics().await);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let writes_after = writes().await;
    let reconciles_after = reconciles(&operator).await;
    let own_after = own_requests(&operator.metrics().await);
    // The operator's own count says the same (its start-up read the fleet: lists and watches).
    assert!(
        own_before.get("LIST+GET").copied().unwrap_or(0) > 0
            && own_before.get("WATCH").copied().unwrap_or(0) > 0,
        "the operator counts its own requests: {own_before:?}"
    );
    for method in ["POST", "PATCH", "DELETE"] {
        assert_eq!(
            own_before.get(method),
            own_after.get(method),
            "{method} requests the operator counted in 60 s of idleness"
        );
    }
    eprintln!(
        "60 s idle: reconciles {reconciles_before:?} -> {reconciles_after:?}, writes grew by {:?}",
        grown(&writes_before, &writes_after)
    );
    assert_eq!(
        grown(&writes_before, &writes_after),
        BTreeMap::new(),
        "writes in 60 s of idleness"
    );
    assert_eq!(
        reconciles_before, reconciles_after,
        "(tenant, tenantapp, errors) reconciles in 60 s of idleness"
    );
    operator.stop().await;
    assert_still_converged(fleet).await;
    // The fleet is really there to be left alone: its namespaces exist.
    let client = shared().client();
    let labelled = Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
        .list(&ListParams::default().labels(TENANT_LABEL))
        .await
        .unwrap();
    let ours = labelled
        .items
        .iter()
        .filter(|n| {
            fleet
                .tenants
                .iter()
                .any(|t| n.labels().get(TENANT_LABEL) == Some(t))
        })
        .count();
    assert_eq!(ours, 5, "the fleet's namespaces");
}

#[tokio::test]
async fn a_tenant_stalled_on_a_conflict_polls_without_writing() {
    let _serial = SERIAL.lock().await;
    fleet().await;
    let client = shared().client();
    let name = unique_name("stall");
    let taken = format!("{name}-x");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let obj = serde_json::from_value(serde_json::json!({"metadata": {"name": taken}})).unwrap();
    namespaces.create(&Default::default(), &obj).await.unwrap();
    let operator = Operator::start(Duration::from_secs(3600)).await;
    tenants::create(&client, &name, tenants::full_spec(&["x"])).await;
    tenants::wait_condition(&client, &name, "Stalled", "NamespaceConflict").await;
    settle().await;

    let poll = idem_operator::tenant::reconcile::CONFLICT_POLL;
    let writes_before = writes().await;
    let (tenant_before, _, _) = reconciles(&operator).await;
    let started = tokio::time::Instant::now();
    eventually(
        "the stalled tenant to be looked at again twice",
        poll * 4 + common::TIMEOUT,
        || async {
            let (now, _, _) = reconciles(&operator).await;
            (now - tenant_before >= 2)
                .then_some(())
                .ok_or_else(|| format!("{tenant_before} -> {now}"))
        },
    )
    .await;
    let grew = grown(&writes_before, &writes().await);
    let (tenant_after, _, errors) = reconciles(&operator).await;
    eprintln!(
        "stalled for {:?}: {} reconciles, writes grew by {grew:?}",
        started.elapsed(),
        tenant_after - tenant_before
    );
    assert_eq!(errors, 0);
    assert_eq!(grew, BTreeMap::new(), "writes while stalled");

    // Leave the cluster as the other tests expect it: no stalled tenant polling.
    tenants::api(&client)
        .delete(&name, &Default::default())
        .await
        .unwrap();
    tenants::wait_gone(&client, &name).await;
    assert!(
        namespaces.get_opt(&taken).await.unwrap().is_some(),
        "the unmanaged namespace is not deleted with the tenant"
    );
    namespaces
        .delete(&taken, &Default::default())
        .await
        .unwrap();
    operator.stop().await;
    settle().await;
}
