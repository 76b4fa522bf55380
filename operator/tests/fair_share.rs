//! Weighted fair sharing end to end: two tenants of weights 1 and 4 flood TenantApps at once;
//! while both have keys waiting, the TenantApp queue dispatches their keys about 1 : 4 (read
//! from the operator's own `idem_tenant_dispatches_total`). Then the weights are swapped on
//! the Tenants, without a restart, and a second flood is dispatched about 4 : 1.

mod common;

use std::time::Duration;

use common::{Operator, TIMEOUT, apps, install_crds, tenants};
use futures::future::join_all;
use idem_operator::resources::TenantApp;
use idem_tests::{shared, unique_name};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Apps each tenant creates.
const APPS: usize = 100;

/// One scrape: per tenant, dispatches so far and keys ready in the TenantApp queue.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    dispatches: [f64; 2],
    depth: [f64; 2],
}

fn series(metrics: &str, family: &str, tenant: &str) -> f64 {
    let tenant = format!("tenant=\"{tenant}\"");
    metrics
        .lines()
        .filter(|l| {
            l.starts_with(family) && l.contains("name=\"tenantapp\"") && l.contains(&tenant)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn sample(operator: &Operator, names: &[String; 2]) -> Sample {
    let text = operator.metrics().await;
    let mut s = Sample::default();
    for (i, name) in names.iter().enumerate() {
        s.dispatches[i] = series(&text, "idem_tenant_dispatches_total{", name);
        s.depth[i] = series(&text, "idem_tenant_queue_depth{", name);
    }
    s
}

/// Runs `flood` while scraping the operator every 100 ms until the flood is over and both
/// tenants' queues are empty. Returns the dispatches of each tenant summed over the
/// contended intervals (both tenants had keys waiting at both ends of the interval).
async fn contended_dispatches(
    operator: &Operator,
    names: &[String; 2],
    flood: impl std::future::Future<Output = ()>,
) -> [f64; 2] {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let mut samples = vec![sample(operator, names).await];
    tokio::pin!(flood);
    let mut flooding = true;
    loop {
        tokio::select! {
            () = &mut flood, if flooding => flooding = false,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        let s = sample(operator, names).await;
        samples.push(s);
        if !flooding && s.depth == [0.0, 0.0] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the flood did not drain within {TIMEOUT:?}: {s:?}"
        );
    }
    let mut contended = [0.0; 2];
    for w in samples.windows(2) {
        let both = |s: &Sample| s.depth[0] > 0.0 && s.depth[1] > 0.0;
        if both(&w[0]) && both(&w[1]) {
            for (i, c) in contended.iter_mut().enumerate() {
                *c += w[1].dispatches[i] - w[0].dispatches[i];
            }
        }
    }
    let total: Vec<f64> = (0..2)
        .map(|i| samples.last().unwrap().dispatches[i] - samples[0].dispatches[i])
        .collect();
    println!(
        "dispatches {names:?}: contended {contended:?} (ratio {:.2}), all {total:?}, {} samples",
        contended[1] / contended[0].max(1.0),
        samples.len()
    );
    contended
}

fn assert_near_four(to_light: f64, to_heavy: f64, phase: &str) {
    assert!(
        to_light + to_heavy >= 100.0,
        "{phase}: too little contention to judge ({to_light} + {to_heavy} dispatches)"
    );
    let ratio = to_heavy / to_light.max(1.0);
    assert!(
        (3.2..=4.8).contains(&ratio),
        "{phase}: weight-4 tenant got {to_heavy} dispatches, weight-1 tenant {to_light}: \
         ratio {ratio:.2}, expected about 4"
    );
}

async fn set_weight(client: &kube::Client, tenant: &str, weight: i32) {
    tenants::api(client)
        .patch(
            tenant,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"weight": weight}})),
        )
        .await
        .unwrap();
    tenants::wait_ready(client, tenant).await;
}

#[tokio::test]
async fn tenant_weights_split_the_tenant_app_queue_and_a_weight_change_applies_at_once() {
    let client = shared().client();
    install_crds(&client).await;
    let mut operator = Operator::spawn_configured(Duration::from_secs(600), None, |o| {
        o.workers = 4;
        o.tenant_concurrency = 0; // the default: no per-tenant cap, shares by weight
    });
    operator.wait_ready().await;
    let names = [unique_name("light"), unique_name("heavy")];
    for (name, weight) in names.iter().zip([1, 4]) {
        let mut spec = tenants::full_spec(&["apps"]);
        spec.weight = weight;
        tenants::create(&client, name, spec).await;
    }
    for name in &names {
        tenants::wait_ready(&client, name).await;
    }

    // Phase 1: both tenants create their apps at once.
    let create_all = |tenant: String| {
        let client = client.clone();
        async move {
            let ns = format!("{tenant}-apps");
            for i in 0..APPS {
                apps::create(&client, &ns, &format!("app-{i}"), apps::spec(0, "v1")).await;
            }
        }
    };
    let flood = async {
        join_all(names.iter().cloned().map(create_all)).await;
    };
    let [light, heavy] = contended_dispatches(&operator, &names, flood).await;
    assert_near_four(light, heavy, "weights 1 : 4");

    // Phase 2: swap the weights on the Tenants (no restart), then both tenants change every
    // app's config at once.
    set_weight(&client, &names[0], 4).await;
    set_weight(&client, &names[1], 1).await;
    let change_all = |tenant: String| {
        let client = client.clone();
        async move {
            let api: Api<TenantApp> = Api::namespaced(client, &format!("{tenant}-apps"));
            for i in 0..APPS {
                api.patch(
                    &format!("app-{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"config": {"app.toml": "v2"}}})),
                )
                .await
                .unwrap();
            }
        }
    };
    let flood = async {
        join_all(names.iter().cloned().map(change_all)).await;
    };
    let [light, heavy] = contended_dispatches(&operator, &names, flood).await;
    assert_near_four(heavy, light, "weights swapped to 4 : 1");
    operator.stop().await;
}
