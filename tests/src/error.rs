//! The one error type of the control-plane harness.

use std::path::PathBuf;

/// Everything that can go wrong while building, starting, using or stopping the local control
/// plane. Each variant says what to do about it in its message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A start option is invalid (service CIDR, feature gate); nothing was started.
    #[error("invalid control-plane option: {0}")]
    Options(String),
    /// `go` is not on `PATH` (or `$IDEM_GO`): the control plane is built from Go modules.
    #[error(
        "Go is not installed (looked for `{0}`): idem builds its local control plane from Go modules; install Go >= 1.26"
    )]
    GoMissing(String),
    /// The installed Go is older than the control plane's `go.mod` needs.
    #[error("Go {found} is too old: the control plane's go.mod needs Go >= {needed}")]
    GoTooOld {
        /// Version reported by `go env GOVERSION`, e.g. `go1.25.3`.
        found: String,
        /// Minimum version, e.g. `1.26`.
        needed: String,
    },
    /// `go build` failed; the tail of its output is included.
    #[error("building the control plane failed (go build exited with {status}):\n{output}")]
    GoBuild {
        /// Exit status of `go build`.
        status: std::process::ExitStatus,
        /// The last lines of its combined output.
        output: String,
    },
    /// A file-system or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, e.g. `writing /tmp/x/ca.crt`.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Generating the PKI (CA, serving and client certificates, keys) failed.
    #[error("generating certificates: {0}")]
    Pki(#[from] rcgen::Error),
    /// A control-plane process exited or never became ready; the tail of its log is included.
    #[error("{component} did not become ready: {reason}\n--- last lines of {log} ---\n{tail}")]
    NotReady {
        /// The component, e.g. `kube-apiserver`.
        component: String,
        /// Why: exited with a status, or timed out after some seconds.
        reason: String,
        /// Its log file.
        log: PathBuf,
        /// The last lines of that log.
        tail: String,
    },
    /// A request to the API server failed.
    #[error("API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// The kubeconfig could not be written or loaded.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// A detached control plane is already running; `down` stops it.
    #[error(
        "a detached control plane is already running (kubeconfig {0}); stop it with `cargo xtask controlplane down`"
    )]
    AlreadyRunning(PathBuf),
    /// The saved state of a detached control plane is missing or unreadable.
    #[error(
        "no detached control plane found at {0} (start one with `cargo xtask controlplane up --detach`)"
    )]
    NoState(PathBuf),
}

impl Error {
    /// An [`Error::Io`] saying what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

/// Result with the harness's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
