//! `cargo xtask bench`: idem's side-by-side benchmark. One BaseTenant job (N tenants × 3
//! namespaces, each with a ResourceQuota, a LimitRange and a RoleBinding; server-side apply;
//! 16 workers) is done by `bench-idem` (idem's runtime), `bench-peer` (a plain kube-runtime
//! 5 `Controller`) and `bench-cr` (a controller-runtime manager, in Go), one after the other
//! against one local control plane, each under its own name prefix, the Rust ones built for
//! release unless `--debug`; every figure is printed beside idem ÷ the best peer of the same
//! run and written to an HTML report with plots. Requests are counted by the API server
//! (`/metrics`).

mod child;
mod counts;
mod fleet;
mod gopeer;
mod html;
mod markdown;
mod report;
mod scenarios;
mod shards;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use idem_tests::{ControlPlane, Options};

use self::child::Side;
use self::scenarios::Plan;
use crate::dev::operator::build_bin_with;
use crate::dev::progress::Step;

/// The scenarios `--scenario` accepts; all but `shards` run by default.
pub const SCENARIOS: [&str; 6] = ["p2", "p3", "p4", "p5", "p6", "shards"];

/// Tenants of the `--large` fleet.
pub const LARGE_TENANTS: usize = 10_000;

/// The peers `--peers` accepts.
pub const PEERS: [&str; 2] = ["kube", "controller-runtime"];

/// What `--peers` also accepts: no peer, idem alone.
const NO_PEER: &str = "none";

/// The bench's controller-manager runs without the garbage collector: it GETs owners and
/// dependents it has not seen yet (basetenants, limitranges, …), requests the API server
/// counts under the very resources the controllers use. Nothing in the bench is deleted.
const GC_OFF: &str = "--controllers=*,-garbage-collector-controller";

/// `cargo xtask bench` options.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A small run (20 tenants, a 100-object flood, 8 s resync) that finishes in under
    /// 3 minutes on 2 cores once built.
    #[arg(long)]
    pub quick: bool,
    /// The fleet-size run: P2 alone (unless `--scenario` names others) with 10,000 tenants
    /// (130,000 children) unless `--tenants` says otherwise; with its time and controller CPU
    /// per tenant beside a run at 1,000 and 3,000 it tells whether they stay flat in N.
    #[arg(long, conflicts_with = "quick")]
    pub large: bool,
    /// Tenants in the P2 fleet (default 100; 20 with --quick; 10,000 with --large).
    #[arg(long)]
    pub tenants: Option<usize>,
    /// BaseTenants in each of P4's 3 floods, all of one tenant (default 1000; 100 with
    /// --quick).
    #[arg(long)]
    pub flood: Option<usize>,
    /// Run only these scenarios (repeatable: p2, p3, p4, p5, p6, shards); P2's fleet is always
    /// made, since every other scenario starts from it. `shards` (the operator with 1 vs 3
    /// replicas, `ShardedListAndWatch` off and on, `--tenants` Tenants) runs only when named,
    /// and alone: it runs the operator binary, so `--idem-binary`, `--peers`,
    /// `--requests-in-flight` and `--no-raw-limit` do not apply to it.
    #[arg(long, value_parser = SCENARIOS)]
    pub scenario: Vec<String>,
    /// Concurrent reconciles of every controller (and concurrency of the raw-client limit).
    #[arg(long, default_value_t = 16)]
    pub workers: usize,
    /// `bench-idem`'s cap on its reconciles' API requests in flight, whose free slots go to
    /// the tenant with the fewest in flight (`idem_runtime::inflight`): `auto` (default) a
    /// cap that tunes itself from the API server's latency and throttling, a number to pin
    /// it, 0 for no cap.
    #[arg(long, default_value = "auto")]
    pub requests_in_flight: String,
    /// Resync period during P3's full-resync measurement (default 20 s; 8 s with --quick).
    #[arg(long)]
    pub resync_secs: Option<u64>,
    /// `shards` only: run with the `ShardedListAndWatch` gate `on` or `off` only (default:
    /// both, off first).
    #[arg(long, value_parser = ["on", "off"])]
    pub gate: Option<String>,
    /// The peers idem is compared with, comma-separated (default: both; `none`: idem alone).
    #[arg(long, value_delimiter = ',', value_parser = [PEERS[0], PEERS[1], NO_PEER], default_values_t = PEERS.map(str::to_owned))]
    pub peers: Vec<String>,
    /// Build the Rust controllers with the dev profile instead of `--release` (a quicker
    /// build on a machine that has the workspace built for tests; slower controllers).
    #[arg(long)]
    pub debug: bool,
    /// Run this `bench-idem` binary instead of building one (another build of it, or one
    /// built with other flags to profile it).
    #[arg(long)]
    pub idem_binary: Option<PathBuf>,
    /// Skip P2's raw-client limit (`tenants × 13` creates from a plain client before the
    /// controllers run; its row is then absent), which at 10,000 tenants takes minutes.
    #[arg(long)]
    pub no_raw_limit: bool,
    /// Where `report.html`, `benchmarks.md` and the controllers' logs go (default
    /// `target/bench/`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the run's figures where the repository shows them: `docs/benchmarks.md`,
    /// for a run of P2 alone (`--scenario p2`) its fleet size's section of
    /// `docs/benchmarks-fleet.md`, for `shards` `docs/benchmarks-shards.md`.
    #[arg(long)]
    pub record: bool,
}

