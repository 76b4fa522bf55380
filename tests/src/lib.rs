//! idem's local Kubernetes control plane, built from pinned Go modules, the harness the
//! integration tests run against, and an idempotence test kit for any reconcile ([`kit`]).
//!
//! The control plane is real: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
//! and kwok (fake nodes on which pods really get scheduled and become Ready), plus the
//! matching kubectl, all built by [`binaries::ensure_built`] from the Go module in
//! `tests/controlplane/` (the envtest approach: no downloads of release binaries or images).
//!
//! ```no_run
//! # async fn demo() -> Result<(), idem_tests::Error> {
//! let cp = idem_tests::shared(); // one per test binary, started on first use
//! let client = cp.client();
//! let before = cp.metrics().await?;
//! // ... write something ...
//! let after = cp.metrics().await?;
//! let writes = idem_tests::metrics::writes(&after, "", "configmaps")
//!     - idem_tests::metrics::writes(&before, "", "configmaps");
//! # let _ = (client, writes); Ok(()) }
//! ```

pub mod admission;
pub mod binaries;
pub mod cluster;
mod controlplane;
mod error;
pub mod events;
pub mod faults;
pub mod kit;
pub mod kubeconfig;
pub mod logs;
pub mod metrics;
pub mod pki;
pub mod ports;
pub mod process;
mod readiness;
pub mod state;
mod wait;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

pub use cluster::{create_namespace, install_crd};
pub use controlplane::{
    ControlPlane, KWOK_NODE_ANNOTATION, LARGE_SERVICE_CIDR, Options, SERVICE_CIDR, SERVICE_IP,
    down, load_kubeconfig,
};
pub use error::{Error, Result};
pub use process::Lifetime;
pub use readiness::is_ready;
pub use wait::{WAIT, eventually};

/// The control plane shared by every test of one test binary, started on first use.
///
/// Blocks until it is ready (building the binaries first if this machine has none: ~10 min
/// once). Its processes die with the test binary (parent-death signal), so none outlive a
/// test run; its run directory is swept by the next start. Tests isolate themselves with
/// [`unique_name`]s.
///
/// # Panics
/// If the control plane cannot be built or started; the message carries the failing
/// component's log tail.
pub fn shared() -> &'static ControlPlane {
    static SHARED: OnceLock<ControlPlane> = OnceLock::new();
    SHARED.get_or_init(|| {
        ControlPlane::start()
            .unwrap_or_else(|e| panic!("the local control plane did not start: {e}"))
    })
}

/// A name unique within this machine and run, usable as a namespace or object name
/// (DNS-1123 label: lower case, digits, `-`; at most 63 characters): `<prefix>-<pid>-<n>`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let prefix: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    format!("{prefix}-{}-{n}", std::process::id())
}

#[cfg(test)]
mod tests {
    #[test]
    fn unique_names_are_dns_labels_and_differ() {
        let a = super::unique_name("My_Test");
        let b = super::unique_name("My_Test");
        assert_ne!(a, b);
        assert!(a.len() <= 63);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{a}"
        );
        assert!(a.starts_with("my-test-"));
    }
}
