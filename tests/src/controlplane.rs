//! Starting and stopping one local control plane: etcd → kube-apiserver →
//! kube-controller-manager → kube-scheduler → kwok, on free loopback ports, with a fresh PKI.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::thread::{self, JoinHandle};

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::binaries::{self, Binaries};
use crate::error::{Error, Result};
use crate::kubeconfig;
use crate::pki::Pki;
use crate::ports::{PORT_ATTEMPTS, free_port, lost_a_port};
use crate::process::{self, Lifetime, Process, STOP_GRACE};
use crate::readiness;
use crate::state::{self, State};

/// The default service CIDR given to the API server and controller-manager (254 Services;
/// see [`Options::service_cidr`]).
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The first address of [`SERVICE_CIDR`]: the `kubernetes` Service's ClusterIP.
pub const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// A service CIDR for big runs: 65,534 Services.
pub const LARGE_SERVICE_CIDR: &str = "10.0.0.0/16";
/// Annotation that tells kwok to manage a Node (kwok's own convention).
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// How to start a control plane.
#[derive(Debug, Clone)]
pub struct Options {
    /// Whether the processes die with the starter ([`Lifetime::Attached`], the default) or keep
    /// running for `cargo xtask controlplane down` ([`Lifetime::Detached`]).
    pub lifetime: Lifetime,
    /// How many kwok fake nodes to register (default 2).
    pub nodes: u32,
    /// Where run directories go (default [`state::root`]: `$TMPDIR/idem-controlplane/`).
    pub run_root: PathBuf,
    /// The IPv4 service CIDR (`--service-cluster-ip-range` of the API server and the
    /// controller-manager), default [`SERVICE_CIDR`] (a /24: 254 Services, fast to start);
    /// [`LARGE_SERVICE_CIDR`] (a /16) holds thousands. Its first address is the `kubernetes`
    /// Service's ClusterIP and goes into the serving certificate. Prefix lengths 12–28 (the
    /// API server refuses IPv4 ranges wider than /12).
    pub service_cidr: String,
    /// Extra feature gates, each `Name=true|false`, given as `--feature-gates` to the API
    /// server, controller-manager and scheduler (default none).
    pub feature_gates: Vec<String>,
    /// Extra arguments of kube-controller-manager, appended last (default none), e.g.
    /// `--controllers=*,-garbage-collector-controller` to keep the garbage collector's
    /// owner look-ups out of a benchmark's request counts.
    pub controller_manager_args: Vec<String>,
    /// Extra arguments of kube-apiserver, appended last (default none), e.g.
    /// `--etcd-compaction-interval=1s` to have its history forgotten within seconds.
    pub apiserver_args: Vec<String>,
}

impl Options {
    /// The service CIDR's first usable address (the `kubernetes` Service's ClusterIP).
    ///
    /// # Errors
    /// [`Error::Options`] when [`Options::service_cidr`] is not `a.b.c.d/p` with `p` in 12–28.
    pub fn service_ip(&self) -> Result<Ipv4Addr> {
        let bad = || {
            Error::Options(format!(
                "service CIDR {:?} must be an IPv4 network a.b.c.d/p with p from 12 to 28",
                self.service_cidr
            ))
        };
        let (addr, prefix) = self.service_cidr.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let prefix: u32 = prefix.parse().map_err(|_| bad())?;
        if !(12..=28).contains(&prefix) {
            return Err(bad());
        }
        let mask = u32::MAX << (32 - prefix);
        Ok(Ipv4Addr::from((u32::from(addr) & mask) + 1))
    }

    /// Checks the feature gates' `Name=true|false` shape.
    fn check_feature_gates(&self) -> Result<()> {
        for gate in &self.feature_gates {
            let ok = gate.split_once('=').is_some_and(|(name, value)| {
                !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_alphanumeric())
                    && matches!(value, "true" | "false")
            });
            if !ok {
                return Err(Error::Options(format!(
                    "feature gate {gate:?} must be Name=true or Name=false"
                )));
            }
        }
        Ok(())
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            lifetime: Lifetime::Attached,
            nodes: 2,
            run_root: state::root(),
            service_cidr: SERVICE_CIDR.to_owned(),
            feature_gates: Vec::new(),
            controller_manager_args: Vec::new(),
            apiserver_args: Vec::new(),
        }
    }
}

