//! The admin kubeconfig of a local control plane, written as YAML (serde-saphyr) from kube's
//! own `Kubeconfig` type so kubectl and kube-rs read the same file.

use std::fs;
use std::path::Path;

use base64::Engine;
use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};

use crate::error::{Error, Result};
use crate::pki::{ADMIN_USER, Pki};

/// The cluster and context name in the kubeconfig.
pub const CONTEXT: &str = "idem-local";

/// A kubeconfig for `server` as the admin user, with every certificate embedded.
///
/// # Errors
/// [`Error::Io`] when a PEM file cannot be read.
pub fn admin(server: &str, pki: &Pki) -> Result<Kubeconfig> {
    let b64 = |path: &Path| -> Result<String> {
        let bytes = fs::read(path).map_err(Error::io(format!("reading {}", path.display())))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    Ok(Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        clusters: vec![NamedCluster {
            name: CONTEXT.into(),
            cluster: Some(Cluster {
                server: Some(server.into()),
                certificate_authority_data: Some(b64(&pki.ca_cert)?),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: ADMIN_USER.into(),
            auth_info: Some(AuthInfo {
                client_certificate_data: Some(b64(&pki.admin_cert)?),
                client_key_data: Some(b64(&pki.admin_key)?.into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: CONTEXT.into(),
            context: Some(Context {
                cluster: CONTEXT.into(),
                user: Some(ADMIN_USER.into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(CONTEXT.into()),
        ..Default::default()
    })
}

/// Writes `config` as YAML to `path`, readable by its owner only (it holds a private key).
///
/// # Errors
/// [`Error::Kubeconfig`] when it cannot be serialised, [`Error::Io`] when it cannot be written.
pub fn write(config: &Kubeconfig, path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let yaml = serde_saphyr::to_string(config).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    fs::write(path, yaml).map_err(Error::io(format!("writing {}", path.display())))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .map_err(Error::io(format!("restricting {}", path.display())))
}
