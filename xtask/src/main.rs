//! `cargo xtask`: idem's developer tasks, one subcommand each.

mod controlplane;

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
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Controlplane(cmd) => controlplane::run(cmd),
    }
}
