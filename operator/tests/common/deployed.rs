//! The operator as deployed: the generated manifests applied to the shared control plane, a
//! kubeconfig that acts as its ServiceAccount, and `kubectl` as an admin or anyone else.

use std::path::{Path, PathBuf};
use std::process::Output;

use idem_tests::shared;

use super::install_crds;

/// The operator's ServiceAccount as the API server names it.
pub const OPERATOR: &str = "system:serviceaccount:idem-system:idem-operator";

/// Runs `kubectl` with `args` against the shared control plane as its admin (`--as` in `args`
/// acts as someone else).
///
/// # Panics
/// When kubectl cannot be started.
pub fn kubectl(args: &[&str]) -> Output {
    shared()
        .kubectl()
        .args(args)
        .output()
        .expect("running kubectl")
}

/// What a command printed, stdout then stderr.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Applies the generated `deploy/operator/<file>.yaml` as the admin.
///
/// # Panics
/// When a manifest is refused.
pub fn apply_manifest(file: &str) {
    apply(&manifests().join(format!("{file}.yaml")));
}

/// The directory of the generated manifests.
fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/operator")
}

/// Applies the manifest file at `path` as the admin (server-side).
fn apply(path: &Path) {
    let out = kubectl(&["apply", "--server-side", "-f", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "applying {}: {}",
        path.display(),
        text(&out)
    );
}

/// Installs the CRDs and applies every generated manifest of `deploy/operator/` but the
/// Deployment (there is no image to run here).
///
/// # Panics
/// When a manifest is refused.
pub async fn install() {
    install_crds(&shared().client()).await;
    let mut files: Vec<_> = std::fs::read_dir(manifests())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.to_string_lossy().contains("deployment"))
        .collect();
    files.sort();
    for file in files {
        apply(&file);
    }
}

/// A kubeconfig of the shared control plane that acts as the operator's ServiceAccount: the
/// admin impersonates it, so the API server authorises and admits every request as the account
/// (its ClusterRole, Role and the shipped admission policies), as in the Deployment.
///
/// # Panics
/// When the shared kubeconfig cannot be read or the copy written.
pub fn operator_kubeconfig() -> PathBuf {
    let mut config = kube::config::Kubeconfig::read_from(shared().kubeconfig_path()).unwrap();
    for user in &mut config.auth_infos {
        if let Some(auth) = user.auth_info.as_mut() {
            auth.impersonate = Some(OPERATOR.into());
        }
    }
    let path = std::env::temp_dir().join(format!("idem-as-operator-{}.yaml", std::process::id()));
    idem_tests::kubeconfig::write(&config, &path).unwrap();
    path
}

/// The manifests installed ([`install`]) and one in-process operator running as its
/// ServiceAccount ([`operator_kubeconfig`]), once per test binary.
pub async fn operator_as_its_account() {
    static OPERATOR: tokio::sync::OnceCell<super::Operator> = tokio::sync::OnceCell::const_new();
    OPERATOR
        .get_or_init(|| async {
            install().await;
            let kubeconfig = operator_kubeconfig();
            let mut operator = super::Operator::spawn_configured(
                std::time::Duration::from_secs(600),
                None,
                move |o| {
                    o.kubeconfig = Some(kubeconfig);
                },
            );
            operator.wait_ready().await;
            operator
        })
        .await;
}
