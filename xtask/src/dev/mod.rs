//! `cargo xtask dev`: the whole product on one machine — control plane, CRDs, RBAC, the
//! operator, the examples — converged, tabulated, and kept running until Ctrl-C.

pub(crate) mod apply;
pub(crate) mod operator;
pub(crate) mod progress;
mod report;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use idem_tests::{ControlPlane, Options, binaries};
use kube::Client;
use kube::config::Kubeconfig;

use self::apply::{Applier, Manifest};
use self::operator::Operator;
use self::progress::Step;
use self::report::Target;
use crate::generated::repo_root;

/// Options of `cargo xtask dev`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Use this cluster instead of starting the local control plane (a `:`-separated list is
    /// merged as kubectl does). Nothing is torn down on exit but the operator. Only this
    /// option names a cluster: an exported `KUBECONFIG` is not read, so `dev` never installs
    /// into a cluster it was not told to use.
    #[arg(long)]
    kubeconfig: Option<OsString>,
    /// Exit once every example is Ready (status 0), or with an error when one is not within
    /// `--timeout`, tearing everything down; without it `dev` keeps running until Ctrl-C.
    #[arg(long)]
    once: bool,
    /// How long the examples get to become Ready, e.g. `3m`, `90s`.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The directory of manifests to apply and wait for (every Tenant and TenantApp in it
    /// must become Ready).
    #[arg(long, default_value = "examples")]
    examples: PathBuf,
    /// How many kwok fake nodes the local control plane registers.
    #[arg(long, default_value_t = 2)]
    nodes: u32,
    /// Run the operator with the kubeconfig's own identity instead of impersonating its
    /// ServiceAccount (`system:serviceaccount:idem-system:idem-operator`, whose
    /// least-privilege ClusterRole comes from `deploy/operator/`).
    #[arg(long)]
    no_impersonate: bool,
}

/// How long the operator gets to report `/readyz` 200 (caches synced).
const OPERATOR_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `cargo xtask dev`.
///
/// # Errors
/// When any step fails (with what failed and where to look), when the examples are not Ready
/// within the timeout (naming each one that is not and its conditions), or when the operator
/// exits on its own.
pub fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let root = repo_root();
    // Read every input first: a bad YAML file fails before anything starts.
    let examples = apply::read_dir(&root.join(&args.examples))?;
    let rbac: Vec<Manifest> = apply::read_dir(&root.join(crate::manifests::DIR))?
        .into_iter()
        .filter(|m| m.kind() != "Deployment")
        .collect();
    if let Err(e) = crate::manifests::run(&root, true) {
        eprintln!("warning: {e:#} (using them as they are)");
    }
    let work = work_dir()?;

    let step = Step::start("building idem-operator");
    let operator_bin = operator::build(step.bar())?;
    step.done(&operator_bin.display().to_string());

    let (control_plane, kubeconfig) = match &args.kubeconfig {
        Some(paths) => {
            let config = load_kubeconfig(paths)?;
            eprintln!(
                "using the cluster of {} (context {}), not a local control plane",
                paths.to_string_lossy(),
                config.current_context.as_deref().unwrap_or("<none>")
            );
            (None, config)
        }
        None => {
            // Builds the Go binaries once (cached); the harness shows its own spinner then, so
            // no step of ours draws at the same time.
            binaries::ensure_built()?;
            let step = Step::start("starting the local control plane");
            let cp = ControlPlane::start_with(Options {
                nodes: args.nodes,
                ..Options::default()
            })
            .context("starting the local control plane")?;
            step.done(cp.server());
            let config = Kubeconfig::read_from(cp.kubeconfig_path())?;
            (Some(cp), config)
        }
    };

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a Tokio runtime")?;
    let mut operator = None;
    let session = Session {
        args: &args,
        work: &work,
        kubeconfig: &kubeconfig,
        operator_bin: &operator_bin,
        examples: &examples,
        rbac: &rbac,
        started,
        control_plane: control_plane.as_ref(),
    };
    let result = rt.block_on(session.run(&mut operator));
    teardown(operator, control_plane);
    result
}

/// Everything one `dev` session needs once the cluster is there.
struct Session<'a> {
    args: &'a Args,
    work: &'a Path,
    kubeconfig: &'a Kubeconfig,
    operator_bin: &'a Path,
    examples: &'a [Manifest],
    rbac: &'a [Manifest],
    started: Instant,
    control_plane: Option<&'a ControlPlane>,
}