/// A running local control plane.
///
/// Dropping an attached control plane stops every process (SIGTERM, then SIGKILL after
/// [`STOP_GRACE`]) in reverse start order and removes its run directory. Should the harness
/// die without dropping it (a shared control plane in a `static`, a killed test binary), the
/// kernel kills the processes (parent-death signal) and the next start removes the stale run
/// directory.
#[derive(Debug)]
pub struct ControlPlane {
    info: Info,
    keeper: Option<Keeper>,
}

/// What a started control plane tells its users.
#[derive(Debug, Clone)]
pub(crate) struct Info {
    pub(crate) run_dir: PathBuf,
    pub(crate) kubeconfig: PathBuf,
    pub(crate) config: kube::Config,
    pub(crate) kubectl: PathBuf,
    pub(crate) logs: Vec<(String, PathBuf)>,
    pub(crate) pids: Vec<(String, u32)>,
    pub(crate) server: String,
}

/// The thread that spawned the attached processes and stops them when told to (or never, for
/// a control plane in a `static`: then the parent-death signal stops them at process exit).
#[derive(Debug)]
struct Keeper {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl ControlPlane {
    /// Builds the binaries if needed ([`binaries::ensure_built`]) and starts an attached
    /// control plane with two kwok nodes. See [`ControlPlane::start_with`].
    ///
    /// # Errors
    /// As [`ControlPlane::start_with`].
    pub fn start() -> Result<Self> {
        Self::start_with(Options::default())
    }

    /// Builds the binaries if needed and starts a control plane; returns once the API server
    /// answers `/readyz`, the `default` namespace and its `default` ServiceAccount exist (so the
    /// controller-manager works) and every kwok node is Ready. About 5 s when built.
    ///
    /// Blocks the calling thread; the processes are spawned from a dedicated thread, so this
    /// may be called from inside a Tokio runtime.
    ///
    /// # Errors
    /// [`Error::Options`] for an invalid service CIDR or feature gate (nothing started);
    /// build errors from [`binaries::ensure_built`]; [`Error::NotReady`] with the tail of the
    /// failing component's log when a process exits or does not become ready in time
    /// (everything already started is stopped again); [`Error::Io`] / [`Error::Pki`] for local
    /// failures.
    pub fn start_with(options: Options) -> Result<Self> {
        options.service_ip()?;
        options.check_feature_gates()?;
        let bins = binaries::ensure_built()?;
        let lifetime = options.lifetime;
        let run_dir = match lifetime {
            Lifetime::Attached => state::new_attached_dir(&options.run_root)?,
            Lifetime::Detached => state::claim_detached_dir(&options.run_root)?,
        };
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let thread = thread::Builder::new()
            .name("idem-controlplane".into())
            .spawn(move || {
                let mut procs = Vec::new();
                let result = launch_retrying(&options, &bins, &run_dir, &mut procs);
                let started = result.is_ok();
                let _ = ready_tx.send(result);
                if lifetime == Lifetime::Detached && started {
                    return;
                }
                if started {
                    // Wait for Drop (or for the sender to vanish); a shared control plane in a
                    // `static` waits here until the process exits.
                    let _ = stop_rx.recv();
                }
                for p in procs.iter_mut().rev() {
                    p.stop(STOP_GRACE);
                }
                let _ = fs::remove_dir_all(&run_dir);
            })
            .map_err(Error::io("starting the control-plane thread"))?;
        let info = ready_rx.recv().unwrap_or_else(|_| {
            Err(Error::Kubeconfig(
                "the control-plane thread died while starting".into(),
            ))
        });
        let keeper = Keeper {
            stop: stop_tx,
            thread,
        };
        match (info, lifetime) {
            (Ok(info), Lifetime::Attached) => Ok(Self {
                info,
                keeper: Some(keeper),
            }),
            (Ok(info), Lifetime::Detached) => {
                let _ = keeper.thread.join();
                Ok(Self { info, keeper: None })
            }
            (Err(e), _) => {
                let _ = keeper.thread.join();
                Err(e)
            }
        }
    }

