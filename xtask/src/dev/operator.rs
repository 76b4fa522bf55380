//! Building `idem-operator` with cargo and running it as a child process (its log in a file,
//! impersonating its ServiceAccount), waiting for its `/readyz`, and stopping it.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use idem_tests::process::{dying_with_parent, tail};
use indicatif::ProgressBar;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The user the operator's kubeconfig impersonates: its ServiceAccount, so the least-privilege
/// ClusterRole in `deploy/operator/` is what the API server really checks.
pub const SERVICE_ACCOUNT_USER: &str = "system:serviceaccount:idem-system:idem-operator";

/// How long the operator gets to finish in-flight reconciles after SIGTERM before SIGKILL
/// (its `--shutdown-grace` is a little shorter).
const STOP_GRACE: Duration = Duration::from_secs(15);

/// Builds the operator (`cargo build -p idem-operator`, the same profile and target directory
/// as this xtask) and returns the path of the binary, showing cargo's progress in `bar`.
///
/// # Errors
/// When cargo cannot be started or the build fails (with the tail of cargo's output).
pub fn build(bar: &ProgressBar) -> anyhow::Result<PathBuf> {
    build_bin(bar, "idem-operator", "idem-operator")
}

/// Builds binary `bin` of workspace package `package` as [`build`] builds the operator and
/// returns its path.
///
/// # Errors
/// As [`build`].
pub fn build_bin(bar: &ProgressBar, package: &str, bin: &str) -> anyhow::Result<PathBuf> {
    build_bin_with(bar, package, bin, false)
}

/// Builds binary `bin` of workspace package `package` as [`build_bin`] does, with the
/// `release` profile when `release` is set, and returns its path.
///
/// # Errors
/// As [`build`].
pub fn build_bin_with(
    bar: &ProgressBar,
    package: &str,
    bin: &str,
    release: bool,
) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // SIGTERM to cargo if `dev` dies mid-build, so no orphaned build keeps the machine busy.
    let mut cmd = dying_with_parent(Path::new(&cargo), "TERM");
    // `cargo run` / `cargo test` set per-package variables for this process; passed on, they
    // change build-script fingerprints (ring reruns on CARGO_MANIFEST_DIR) and the next plain
    // `cargo build` would rebuild half the tree.
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(is_per_package_cargo_var) {
            cmd.env_remove(key);
        }
    }
    let mut child = cmd
        .args([
            "build",
            "--package",
            package,
            "--bin",
            bin,
            "--message-format=json-render-diagnostics",
        ])
        .args(release.then_some("--release"))
        .current_dir(crate::generated::repo_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting `cargo build -p {package}`"))?;
    let stdout = child.stdout.take().context("cargo stdout")?;
    let stderr = child.stderr.take().context("cargo stderr")?;
    // cargo's human output (`Compiling …`, errors) goes to stderr: show it as progress.
    let progress = bar.clone();
    let bin_name = bin.to_owned();
    let errors = std::thread::spawn(move || {
        let mut tail: Vec<String> = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            progress.set_message(format!("building {bin_name}: {}", line.trim()));
            tail.push(line);
            if tail.len() > 40 {
                tail.remove(0);
            }
        }
        tail.join("\n")
    });
    // The JSON messages on stdout name the executable.
    let mut executable = None;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && msg["target"]["name"] == bin
            && let Some(path) = msg["executable"].as_str()
        {
            executable = Some(PathBuf::from(path));
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    let tail = errors.join().unwrap_or_default();
    if !status.success() {
        bail!("`cargo build -p {package}` failed ({status}):\n{tail}");
    }
    executable.with_context(|| format!("cargo built {bin} but named no executable"))
}

/// Whether `key` is one of the variables cargo sets for the package it runs (not the user's
/// own configuration such as `CARGO_TARGET_DIR` or `CARGO_HOME`).
fn is_per_package_cargo_var(key: &str) -> bool {
    key.starts_with("CARGO_PKG_")
        || key.starts_with("CARGO_BIN_EXE_")
        || matches!(
            key,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "OUT_DIR"
        )
}

/// Writes a copy of `config` whose current user impersonates [`SERVICE_ACCOUNT_USER`]
/// (kubeconfig `as:`; the API server adds the ServiceAccount groups itself) to `out`.
///
/// # Errors
/// When the kubeconfig names no current user, or `out` cannot be written.
pub fn impersonating_kubeconfig(
    config: &kube::config::Kubeconfig,
    out: &Path,
) -> anyhow::Result<()> {
    let mut config = config.clone();
    let context_name = config
        .current_context
        .clone()
        .context("the kubeconfig has no current-context")?;
    let user = config
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone())
        .with_context(|| format!("context {context_name} names no user"))?;
    let auth = config
        .auth_infos
        .iter_mut()
        .find(|a| a.name == user)
        .and_then(|a| a.auth_info.as_mut())
        .with_context(|| format!("the kubeconfig has no user {user}"))?;
    auth.impersonate = Some(SERVICE_ACCOUNT_USER.into());
    auth.impersonate_groups = None;
    idem_tests::kubeconfig::write(&config, out)?;
    Ok(())
}

/// A free loopback address below the kernel's ephemeral port range (see
/// [`idem_tests::ports::free_port`]), released for the operator to bind.
///
/// # Errors
/// When no port can be bound.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    let port = idem_tests::ports::free_port(&[]).context("finding a free port")?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// The running operator; dropping it stops it.
#[derive(Debug)]
pub struct Operator {
    child: Child,
    log: PathBuf,
    health: SocketAddr,
    /// The address of its `/metrics`.
    pub metrics: SocketAddr,
}