impl Session<'_> {
    /// Converges (interruptible by Ctrl-C / SIGTERM), prints the table, then without `--once`
    /// waits for Ctrl-C / SIGTERM or the operator's exit.
    async fn run(&self, operator: &mut Option<Operator>) -> anyhow::Result<()> {
        let mut signals = Signals::new()?;
        let client = tokio::select! {
            r = self.converge(operator) => r?,
            sig = signals.recv() => bail!("{sig}: stopping before everything was Ready"),
        };
        let op = operator.as_mut().expect("converge started the operator");
        println!("{}", report::table(&client).await?);
        eprintln!(
            "all {} examples Ready {:.1}s after start",
            Target::from_manifests(self.examples).len(),
            self.started.elapsed().as_secs_f64()
        );
        eprintln!("operator log: {}", op.log().display());
        if self.args.once {
            return Ok(());
        }
        self.print_usage(op);
        loop {
            tokio::select! {
                sig = signals.recv() => {
                    eprintln!("{sig}: tearing down");
                    return Ok(());
                }
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    if let Some(status) = op.exited() {
                        return Err(op.died(&status));
                    }
                }
            }
        }
    }

    /// CRDs, RBAC, operator, examples, and the wait for Ready. Returns the admin client.
    async fn converge(&self, operator: &mut Option<Operator>) -> anyhow::Result<Client> {
        let config =
            kube::Config::from_custom_kubeconfig(self.kubeconfig.clone(), &Default::default())
                .await
                .context("a client configuration from the kubeconfig")?;
        let client = Client::try_from(config).context("creating a Kubernetes client")?;

        let step = Step::start("installing the CRDs (server-side apply, wait Established)");
        let crds = apply::install_crds(&client).await?;
        step.done(&crds.join(", "));

        let step = Step::start("installing RBAC from deploy/operator/");
        let mut applier = Applier::new(client.clone());
        for m in self.rbac {
            applier.apply(m).await?;
        }
        step.done(&describe_all(self.rbac));

        let step = Step::start("starting idem-operator");
        let op_kubeconfig = self.work.join("operator-kubeconfig.yaml");
        if self.args.no_impersonate {
            idem_tests::kubeconfig::write(self.kubeconfig, &op_kubeconfig)?;
        } else {
            operator::impersonating_kubeconfig(self.kubeconfig, &op_kubeconfig)?;
        }
        let log = self.work.join("operator.log");
        let op = operator.insert(Operator::spawn(self.operator_bin, &op_kubeconfig, &log)?);
        step.set_message(format!("starting idem-operator (log: {})", log.display()));
        op.wait_ready(OPERATOR_READY_TIMEOUT).await?;
        let who = if self.args.no_impersonate {
            "as the kubeconfig's user".to_string()
        } else {
            format!("as {}", operator::SERVICE_ACCOUNT_USER)
        };
        step.done(&format!("ready, {who}; log: {}", log.display()));

        self.apply_examples(&mut applier, &client, op).await?;
        self.wait_ready(&client, op).await?;
        Ok(client)
    }

    /// Tenants (cluster-scoped objects) first, then each namespaced example once its
    /// namespace — created by the operator for a tenant — exists.
    async fn apply_examples(
        &self,
        applier: &mut Applier,
        client: &Client,
        op: &mut Operator,
    ) -> anyhow::Result<()> {
        let what = format!("applying {}", self.args.examples.display());
        let step = Step::start(what.clone());
        let (namespaced, cluster): (Vec<&Manifest>, Vec<&Manifest>) = self
            .examples
            .iter()
            .partition(|m| m.object.metadata.namespace.is_some());
        for m in &cluster {
            applier.apply(m).await?;
        }
        for m in &namespaced {
            let ns = m.object.metadata.namespace.as_deref().unwrap_or_default();
            step.set_message(format!("{what}: waiting for namespace {ns}"));
            if let Some(status) = op.exited() {
                return Err(op.died(&status));
            }
            apply::wait_for_namespace(client, ns, self.args.timeout).await?;
            applier.apply(m).await?;
        }
        step.done(&describe_all(self.examples));
        Ok(())
    }

    /// Polls every example until all are Ready for their current generation, or the timeout;
    /// the error names each one that is not Ready and its conditions, and the table follows.
    async fn wait_ready(&self, client: &Client, op: &mut Operator) -> anyhow::Result<()> {
        let targets = Target::from_manifests(self.examples);
        let step = Step::start(format!(
            "waiting for {} examples to be Ready",
            targets.len()
        ));
        let deadline = Instant::now() + self.args.timeout;
        loop {
            if let Some(status) = op.exited() {
                return Err(op.died(&status));
            }
            let observed = report::observe(client, &targets).await?;
            let pending: Vec<_> = observed.iter().filter(|o| !o.ready).collect();
            if pending.is_empty() {
                step.done("");
                return Ok(());
            }
            step.set_message(format!(
                "waiting for {} examples to be Ready: {}/{} — next: {} ({})",
                targets.len(),
                targets.len() - pending.len(),
                targets.len(),
                pending[0].target.describe(),
                pending[0].detail
            ));
            if Instant::now() >= deadline {
                drop(step);
                if let Ok(table) = report::table(client).await {
                    println!("{table}");
                }
                let lines: Vec<String> = pending
                    .iter()
                    .map(|o| format!("  {}: {}", o.target.describe(), o.detail))
                    .collect();
                bail!(
                    "not Ready after {}s:\n{}\noperator log: {}",
                    self.args.timeout.as_secs(),
                    lines.join("\n"),
                    op.log().display()
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    fn print_usage(&self, op: &Operator) {
        eprintln!("operator metrics: http://{}/metrics", op.metrics);
        if let Some(cp) = self.control_plane {
            let kubectl = binaries::ensure_built()
                .map(|b| b.path("kubectl").display().to_string())
                .unwrap_or_else(|_| "kubectl".into());
            eprintln!(
                "control plane logs: {}",
                cp.run_dir().join("logs").display()
            );
            eprintln!("try:");
            eprintln!("  export KUBECONFIG={}", cp.kubeconfig_path().display());
            eprintln!("  {kubectl} get tenants,tenantapps -A");
        }
        if self.control_plane.is_some() {
            eprintln!("running; press Ctrl-C to stop the operator and the control plane");
        } else {
            eprintln!("running; press Ctrl-C to stop the operator (your cluster keeps running)");
        }
    }
}

/// Stops the operator (it finishes in-flight reconciles), then the local control plane.
fn teardown(operator: Option<Operator>, control_plane: Option<ControlPlane>) {
    if let Some(mut op) = operator {
        let step = Step::start("stopping idem-operator");
        let how = op.stop();
        step.done(&how);
    }
    if let Some(cp) = control_plane {
        let step = Step::start("stopping the local control plane");
        cp.stop();
        step.done("");
    }
}

/// `Kind name, Kind ns/name, …`.
fn describe_all(manifests: &[Manifest]) -> String {
    manifests
        .iter()
        .map(Manifest::describe)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads and merges a `:`-separated kubeconfig list (kubectl's rule: the first file that sets
/// a value wins).
fn load_kubeconfig(paths: &OsString) -> anyhow::Result<Kubeconfig> {
    let mut merged: Option<Kubeconfig> = None;
    for path in std::env::split_paths(paths).filter(|p| !p.as_os_str().is_empty()) {
        let config = Kubeconfig::read_from(&path)
            .with_context(|| format!("reading kubeconfig {}", path.display()))?;
        merged = Some(match merged {
            None => config,
            Some(m) => m.merge(config)?,
        });
    }
    merged.context("--kubeconfig names no file")
}

/// `$TMPDIR/idem-dev/<pid>/` for the operator's kubeconfig and log; directories of runs whose
/// process is gone are removed first.
fn work_dir() -> anyhow::Result<PathBuf> {
    let root = std::env::temp_dir().join("idem-dev");
    if let Ok(entries) = std::fs::read_dir(&root) {
        for e in entries.flatten() {
            let stale = e
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|pid| !idem_tests::process::pid_alive(pid));
            if stale {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = root.join(std::process::id().to_string());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// SIGINT (Ctrl-C) and SIGTERM.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            int: signal(SignalKind::interrupt()).context("installing a SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("installing a SIGTERM handler")?,
        })
    }

    /// Waits for either signal and names it.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "interrupted (SIGINT)",
            _ = self.term.recv() => "terminated (SIGTERM)",
        }
    }
}
