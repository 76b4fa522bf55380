//! `cargo xtask crds [--check]`: `deploy/crds/*.yaml` from the Rust types of idem-operator.

use std::path::Path;

use kube::ResourceExt;

use crate::generated::{self, File};

/// The directory the CRDs go to, relative to the repository root.
pub const DIR: &str = "deploy/crds";

/// One file per CRD, named after it (`tenants.tenancy.idem.dev.yaml`).
///
/// # Errors
/// When a spec or status type has no structural schema: the error names the kind, the field,
/// its type and what to write instead (see `idem_runtime::schema`).
pub fn files() -> anyhow::Result<Vec<File>> {
    idem_operator::resources::try_crds()?
        .iter()
        .map(|crd| generated::yaml_file(&format!("{DIR}/{}.yaml", crd.name_any()), "crds", &[crd]))
        .collect()
}

/// Writes the CRDs, or checks them.
pub fn run(root: &Path, check: bool) -> anyhow::Result<()> {
    generated::write_or_check(root, DIR, &files()?, check, "crds")
}
