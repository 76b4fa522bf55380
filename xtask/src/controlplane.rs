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
        /// How many kwok fake nodes to register.
        #[arg(long, default_value_t = 2)]
        nodes: u32,
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
        Cmd::Up { detach, nodes } => up(detach, nodes),
        Cmd::Down => {
            let stopped = idem_tests::down(&idem_tests::state::root())?;
            println!("stopped {}", stopped.join(", "));
            Ok(())
        }
    }
}

fn up(detach: bool, nodes: u32) -> anyhow::Result<()> {
    let lifetime = if detach {
        Lifetime::Detached
    } else {
        Lifetime::Attached
    };
    eprintln!("starting the local control plane…");
    let cp = ControlPlane::start_with(Options {
        lifetime,
        nodes,
        ..Options::default()
    })?;
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
