//! A fresh PKI for one control plane, generated in Rust with rcgen: CA, API server serving
//! certificate, admin client certificate and the service-account signing key.

use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::error::{Error, Result};

/// The PEM files of one control plane's PKI, all in one directory.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA certificate: signs the serving and client certificates and is the client CA.
    pub ca_cert: PathBuf,
    /// The CA's private key (the controller-manager signs CSRs with it).
    pub ca_key: PathBuf,
    /// The API server's serving certificate, valid for `127.0.0.1`, `localhost` and the first
    /// address of the service CIDR.
    pub serving_cert: PathBuf,
    /// The serving certificate's key.
    pub serving_key: PathBuf,
    /// Client certificate of the admin user `idem-admin` in group `system:masters`.
    pub admin_cert: PathBuf,
    /// The admin client certificate's key.
    pub admin_key: PathBuf,
    /// Public key that verifies service-account tokens.
    pub sa_pub: PathBuf,
    /// Private key that signs service-account tokens.
    pub sa_key: PathBuf,
}

/// The admin user's name in the client certificate's CN.
pub const ADMIN_USER: &str = "idem-admin";

impl Pki {
    /// Generates a new PKI into `dir` (created if needed).
    ///
    /// `service_ip` is the first address of the service CIDR (the `kubernetes` Service's
    /// ClusterIP), which the serving certificate must also cover.
    ///
    /// # Errors
    /// [`Error::Pki`] if rcgen fails, [`Error::Io`] if a file cannot be written.
    pub fn generate(dir: &Path, service_ip: Ipv4Addr) -> Result<Self> {
        fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;

        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "idem-local-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

        let mut serving = CertificateParams::new(vec!["localhost".to_string()])?;
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        for ip in [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(service_ip)] {
            serving
                .subject_alt_names
                .push(rcgen::SanType::IpAddress(ip));
        }
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate()?;
        let serving_cert = serving.signed_by(&serving_key, &ca)?;

        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin
            .distinguished_name
            .push(DnType::CommonName, ADMIN_USER);
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_key = KeyPair::generate()?;
        let admin_cert = admin.signed_by(&admin_key, &ca)?;

        let sa = KeyPair::generate()?;

        let pki = Pki {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            sa_pub: dir.join("sa.pub"),
            sa_key: dir.join("sa.key"),
        };
        let files = [
            (&pki.ca_cert, ca.pem()),
            (&pki.ca_key, ca.key().serialize_pem()),
            (&pki.serving_cert, serving_cert.pem()),
            (&pki.serving_key, serving_key.serialize_pem()),
            (&pki.admin_cert, admin_cert.pem()),
            (&pki.admin_key, admin_key.serialize_pem()),
            (&pki.sa_pub, sa.public_key_pem()),
            (&pki.sa_key, sa.serialize_pem()),
        ];
        for (path, pem) in files {
            fs::write(path, pem).map_err(Error::io(format!("writing {}", path.display())))?;
        }
        Ok(pki)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_file_as_pem() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::generate(dir.path(), Ipv4Addr::new(10, 0, 0, 1)).unwrap();
        for (path, tag) in [
            (&pki.ca_cert, "CERTIFICATE"),
            (&pki.serving_cert, "CERTIFICATE"),
            (&pki.admin_cert, "CERTIFICATE"),
            (&pki.ca_key, "PRIVATE KEY"),
            (&pki.sa_key, "PRIVATE KEY"),
            (&pki.sa_pub, "PUBLIC KEY"),
        ] {
            let text = fs::read_to_string(path).unwrap();
            assert!(
                text.starts_with(&format!("-----BEGIN {tag}-----")),
                "{} starts with {:?}",
                path.display(),
                text.chars().take(30).collect::<String>()
            );
        }
    }
}
