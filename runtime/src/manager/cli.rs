//! The command line of a binary built on a [`Manager`](super::Manager): `run` (the default),
//! `crds` and `rbac`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use super::ManagerOptions;
use super::options::RequestsInFlight;

/// A manager's command line.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// What to do (default: `run`).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// A manager's subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controllers (the default).
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinitions as YAML.
    Crds,
    /// Print the RBAC objects of the manager's ServiceAccount as YAML: the account, a
    /// ClusterRole with the verbs its controllers use, a Role for its Leases, their bindings;
    /// then the admission policy that keeps each kind's finalizer until its cleanup is done.
    Rbac(RbacArgs),
}

/// The flags of `rbac`.
#[derive(Debug, clap::Args)]
pub struct RbacArgs {
    /// The namespace of the ServiceAccount and of the Leases (where the manager runs).
    #[arg(long, short = 'n', default_value = "default")]
    pub namespace: String,
}

/// The flags of `run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Kubeconfig file; without it, `KUBECONFIG` (one file, or several separated by `:`,
    /// merged as kubectl merges them), `~/.kube/config` or the in-cluster config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Concurrent reconciles per controller.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Most reconciles of one tenant at once (per controller); 0 (default): no cap. Without a
    /// cap a tenant alone may use every worker but one (kept for a tenant with nothing
    /// running, from 4 workers up), and under contention workers are shared by the tenants'
    /// weights.
    #[arg(long, default_value_t = 0)]
    pub tenant_concurrency: usize,
    /// Anti-entropy resync period of every object, e.g. `10m`, `10h` (0 disables).
    #[arg(long, default_value = "10h", value_parser = humantime::parse_duration)]
    pub resync_period: Duration,
    /// Address of `/metrics`.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub metrics_addr: SocketAddr,
    /// Address of `/healthz` and `/readyz`.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub health_addr: SocketAddr,
    /// Take a Lease before running controllers, so one replica of several is active (not
    /// with `--shards auto`: the manager refuses to run with both).
    #[arg(long)]
    pub leader_elect: bool,
    /// `auto`: every replica holds a member Lease and reconciles its share of the primaries
    /// (by the hash of their uid, or what the controllers shard on), using the API server's
    /// `shardSelector` when it supports it; `off`: one replica does everything.
    #[arg(long, default_value = "off", value_parser = ["off", "auto"])]
    pub shards: String,
    /// Namespace of the leader-election or shard member Leases (default: the pod's namespace
    /// in a cluster, else the kubeconfig context's namespace or `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_elect_namespace: Option<String>,
    /// This replica's identity in the Lease (default: the pod name or the host name + pid).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Log format.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// How long shutdown waits for in-flight reconciles (SIGTERM → exit); lost leadership
    /// cancels them at once.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
    /// API requests of reconciles in flight at once, each free slot going to the tenant with
    /// the fewest in flight for its weight: `auto` (default) caps each tenant by the API
    /// server's latency and 429s and the total by 429s (gauges
    /// `idem_request_slots_tenant_limit`, `idem_request_slots_limit`), a number pins the
    /// total, 0 means no cap.
    #[arg(long, default_value = "auto", value_parser = RequestsInFlight::parse)]
    pub requests_in_flight: RequestsInFlight,
}

impl Cli {
    /// The command line of binary `name` from the process's arguments; `run` when no
    /// subcommand is given.
    ///
    /// Exits the process with clap's message on invalid arguments or `--help`.
    pub fn parse_for(name: &str) -> Command {
        Self::parse_from_for(name, std::env::args_os())
    }

    /// [`Cli::parse_for`] from `args` (the first is the binary's name).
    pub fn parse_from_for<I, T>(name: &str, args: I) -> Command
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{CommandFactory, FromArgMatches};
        let name = name.to_string();
        let command = || {
            Self::command().name(name.clone()).about(format!(
                "{name}: runs its controllers (`run`, the default), or prints its CRDs (`crds`) or its RBAC and admission policies (`rbac`)"
            ))
        };
        let matches = command().get_matches_from(args);
        let cli = Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        cli.command.unwrap_or_else(|| {
            let matches = command().get_matches_from(["", "run"]);
            (Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()))
                .command
                .expect("`run` parses as the run command")
        })
    }
}

impl RunArgs {
    /// The manager's options from these flags.
    pub fn options(&self) -> ManagerOptions {
        ManagerOptions {
            kubeconfig: self.kubeconfig.clone(),
            workers: self.workers,
            tenant_concurrency: self.tenant_concurrency,
            resync_period: self.resync_period,
            metrics_addr: self.metrics_addr,
            health_addr: self.health_addr,
            leader_elect: self.leader_elect,
            leader_elect_namespace: self.leader_elect_namespace.clone(),
            identity: self.identity.clone(),
            shutdown_grace: self.shutdown_grace,
            shards: self.shards == "auto",
            requests_in_flight: self.requests_in_flight,
        }
    }

    /// Installs the process's tracing subscriber (stderr, `RUST_LOG` or `info`, in
    /// [`RunArgs::log_format`]); a no-op when one is installed already.
    pub fn init_logging(&self) {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
        let _ = if self.log_format == "json" {
            builder.json().try_init()
        } else {
            builder.try_init()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_is_the_default_command_with_the_flags_defaults() {
        let Command::Run(args) = Cli::parse_from_for("x", ["x"]) else {
            panic!("not run")
        };
        let options = args.options();
        let defaults = ManagerOptions::default();
        assert_eq!(options.workers, defaults.workers);
        assert_eq!(options.resync_period, defaults.resync_period);
        assert_eq!(options.shutdown_grace, defaults.shutdown_grace);
        assert!(!options.shards && !options.leader_elect);
        // The reconciles' requests go through self-tuning fair slots unless told otherwise.
        assert_eq!(options.requests_in_flight, RequestsInFlight::Auto);
        assert_eq!(defaults.requests_in_flight, RequestsInFlight::Auto);
        let Command::Run(args) = Cli::parse_from_for("x", ["x", "run", "--shards", "auto"]) else {
            panic!("not run")
        };
        assert!(args.options().shards);
        // `--shards off` is the default said out loud: it goes with `--leader-elect`.
        let Command::Run(args) =
            Cli::parse_from_for("x", ["x", "run", "--leader-elect", "--shards", "off"])
        else {
            panic!("not run")
        };
        assert!(args.options().leader_elect && !args.options().shards);
        assert!(matches!(
            Cli::parse_from_for("x", ["x", "crds"]),
            Command::Crds
        ));
        let Command::Rbac(rbac) = Cli::parse_from_for("x", ["x", "rbac", "-n", "ops"]) else {
            panic!("not rbac")
        };
        assert_eq!(rbac.namespace, "ops");
    }
}
