//! The operator binary run as a separate process, the way `deploy/operator/04-deployment.yaml`
//! runs it: the container's args and env from the generated manifest, loopback ports instead of
//! `0.0.0.0`, the kubeconfig of the shared control plane, and probes on the manifest's paths.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use super::{free_addr, http_get};

/// The operator container of the generated Deployment manifest.
pub fn deployment_container() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/operator/04-deployment.yaml");
    let text = std::fs::read_to_string(&path).expect("reading the Deployment manifest");
    let deployment: Value = serde_saphyr::from_str(&text).expect("the Deployment manifest parses");
    deployment["spec"]["template"]["spec"]["containers"][0].clone()
}

/// One operator process.
pub struct OperatorProcess {
    /// Its pod name (identity in the Lease).
    pub name: String,
    /// Where it serves `/metrics`, `/healthz` and `/readyz` (one loopback port for all).
    pub addr: SocketAddr,
    /// The path of its readiness probe (from the manifest).
    pub readiness_path: String,
    /// Its stderr/stdout.
    pub log: PathBuf,
    child: Child,
}

impl OperatorProcess {
    /// Starts the operator as the Deployment's container would in namespace `namespace` as pod
    /// `name`: the manifest's args (with `0.0.0.0:*` addresses moved to one free loopback
    /// port), `POD_NAME`/`POD_NAMESPACE` as the downward API sets them, and the shared control
    /// plane's kubeconfig. It dies with the test binary.
    pub fn spawn(namespace: &str, name: &str) -> Self {
        Self::spawn_with(
            idem_tests::shared().kubeconfig_path(),
            namespace,
            name,
            |args| args,
        )
    }

    /// [`OperatorProcess::spawn`] with leader election (`--leader-elect`, for users who want
    /// one active replica) instead of the manifest's `--shards=auto`.
    pub fn spawn_leader_elect(namespace: &str, name: &str) -> Self {
        Self::spawn_with(
            idem_tests::shared().kubeconfig_path(),
            namespace,
            name,
            |args| {
                let mut args: Vec<String> = args
                    .into_iter()
                    .filter(|a| !a.starts_with("--shards"))
                    .collect();
                args.insert(1, "--leader-elect".into());
                args
            },
        )
    }

    /// [`OperatorProcess::spawn`] against the control plane of `kubeconfig`, with the
    /// manifest's args passed through `edit` first (e.g. to switch `--leader-elect` for
    /// `--shards=auto`).
    pub fn spawn_with(
        kubeconfig: &Path,
        namespace: &str,
        name: &str,
        edit: impl FnOnce(Vec<String>) -> Vec<String>,
    ) -> Self {
        let container = deployment_container();
        let addr = free_addr();
        let manifest_args: Vec<String> = container["args"]
            .as_array()
            .expect("the container has args")
            .iter()
            .map(|a| a.as_str().expect("string args").to_string())
            .collect();
        let args: Vec<String> = edit(manifest_args)
            .iter()
            .map(|a| match a.split_once('=') {
                Some((flag, v)) if v.starts_with("0.0.0.0:") => format!("{flag}={addr}"),
                _ => a.to_string(),
            })
            .collect();
        let env_names: Vec<&str> = container["env"]
            .as_array()
            .map(|e| e.iter().filter_map(|v| v["name"].as_str()).collect())
            .unwrap_or_default();
        assert!(
            env_names.contains(&"POD_NAME") && env_names.contains(&"POD_NAMESPACE"),
            "the manifest sets POD_NAME and POD_NAMESPACE: {env_names:?}"
        );
        let readiness_path = container["readinessProbe"]["httpGet"]["path"]
            .as_str()
            .expect("a readiness probe")
            .to_string();
        let log =
            std::env::temp_dir().join(format!("idem-operator-{name}-{}.log", std::process::id()));
        let out = File::create(&log).expect("creating the operator's log");
        let err = out.try_clone().expect("duplicating a log handle");
        // The manifest's literal values (e.g. the allocator's tunables), as the kubelet sets them.
        let literal: Vec<(String, String)> = container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| Some((v["name"].as_str()?.into(), v["value"].as_str()?.into())))
            .collect();
        let program = Path::new(env!("CARGO_BIN_EXE_idem-operator"));
        let child = idem_tests::process::dying_with_parent(program, "KILL")
            .args(&args)
            .envs(literal)
            .env("POD_NAME", name)
            .env("POD_NAMESPACE", namespace)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("starting idem-operator");
        Self {
            name: name.to_string(),
            addr,
            readiness_path,
            log,
            child,
        }
    }

    /// Whether its readiness probe answers 200 (as the kubelet's HTTP probe judges).
    pub async fn ready(&self) -> bool {
        matches!(
            http_get(self.addr, &self.readiness_path).await,
            Ok((200, _))
        )
    }

    /// Its `/metrics` text, if it answers.
    pub async fn metrics(&self) -> Option<String> {
        match http_get(self.addr, "/metrics").await {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    }

    /// `leader_election_master_status` from its `/metrics` (None if it does not answer).
    pub async fn is_leader(&self) -> Option<bool> {
        let text = self.metrics().await?;
        text.lines()
            .find_map(|l| l.strip_prefix("leader_election_master_status "))
            .map(|v| v.trim() == "1")
    }

    /// Reconciles made so far by `controller`, from its `/metrics`.
    pub async fn reconciles(&self, controller: &str) -> u64 {
        super::reconciles_in(&self.metrics().await.unwrap_or_default(), controller)
    }

    /// `Some(status)` once it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends `signal` to it (SIGSTOP pauses it, SIGCONT resumes it, SIGKILL kills it).
    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).expect("signalling the operator");
    }

    /// Its resident memory (`VmRSS` of `/proc/<pid>/status`), in KiB.
    ///
    /// # Panics
    /// When the process is gone.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the operator's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }

    /// The end of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        idem_tests::process::tail(&self.log, 40)
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
