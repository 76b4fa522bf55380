//! `idem-operator`: runs idem's Tenant and TenantApp controllers (`run`, the default) or
//! prints their CRDs (`crds`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use idem_operator::manager::{self, ManagerOptions};

/// The idem operator.
#[derive(Debug, Parser)]
#[command(name = "idem-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controllers (the default).
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinitions as YAML.
    Crds,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Kubeconfig file; without it, `KUBECONFIG`, `~/.kube/config` or the in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Concurrent reconciles per controller.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Most reconciles of one tenant at once (per controller); 0 (default): no cap. Without a
    /// cap the queue is work-conserving: a tenant alone may use every worker, and under
    /// contention workers are shared by Tenant `spec.weight`.
    #[arg(long, default_value_t = 0)]
    tenant_concurrency: usize,
    /// Anti-entropy resync period of every object, e.g. `10m`, `10h` (0 disables).
    #[arg(long, default_value = "10h", value_parser = humantime::parse_duration)]
    resync_period: Duration,
    /// Address of `/metrics`.
    #[arg(long, default_value = "127.0.0.1:8080")]
    metrics_addr: SocketAddr,
    /// Address of `/healthz` and `/readyz`.
    #[arg(long, default_value = "127.0.0.1:8081")]
    health_addr: SocketAddr,
    /// Take a Lease before running controllers, so one replica of several is active.
    #[arg(long, conflicts_with = "shards")]
    leader_elect: bool,
    /// `auto`: every replica holds a member Lease and reconciles its share of the tenants
    /// (a Tenant by the hash of its uid, a TenantApp by its namespace), using the API server's
    /// `shardSelector` (KEP-5866) when it supports it; `off`: one replica does everything.
    #[arg(long, default_value = "off", value_parser = ["off", "auto"])]
    shards: String,
    /// Namespace of the leader-election or shard member Leases (default: the pod's namespace
    /// or `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    leader_elect_namespace: Option<String>,
    /// This replica's identity in the Lease (default: the pod name or the host name + pid).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Log format.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// How long shutdown waits for in-flight reconciles (SIGTERM → exit); lost leadership
    /// cancels them at once.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Crds) => {
            for crd in idem_operator::resources::crds() {
                print!("---\n{}", serde_saphyr::to_string(&crd)?);
            }
            Ok(())
        }
        Some(Command::Run(args)) => run(*args),
        None => match Cli::parse_from(["idem-operator", "run"]).command {
            Some(Command::Run(args)) => run(*args),
            _ => unreachable!("`run` parses as the run command"),
        },
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    init_logging(&args.log_format);
    let options = ManagerOptions {
        kubeconfig: args.kubeconfig,
        workers: args.workers,
        tenant_concurrency: args.tenant_concurrency,
        resync_period: args.resync_period,
        metrics_addr: args.metrics_addr,
        health_addr: args.health_addr,
        leader_elect: args.leader_elect,
        leader_elect_namespace: args.leader_elect_namespace,
        identity: args.identity,
        shutdown_grace: args.shutdown_grace,
        shards: args.shards == "auto",
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(manager::run(options, manager::shutdown_signal()))
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}
