//! `cargo xtask controlplane build|up|down`: a thin CLI over `idem_tests::ControlPlane`.

use anyhow::Context;
use clap::Subcommand;
use idem_tests::{ControlPlane, Lifetime, Options, binaries};

/// The `controlplane` subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Build the binaries into the cache (`$IDEM_CONTROLPLANE_DIR`, or
    /// `$XDG_CACHE_HOME/idem/controlplane/<version>/`); does nothing when they are current.
    Build,
    /// Start a control plane, print how to use it, and run until Ctrl-C (then tear it down).
    Up {
        /// Leave it running in the background and return; stop it with `down`.
        #[arg(long)]
        detach: bool,
        /// How many kwok fake nodes to register (110 pods each).
        #[arg(long, default_value_t = 2)]
        nodes: u32,
        /// The IPv4 service CIDR, prefix length 12–28 (e.g. `10.0.0.0/16` for thousands of
        /// Services).
        #[arg(long, default_value = idem_tests::SERVICE_CIDR)]
        service_cidr: String,
        /// Extra feature gates for the API server, controller-manager and scheduler
        /// (`Name=true`; repeat the flag or separate with commas).
        #[arg(long, value_delimiter = ',')]
        feature_gates: Vec<String>,
        /// Turn on server-side sharded lists and watches: the same as
        /// `--feature-gates ShardedListAndWatch=true`, for `idem-operator run --shards=auto`.
        #[arg(long)]
        sharded_list_watch: bool,
        /// Size it for `cargo xtask bench --tenants 2000` and 300+ TenantApps: a /16 service
        /// range and 20 kwok nodes (2,200 pods), unless given explicitly.
        #[arg(long)]
        large: bool,
    },
    /// Stop the detached control plane and remove its files.
    Down,
}

/// Runs one `controlplane` subcommand.
pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Build => {
            let bins = binaries::ensure_built()?;
            println!("control plane binaries are in {}", bins.dir().display());
            Ok(())
        }
        Cmd::Up {
            detach,
            nodes,
            service_cidr,
            mut feature_gates,
            sharded_list_watch,
            large,
        } => {
            if sharded_list_watch {
                feature_gates.push("ShardedListAndWatch=true".into());
            }
            let mut options = Options {
                lifetime: if detach {
                    Lifetime::Detached
                } else {
                    Lifetime::Attached
                },
                nodes,
                service_cidr,
                feature_gates,
                ..Options::default()
            };
            if large {
                options = large_options(options);
            }
            up(options)
        }
        // Idempotent, as a DELETE of what is gone: nothing running is nothing to stop.
        Cmd::Down => match idem_tests::down(&idem_tests::state::root()) {
            Ok(stopped) => {
                println!("stopped {}", stopped.join(", "));
                Ok(())
            }
            Err(idem_tests::Error::NoState(_)) => {
                println!("no detached control plane is running: nothing to stop");
                Ok(())
            }
            Err(e) => Err(e.into()),
        },
    }
}

/// Kwok nodes of a large control plane: 20 × 110 = 2,200 pods.
pub const LARGE_NODES: u32 = 20;

/// `options` sized for big runs: a /16 service range and [`LARGE_NODES`] kwok nodes, where
/// they are still at their defaults.
pub fn large_options(mut options: Options) -> Options {
    let defaults = Options::default();
    if options.service_cidr == defaults.service_cidr {
        options.service_cidr = idem_tests::LARGE_SERVICE_CIDR.to_owned();
    }
    if options.nodes == defaults.nodes {
        options.nodes = LARGE_NODES;
    }
    options
}

fn up(options: Options) -> anyhow::Result<()> {
    let detach = options.lifetime == Lifetime::Detached;
    eprintln!(
        "starting the local control plane ({} kwok nodes, services {})…",
        options.nodes, options.service_cidr
    );
    let cp = ControlPlane::start_with(options)?;
    let kubectl = binaries::ensure_built()?.path("kubectl");
    println!("control plane ready at {}", cp.server());
    println!("  kubeconfig: {}", cp.kubeconfig_path().display());
    println!("  logs:       {}", cp.run_dir().join("logs").display());
    println!("use it with the matching kubectl:");
    println!("  export KUBECONFIG={}", cp.kubeconfig_path().display());
    println!("  {} get nodes", kubectl.display());
    if detach {
        println!("it keeps running; stop it with `cargo xtask controlplane down`");
        return Ok(());
    }
    println!("press Ctrl-C to stop it");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a Tokio runtime")?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    })
    .context("waiting for Ctrl-C")?;
    eprintln!("stopping the control plane…");
    cp.stop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_sizes_the_defaults_and_keeps_what_was_given() {
        let large = large_options(Options::default());
        assert_eq!(large.service_cidr, idem_tests::LARGE_SERVICE_CIDR);
        assert_eq!(large.nodes, LARGE_NODES);
        assert!(large.service_ip().is_ok());
        let given = large_options(Options {
            nodes: 5,
            service_cidr: "10.0.0.0/20".into(),
            ..Options::default()
        });
        assert_eq!(
            (given.nodes, given.service_cidr.as_str()),
            (5, "10.0.0.0/20")
        );
    }
}