impl Operator {
    /// Starts `binary run` against `kubeconfig`, output appended to `log`, in its own process
    /// group (so a terminal Ctrl-C reaches only xtask, which stops things in order), with a
    /// parent-death SIGKILL when `setpriv` is available.
    ///
    /// # Errors
    /// When the log cannot be created or the binary cannot be started.
    pub fn spawn(binary: &Path, kubeconfig: &Path, log: &Path) -> anyhow::Result<Self> {
        let health = free_addr()?;
        let metrics = free_addr()?;
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = dying_with_parent(binary, "KILL");
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg(format!("--health-addr={health}"))
            .arg(format!("--metrics-addr={metrics}"))
            .arg("--shutdown-grace=10s")
            // Where `deploy/` gives the operator its Role on Leases (the shard ring it must not
            // run beside is looked for there); the kubeconfig names no namespace.
            .arg(format!(
                "--leader-elect-namespace={}",
                crate::manifests::NAMESPACE
            ))
            .env_remove("KUBECONFIG")
            // Plain text in the log file (tracing-subscriber honours NO_COLOR).
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Self {
            child,
            log: log.to_path_buf(),
            health,
            metrics,
        })
    }

    /// The operator's log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Some(description)` once the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("unknown state ({e})")),
        }
    }

    /// An error saying the operator exited, with the tail of its log.
    pub fn died(&self, status: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "the operator exited ({status}); last lines of {}:\n{}",
            self.log.display(),
            tail(&self.log, 30)
        )
    }

    /// Waits until `GET /readyz` answers 200 (caches synced), polling every 200 ms.
    ///
    /// # Errors
    /// When the operator exits first or is not ready within `timeout`; both carry the tail of
    /// its log.
    pub async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return Err(self.died(&status));
            }
            let addr = self.health;
            let ready = tokio::task::spawn_blocking(move || http_status(addr, "/readyz"))
                .await
                .ok()
                .flatten()
                == Some(200);
            if ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the operator's /readyz ({}) was not 200 within {}s; last lines of {}:\n{}",
                    self.health,
                    timeout.as_secs(),
                    self.log.display(),
                    tail(&self.log, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the operator: SIGTERM (it finishes in-flight reconciles), then SIGKILL after
    /// [`STOP_GRACE`]; always reaps it. Returns how it exited.
    pub fn stop(&mut self) -> String {
        if let Some(status) = self.exited() {
            return status;
        }
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        format!("killed after {}s", STOP_GRACE.as_secs())
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The HTTP status of `GET path` on `addr` (plain HTTP/1.0), or `None` when it cannot connect.
fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let timeout = Duration::from_secs(2);
    let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).ok()?;
    let line = std::str::from_utf8(&head[..n]).ok()?;
    // "HTTP/1.1 200 OK"
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifests::{NAME, NAMESPACE};
    use std::fs;

    #[test]
    fn the_impersonating_kubeconfig_acts_as_the_service_account() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("admin.yaml");
        fs::write(
            &src,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n\
             contexts: [{name: c, context: {cluster: k, user: admin}}]\n\
             users: [{name: other, user: {token: x}}, {name: admin, user: {token: secret}}]\n",
        )
        .unwrap();
        let out = dir.path().join("sa.yaml");
        let admin = kube::config::Kubeconfig::read_from(&src).unwrap();
        impersonating_kubeconfig(&admin, &out).unwrap();
        let config = kube::config::Kubeconfig::read_from(&out).unwrap();
        let admin = config
            .auth_infos
            .iter()
            .find(|a| a.name == "admin")
            .unwrap();
        let admin = admin.auth_info.as_ref().unwrap();
        assert_eq!(admin.impersonate.as_deref(), Some(SERVICE_ACCOUNT_USER));
        let other = config
            .auth_infos
            .iter()
            .find(|a| a.name == "other")
            .unwrap();
        assert_eq!(other.auth_info.as_ref().unwrap().impersonate, None);
        assert_eq!(
            SERVICE_ACCOUNT_USER,
            format!("system:serviceaccount:{NAMESPACE}:{NAME}")
        );
    }

    #[test]
    fn a_kubeconfig_without_a_current_context_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let config = kube::config::Kubeconfig::default();
        let err = format!(
            "{:#}",
            impersonating_kubeconfig(&config, &dir.path().join("o")).unwrap_err()
        );
        assert!(err.contains("no current-context"), "{err}");
    }

    #[test]
    fn only_per_package_cargo_variables_are_dropped() {
        for key in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_BIN_EXE_xtask",
            "OUT_DIR",
        ] {
            assert!(is_per_package_cargo_var(key), "{key}");
        }
        for key in [
            "CARGO_TARGET_DIR",
            "CARGO_HOME",
            "CARGO",
            "RUSTFLAGS",
            "PATH",
        ] {
            assert!(!is_per_package_cargo_var(key), "{key}");
        }
    }

    #[test]
    fn http_status_reads_the_status_line_and_fails_soft() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            // Read the whole request: closing with unread bytes makes the kernel reset the
            // connection, and the client may see the reset before the status line.
            let mut request = Vec::new();
            let mut buf = [0u8; 256];
            while !request.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 503 Service Unavailable\r\n\r\n")
                .unwrap();
        });
        assert_eq!(http_status(addr, "/readyz"), Some(503));
        server.join().unwrap();
        // Nothing listens there any more.
        assert_eq!(http_status(addr, "/readyz"), None);
    }
}
