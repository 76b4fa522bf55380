//! The bench's BaseTenant controller on idem's runtime, written as the README tells a user:
//! derive, one function returning the desired children, `Applier::reconcile`,
//! `StatusWriter::write`, and `Controller` with 16 workers; the applier reads and prunes
//! children from the controller's watch caches (`ChildCaches`); with `--requests-in-flight N`
//! its reconciles' requests share N slots fairly among tenants (`idem_runtime::inflight`).

use std::sync::Arc;

use clap::Parser;
use futures::FutureExt;
use idem_bench::{BaseTenant, ControllerArgs, IDEM_MANAGER, MANAGED_BY_LABEL, desired};
use idem_runtime::TenantKey;
use idem_runtime::apply::{Applier, ChildCaches, DesiredChildren, Owner};
use idem_runtime::controller::{Action, Attempt, Controller, ControllerConfig};
use idem_runtime::inflight::{AdaptiveLimit, RequestSlots};
use idem_runtime::reconciler::primary_config;
use idem_runtime::status::StatusWriter;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::{Api, Client};

/// `bench-idem`'s command line: the common one and idem's own options.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    common: ControllerArgs,
    /// API requests of reconciles in flight, free slots going to the tenant with the fewest
    /// in flight (`RequestSlots`): `auto` (default) a cap that tunes itself, a number to pin
    /// it, 0 for no cap.
    #[arg(long, default_value = "auto")]
    requests_in_flight: String,
}

struct Ctx {
    client: Client,
    applier: Applier,
}

/// The children of a BaseTenant as idem's engine takes them.
fn children(bt: &BaseTenant) -> anyhow::Result<DesiredChildren> {
    let d = desired(bt);
    let mut out = DesiredChildren::new();
    for ns in &d.namespaces {
        out.add(ns)?;
    }
    for (i, _) in d.namespaces.iter().enumerate() {
        out.add(&d.quotas[i])?
            .add(&d.limits[i])?
            .add(&d.bindings[i])?;
    }
    Ok(out)
}

async fn reconcile(bt: Arc<BaseTenant>, ctx: Arc<Ctx>, _: Attempt) -> anyhow::Result<Action> {
    idem_bench::report_reconcile(&bt);
    let owner = Owner::new(
        &*bt,
        BaseTenant::FIELD_MANAGER,
        Some(TenantKey::new(&bt.spec.tenant)),
    )?;
    let report = ctx.applier.reconcile(&owner, &children(&bt)?).await?;
    let readiness = report.readiness();
    StatusWriter::new(Api::<BaseTenant>::all(ctx.client.clone()))
        .write(&bt, |_, draft| {
            draft.set_readiness(&readiness);
        })
        .await?;
    Ok(Action::await_change())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args {
        common: args,
        requests_in_flight,
    } = Args::parse();
    idem_bench::init_logging();
    // idem's client (`manager::client`): every request on one HTTP/2 connection.
    let client = idem_runtime::manager::client::build(args.config().await?)?;
    // Reconciles write through `writer`; watches and LISTs use `client` directly.
    let writer = match requests_in_flight.as_str() {
        "auto" => RequestSlots::adaptive(AdaptiveLimit::default()).client(client.clone()),
        "0" => client.clone(),
        n => RequestSlots::new(n.parse()?).client(client.clone()),
    };
    // idem's watch configuration (`idem_runtime::reconciler::primary_config`): lists streamed.
    let children = || primary_config().labels(&format!("{MANAGED_BY_LABEL}={IDEM_MANAGER}"));
    let mut config = ControllerConfig {
        workers: args.workers,
        ..ControllerConfig::default()
    };
    if let Some(resync) = args.resync() {
        config.resync_period = resync;
    }
    let (synced_tx, mut synced_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if synced_rx.wait_for(|s| *s).await.is_ok() {
            idem_bench::report_synced();
        }
    });
    let caches = ChildCaches::new();
    let ctx = Arc::new(Ctx {
        client: writer.clone(),
        applier: Applier::new(writer).with_caches(caches.clone()),
    });
    Controller::new(
        Api::<BaseTenant>::all(client.clone()),
        primary_config().labels(&args.run_selector()),
    )
    .owns(Api::<Namespace>::all(client.clone()), children())
    .owns(Api::<ResourceQuota>::all(client.clone()), children())
    .owns(Api::<LimitRange>::all(client.clone()), children())
    .owns(Api::<RoleBinding>::all(client.clone()), children())
    .tenant_of(|bt: &BaseTenant| TenantKey::new(&bt.spec.tenant))
    .with_config(config)
    .with_child_caches(caches)
    .with_synced_signal(synced_tx)
    .run(reconcile, ctx, tokio::signal::ctrl_c().map(|_| ()))
    .await?;
    Ok(())
}
