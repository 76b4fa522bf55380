//! `cargo xtask`: idem's developer tasks, one subcommand each.

mod bench;
mod controlplane;
mod crds;
mod dev;
mod generated;
mod manifests;

use clap::{Parser, Subcommand};

/// idem's developer tasks.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build, start and stop the local Kubernetes control plane (etcd, kube-apiserver,
    /// kube-controller-manager, kube-scheduler, kwok fake nodes) built from pinned Go modules.
    #[command(subcommand)]
    Controlplane(controlplane::Cmd),
    /// The whole product locally: start the control plane, install the CRDs and RBAC, run the
    /// operator, apply `examples/`, wait until every example is Ready and print a table; keep
    /// running until Ctrl-C (which tears everything down) unless `--once`.
    Dev(dev::Args),
    /// idem's side-by-side benchmark: the same BaseTenant controller on idem's runtime, on a
    /// plain kube-runtime `Controller` and on controller-runtime, against one local control
    /// plane; prints ratios idem ÷ best peer per scenario and writes `target/bench/report.html`
    /// (`--quick`: under 3 minutes).
    Bench(bench::Args),
    /// Write idem-operator's CRDs, `deploy/crds/*.yaml`, from its Rust types (`--check`: fail
    /// if they are stale); a binary of your own prints its kinds' CRDs with `crds`.
    Crds {
        /// Only check that the committed files are current.
        #[arg(long)]
        check: bool,
    },
    /// Write `deploy/operator/` (Namespace, RBAC, Deployment, admission policies, FlowSchema)
    /// (`--check`: fail if stale).
    Manifests {
        /// Only check that the committed files are current.
        #[arg(long)]
        check: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Controlplane(cmd) => controlplane::run(cmd),
        Command::Dev(args) => dev::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Crds { check } => crds::run(&generated::repo_root(), check),
        Command::Manifests { check } => manifests::run(&generated::repo_root(), check),
    }
}