impl Args {
    /// idem, then the selected peers in [`Side::ALL`]'s order.
    fn sides(&self) -> Vec<Side> {
        Side::ALL
            .into_iter()
            .filter(|s| match s {
                Side::Idem => true,
                Side::Kube => self.peers.iter().any(|p| p == "kube"),
                Side::ControllerRuntime => self.peers.iter().any(|p| p == "controller-runtime"),
            })
            .collect()
    }

    /// How the controllers are built, as the report says it.
    fn build(&self) -> &'static str {
        if self.debug {
            "Rust controllers in debug builds, controller-runtime as `go build` optimises"
        } else {
            "Rust controllers in release builds, controller-runtime as `go build` optimises"
        }
    }

    fn plan(&self) -> Plan {
        let scenarios: BTreeSet<String> = if self.scenario.is_empty() && self.large {
            BTreeSet::from(["p2".to_owned()])
        } else if self.scenario.is_empty() {
            SCENARIOS
                .iter()
                .filter(|s| **s != "shards")
                .map(|s| (*s).to_owned())
                .collect()
        } else {
            self.scenario.iter().cloned().collect()
        };
        let quick = self.quick;
        Plan {
            scenarios,
            tenants: self
                .tenants
                .unwrap_or(match (quick, self.large) {
                    (true, _) => 20,
                    (_, true) => LARGE_TENANTS,
                    _ => 100,
                })
                .max(1),
            flood: self.flood.unwrap_or(if quick { 100 } else { 1000 }).max(1),
            floods: 3,
            resync_secs: self
                .resync_secs
                .unwrap_or(if quick { 8 } else { 20 })
                .max(1),
            alone_samples: if quick { 3 } else { 10 },
            workers: self.workers.max(1),
            requests_in_flight: self.requests_in_flight.clone(),
        }
    }
}