    /// A new client for the admin user (`system:masters`).
    ///
    /// Each call builds a new [`kube::Client`], because a client belongs to the Tokio runtime
    /// it was made in and tests each run their own runtime.
    ///
    /// # Panics
    /// Outside a Tokio runtime (kube's client spawns its connection task).
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.info.config.clone())
            .expect("a client from the control plane's own kubeconfig")
    }

    /// The admin user's client configuration, for clients built by hand (e.g. with a
    /// [`crate::faults::Faults`] layer).
    pub fn config(&self) -> kube::Config {
        self.info.config.clone()
    }

    /// The kubeconfig for the admin user; `kubectl --kubeconfig <path>` works with it.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.info.kubeconfig
    }

    /// The API server's URL, e.g. `https://127.0.0.1:41234`.
    pub fn server(&self) -> &str {
        &self.info.server
    }

    /// A [`Command`] for the control plane's own kubectl (same version as the server) with
    /// `KUBECONFIG` pointing at this control plane; add arguments and run it.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(&self.info.kubectl);
        cmd.env("KUBECONFIG", &self.info.kubeconfig);
        cmd
    }

    /// The raw text of the API server's `/metrics` (Prometheus text format); count requests
    /// with [`crate::metrics`].
    ///
    /// # Errors
    /// [`Error::Kube`] when the request fails.
    pub async fn metrics(&self) -> Result<String> {
        readiness::get_text(&self.client(), "/metrics").await
    }

    /// Each component's name and log file, in start order.
    pub fn logs(&self) -> &[(String, PathBuf)] {
        &self.info.logs
    }

    /// Each component's name and process id, in start order.
    pub fn pids(&self) -> &[(String, u32)] {
        &self.info.pids
    }

    /// The run directory (PKI, etcd data, logs, kubeconfig).
    pub fn run_dir(&self) -> &Path {
        &self.info.run_dir
    }

    /// Stops an attached control plane now (the same as dropping it).
    pub fn stop(self) {
        drop(self)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.stop.send(());
            let _ = keeper.thread.join();
        }
    }
}

/// Stops the detached control plane recorded under `run_root` (see [`Options::run_root`]), as
/// `cargo xtask controlplane down` does, and removes the run directories test binaries that
/// ended left there; returns the stopped components with their pids.
///
/// # Errors
/// [`Error::NoState`] when none is recorded.
pub fn down(run_root: &Path) -> Result<Vec<String>> {
    state::sweep_stale(run_root);
    let dir = state::detached_dir(run_root);
    let state = State::load(&dir)?;
    let mut stopped = Vec::new();
    for (name, pid) in state.pids.iter().rev() {
        process::stop_pid(*pid, STOP_GRACE);
        stopped.push(format!("{name} (pid {pid})"));
    }
    fs::remove_dir_all(&dir).map_err(Error::io(format!("removing {}", dir.display())))?;
    Ok(stopped)
}