/// Runs the benchmark.
///
/// # Errors
/// Build, control-plane, controller or API failures.
pub fn run(args: Args) -> anyhow::Result<()> {
    let plan = args.plan();
    let started = Instant::now();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| crate::generated::repo_root().join("target").join("bench"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    if plan.has("shards") {
        let gates: &[bool] = match args.gate.as_deref() {
            Some("on") => &[true],
            Some("off") => &[false],
            _ => &[false, true],
        };
        let lines = shards::run(plan.tenants, plan.workers, gates, !args.debug, &out)?;
        if args.record {
            let run = markdown::Provenance::of_this_run(args.build(), started.elapsed());
            let path = crate::generated::repo_root()
                .join("docs")
                .join(markdown::SHARDS_FILE);
            std::fs::write(&path, markdown::shards_page(plan.tenants, &lines, &run))
                .with_context(|| format!("writing {}", path.display()))?;
            println!("recorded: {}", path.display());
        }
        return Ok(());
    }
    let sides = args.sides();
    for side in &sides {
        let _ = std::fs::remove_file(out.join(format!("{}.log", side.name())));
    }

    let profile = if args.debug { "debug" } else { "release" };
    let step = Step::start(format!(
        "building {} ({profile})",
        sides
            .iter()
            .map(|s| s.cargo_bin().unwrap_or("bench-cr"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let mut bins = Vec::new();
    for side in &sides {
        let bin = match (side, side.cargo_bin(), &args.idem_binary) {
            (Side::Idem, _, Some(given)) => given.clone(),
            (_, Some(bin), _) => build_bin_with(step.bar(), "idem-bench", bin, !args.debug)?,
            (_, None, _) => gopeer::ensure_built(step.bar())?,
        };
        bins.push((*side, bin));
    }
    step.done("");

    let step = Step::start("starting the local control plane (services 10.0.0.0/16)");
    let cp = ControlPlane::start_with(Options {
        service_cidr: idem_tests::LARGE_SERVICE_CIDR.to_owned(),
        controller_manager_args: vec![GC_OFF.to_owned()],
        ..Options::default()
    })?;
    step.done(cp.server());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting a Tokio runtime")?;
    let results = rt.block_on(async {
        let client = cp.client();
        fleet::install_crd(&client).await?;
        let raw = if plan.has("p2") && !args.no_raw_limit {
            let step = Step::start(format!(
                "raw-client limit: {} creates at {} concurrent requests",
                plan.tenants as u64 * scenarios::WRITES_PER_TENANT,
                fleet::CONCURRENCY
            ));
            let t = fleet::raw_limit(&client, plan.tenants).await?;
            step.done(&format!("{:.1}s", t.as_secs_f64()));
            Some(t)
        } else {
            None
        };
        let mut results = Vec::new();
        for (side, bin) in &bins {
            let step = Step::start("waiting for the control plane to settle");
            fleet::settle(&client, std::time::Duration::from_secs(180)).await?;
            step.done("");
            let r =
                scenarios::run_side(*side, bin, cp.kubeconfig_path(), &client, &cp, &plan, &out)
                    .await
                    .with_context(|| {
                        format!(
                            "{} controller (log: {})",
                            side.title(),
                            out.join(format!("{}.log", side.name())).display()
                        )
                    })?;
            results.push(r);
        }
        anyhow::Ok((raw, results))
    })?;
    let (raw, results) = results;
    let tables = report::tables(&plan, raw, &results);
    for t in &tables {
        println!("{}", t.to_text());
    }
    println!("requests by verb and resource:");
    for r in &results {
        let phases = [
            ("P2", Some(&r.p2.counts)),
            ("P3 restart", r.restart.as_ref()),
            ("P3 resync", r.resync.as_ref()),
        ];
        for (phase, counts) in phases {
            if let Some(c) = counts {
                println!("  {} {phase}: {}", r.side.title(), c.detail());
            }
        }
    }
    let path = out.join("report.html");
    let html = html::page(&plan, &tables, &results, args.build(), started.elapsed());
    std::fs::write(&path, html).with_context(|| format!("writing {}", path.display()))?;
    println!("report: {}", path.display());
    let run = markdown::Provenance::of_this_run(args.build(), started.elapsed());
    let md = markdown::page(&plan, &tables, &run);
    let md_path = out.join("benchmarks.md");
    std::fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
    if args.record {
        let docs = crate::generated::repo_root().join("docs");
        let (docs, text) = if plan.scenarios.iter().all(|s| s == "p2") {
            // A fleet-size run: its section of the fleet page, the other sizes kept.
            let section = markdown::fleet_section(&plan, &tables, &run);
            let path = docs.join(markdown::FLEET_FILE);
            let existing = std::fs::read_to_string(&path).ok();
            let text = markdown::merge_fleet(existing.as_deref(), plan.tenants, &section);
            (path, text)
        } else {
            (docs.join("benchmarks.md"), md)
        };
        std::fs::write(&docs, &text).with_context(|| format!("writing {}", docs.display()))?;
        println!("recorded: {}", docs.display());
    }
    drop(rt);
    cp.stop();
    Ok(())
}