/// [`launch`], retried on fresh ports and a fresh run directory while a component loses its
/// port to another process (see [`free_port`]).
fn launch_retrying(
    options: &Options,
    bins: &Binaries,
    run_dir: &Path,
    procs: &mut Vec<Process>,
) -> Result<Info> {
    let mut attempt = 1;
    loop {
        match launch(options, bins, run_dir, procs) {
            Err(e) if attempt < PORT_ATTEMPTS && lost_a_port(&e) => {
                eprintln!(
                    "idem-controlplane: {e}\nidem-controlplane: starting again on other ports"
                );
                for p in procs.iter_mut().rev() {
                    p.stop(STOP_GRACE);
                }
                procs.clear();
                fs::remove_dir_all(run_dir)
                    .and_then(|()| fs::create_dir_all(run_dir))
                    .map_err(Error::io(format!("emptying {}", run_dir.display())))?;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Starts every component in order, pushing each started process into `procs` (so the caller
/// can stop them even when a later step fails).
fn launch(
    options: &Options,
    bins: &Binaries,
    run_dir: &Path,
    procs: &mut Vec<Process>,
) -> Result<Info> {
    let pki = Pki::generate(&run_dir.join("pki"), options.service_ip()?)?;
    let service_cidr = &options.service_cidr;
    let gates = (!options.feature_gates.is_empty())
        .then(|| format!("--feature-gates={}", options.feature_gates.join(",")));
    let logs = run_dir.join("logs");
    fs::create_dir_all(&logs).map_err(Error::io("creating the log directory"))?;
    let mut ports = Vec::with_capacity(6);
    for _ in 0..6 {
        let port = free_port(&ports)?;
        ports.push(port);
    }
    let [etcd_client, etcd_peer, api, kcm, sched, kwok] = ports[..] else {
        unreachable!("six ports were chosen")
    };
    let server = format!("https://127.0.0.1:{api}");
    let kubeconfig_path = run_dir.join("kubeconfig");
    let kubeconfig = kubeconfig::admin(&server, &pki)?;
    kubeconfig::write(&kubeconfig, &kubeconfig_path)?;
    let kc = kubeconfig_path.display().to_string();
    let p = |f: &Path| f.display().to_string();

    let lifetime = options.lifetime;
    let spawn = |procs: &mut Vec<Process>, name: &str, args: Vec<String>| -> Result<()> {
        let log = logs.join(format!("{name}.log"));
        procs.push(Process::spawn(
            name,
            &bins.path(name),
            &args,
            &log,
            lifetime,
        )?);
        Ok(())
    };
    let etcd_url = format!("http://127.0.0.1:{etcd_client}");
    let peer_url = format!("http://127.0.0.1:{etcd_peer}");
    spawn(
        procs,
        "etcd",
        vec![
            "--name=idem".into(),
            format!("--data-dir={}", p(&run_dir.join("etcd"))),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=idem={peer_url}"),
            "--unsafe-no-fsync".into(),
            // etcd's largest recommended backend (its default is 2 GiB): a bench fleet of
            // 10,000 tenants per controller is hundreds of thousands of objects with their
            // history.
            "--quota-backend-bytes=8589934592".into(),
            "--log-level=warn".into(),
        ],
    )?;
    spawn(
        procs,
        "kube-apiserver",
        vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--cert-dir={}", p(&run_dir.join("apiserver-certs"))),
            format!("--secure-port={api}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            // Loopback may not be an endpoint of the `kubernetes` Service; without this the
            // server exits (envtest does the same).
            "--endpoint-reconciler-type=none".into(),
            format!("--tls-cert-file={}", p(&pki.serving_cert)),
            format!("--tls-private-key-file={}", p(&pki.serving_key)),
            format!("--client-ca-file={}", p(&pki.ca_cert)),
            format!("--service-cluster-ip-range={service_cidr}"),
            format!("--service-account-issuer={server}"),
            format!("--service-account-key-file={}", p(&pki.sa_pub)),
            format!("--service-account-signing-key-file={}", p(&pki.sa_key)),
            "--authorization-mode=RBAC".into(),
            "--allow-privileged=true".into(),
            "--v=1".into(),
        ]
        .into_iter()
        .chain(gates.clone())
        .chain(options.apiserver_args.iter().cloned())
        .collect(),
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::io("starting a Tokio runtime"))?;
    let config = rt.block_on(kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &KubeConfigOptions::default(),
    ));
    let mut config = config.map_err(|e| Error::Kubeconfig(e.to_string()))?;
    // The control plane is on this machine: a proxy from `HTTPS_PROXY` (set for the first
    // builds' downloads) could not reach it.
    config.proxy_url = None;
    rt.block_on(readiness::apiserver(&config, procs))?;

    let common = |port: u16| {
        vec![
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            "--leader-elect=false".into(),
            "--v=1".into(),
        ]
        .into_iter()
        .chain(gates.clone())
        .collect::<Vec<String>>()
    };
    let mut kcm_args = common(kcm);
    kcm_args.extend([
        format!("--cert-dir={}", p(&run_dir.join("kcm-certs"))),
        format!("--service-account-private-key-file={}", p(&pki.sa_key)),
        format!("--root-ca-file={}", p(&pki.ca_cert)),
        format!("--cluster-signing-cert-file={}", p(&pki.ca_cert)),
        format!("--cluster-signing-key-file={}", p(&pki.ca_key)),
        format!("--service-cluster-ip-range={service_cidr}"),
        "--use-service-account-credentials=false".into(),
    ]);
    kcm_args.extend(options.controller_manager_args.iter().cloned());
    spawn(procs, "kube-controller-manager", kcm_args)?;
    let mut sched_args = common(sched);
    sched_args.push(format!(
        "--cert-dir={}",
        p(&run_dir.join("scheduler-certs"))
    ));
    spawn(procs, "kube-scheduler", sched_args)?;
    spawn(
        procs,
        "kwok",
        vec![
            format!("--kubeconfig={kc}"),
            format!("--config={}", p(&bins.kwok_stages())),
            "--manage-all-nodes=false".into(),
            format!("--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake"),
            "--cidr=10.244.0.0/16".into(),
            "--node-ip=10.244.0.1".into(),
            format!("--server-address=127.0.0.1:{kwok}"),
        ],
    )?;
    rt.block_on(readiness::cluster(&config, options.nodes, procs))?;

    let info = Info {
        run_dir: run_dir.to_path_buf(),
        kubeconfig: kubeconfig_path,
        config,
        kubectl: bins.path("kubectl"),
        logs: procs
            .iter()
            .map(|p| (p.name().to_string(), p.log().to_path_buf()))
            .collect(),
        pids: procs
            .iter()
            .map(|p| (p.name().to_string(), p.pid()))
            .collect(),
        server,
    };
    if lifetime == Lifetime::Detached {
        State {
            pids: info.pids.clone(),
            kubeconfig: info.kubeconfig.clone(),
        }
        .save(run_dir)?;
        // Detached processes must outlive these handles: forget them without stopping.
        procs.drain(..).for_each(std::mem::forget);
    }
    Ok(info)
}

/// The kubeconfig a started control plane wrote (used by the CLI to print instructions).
pub fn load_kubeconfig(path: &Path) -> Result<Kubeconfig> {
    Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cidr(cidr: &str) -> Options {
        Options {
            service_cidr: cidr.into(),
            ..Options::default()
        }
    }

    #[test]
    fn service_ip_is_the_first_address_of_the_range() {
        assert_eq!(Options::default().service_ip().unwrap(), SERVICE_IP);
        assert_eq!(
            with_cidr(LARGE_SERVICE_CIDR).service_ip().unwrap(),
            SERVICE_IP
        );
        assert_eq!(
            with_cidr("10.96.3.7/12").service_ip().unwrap(),
            Ipv4Addr::new(10, 96, 0, 1)
        );
    }

    #[test]
    fn bad_service_cidrs_and_feature_gates_are_refused_before_starting() {
        for bad in [
            "10.0.0.0",
            "10.0.0.0/8",
            "10.0.0.0/30",
            "fd00::/108",
            "x/16",
        ] {
            assert!(
                matches!(with_cidr(bad).service_ip(), Err(Error::Options(_))),
                "{bad}"
            );
        }
        let gates = |g: &str| Options {
            feature_gates: vec![g.into()],
            ..Options::default()
        };
        assert!(gates("WatchList=true").check_feature_gates().is_ok());
        for bad in ["WatchList", "WatchList=yes", "=true", "a b=true"] {
            assert!(gates(bad).check_feature_gates().is_err(), "{bad}");
        }
        let err = ControlPlane::start_with(gates("Nope")).unwrap_err();
        assert!(matches!(err, Error::Options(_)), "{err}");
    }
}
