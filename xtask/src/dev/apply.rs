//! Reading manifests (multi-document YAML, serde-saphyr) and applying them with server-side
//! apply under the field manager [`FIELD_MANAGER`].

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, ApiCapabilities, ApiResource, Scope};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, ResourceExt};

/// The field manager of every server-side apply `cargo xtask dev` makes (distinct from the
/// operator's own `idem-operator`, so the two never fight over a field).
pub const FIELD_MANAGER: &str = "idem-dev";

/// How long a CRD gets to become `Established` after it is applied.
const CRD_TIMEOUT: Duration = Duration::from_secs(60);

/// One manifest read from a file.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// The file it came from (for messages).
    pub file: PathBuf,
    /// The object, with `apiVersion` and `kind`.
    pub object: DynamicObject,
}

impl Manifest {
    /// The object's kind (`Tenant`, `Namespace`, …).
    pub fn kind(&self) -> &str {
        self.object.types.as_ref().map_or("", |t| t.kind.as_str())
    }

    /// `Kind namespace/name` or `Kind name`, for messages.
    pub fn describe(&self) -> String {
        match self.object.namespace() {
            Some(ns) => format!("{} {ns}/{}", self.kind(), self.object.name_any()),
            None => format!("{} {}", self.kind(), self.object.name_any()),
        }
    }
}

/// Reads every object of every `*.yaml` / `*.yml` file in `dir`, files in name order and
/// documents in file order, then those of its subdirectories (in name order); empty documents
/// (a comment-only header) are skipped.
///
/// # Errors
/// When the directory or a file cannot be read, a document is not valid YAML, or an object
/// lacks `apiVersion`, `kind` or `metadata.name`; the message names the file.
pub fn read_dir(dir: &Path) -> anyhow::Result<Vec<Manifest>> {
    let entries: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    let mut files: Vec<PathBuf> = entries
        .iter()
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .cloned()
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        out.extend(read_file(&file)?);
    }
    // Then the subdirectories (`examples/apps/`: the second step of `kubectl apply`).
    let mut dirs: Vec<&PathBuf> = entries.iter().filter(|p| p.is_dir()).collect();
    dirs.sort();
    for sub in dirs {
        out.extend(read_dir(sub)?);
    }
    Ok(out)
}

/// Reads every object of one multi-document YAML file.
///
/// # Errors
/// As [`read_dir`].
pub fn read_file(file: &Path) -> anyhow::Result<Vec<Manifest>> {
    let text = fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)
        .with_context(|| format!("{} is not valid YAML", file.display()))?;
    let mut out = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        if doc.is_null() {
            continue;
        }
        let object: DynamicObject = serde_json::from_value(doc).with_context(|| {
            format!(
                "{} document {}: not a Kubernetes object",
                file.display(),
                i + 1
            )
        })?;
        if object.types.is_none() || object.metadata.name.is_none() {
            bail!(
                "{} document {}: an object needs apiVersion, kind and metadata.name",
                file.display(),
                i + 1
            );
        }
        out.push(Manifest {
            file: file.to_path_buf(),
            object,
        });
    }
    Ok(out)
}

/// Applies objects of any kind, resolving each kind through API discovery once.
pub struct Applier {
    client: Client,
    kinds: HashMap<GroupVersionKind, (ApiResource, ApiCapabilities)>,
}

impl Applier {
    /// An applier that talks to `client`'s cluster.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            kinds: HashMap::new(),
        }
    }

    /// Server-side applies `m` (forcing ownership of conflicting fields, as `kubectl apply
    /// --server-side --force-conflicts` does); a namespaced object without a namespace goes to
    /// `default`.
    ///
    /// # Errors
    /// When the kind is unknown to the cluster or the API server rejects the object; the
    /// message names the object and its file.
    pub async fn apply(&mut self, m: &Manifest) -> anyhow::Result<()> {
        let types = m.object.types.as_ref().context("no apiVersion/kind")?;
        let gvk = GroupVersionKind::try_from(types)
            .with_context(|| format!("{}: bad apiVersion", m.file.display()))?;
        if !self.kinds.contains_key(&gvk) {
            let found = discovery::pinned_kind(&self.client, &gvk)
                .await
                .with_context(|| {
                    format!(
                        "{} ({}): the cluster does not serve {}/{}",
                        m.describe(),
                        m.file.display(),
                        types.api_version,
                        types.kind
                    )
                })?;
            self.kinds.insert(gvk.clone(), found);
        }
        let (ar, caps) = &self.kinds[&gvk];
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = m.object.namespace().unwrap_or_else(|| "default".into());
                Api::namespaced_with(self.client.clone(), &ns, ar)
            }
            Scope::Cluster => Api::all_with(self.client.clone(), ar),
        };
        api.patch(
            &m.object.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&m.object),
        )
        .await
        .with_context(|| format!("applying {} from {}", m.describe(), m.file.display()))?;
        Ok(())
    }
}

/// Server-side applies idem's CRDs (from the Rust types, so they are never stale) and waits
/// until the API server reports each `Established` (serving the new kind).
///
/// # Errors
/// When an apply fails or a CRD is not Established within a minute.
pub async fn install_crds(client: &Client) -> anyhow::Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for crd in idem_operator::resources::crds() {
        let name = crd.name_any();
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("applying CRD {name}"))?;
        names.push(name);
    }
    for name in &names {
        let established = await_condition(api.clone(), name, conditions::is_crd_established());
        tokio::time::timeout(CRD_TIMEOUT, established)
            .await
            .map_err(|_| anyhow::anyhow!("CRD {name} was not Established within {CRD_TIMEOUT:?}"))?
            .with_context(|| format!("watching CRD {name}"))?;
    }
    Ok(names)
}

/// Waits until namespace `name` exists and is `Active` (the operator creates tenant
/// namespaces), polling every 250 ms.
///
/// # Errors
/// When it does not appear within `timeout`, or the API server cannot be reached.
pub async fn wait_for_namespace(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let ns = api
            .get_opt(name)
            .await
            .with_context(|| format!("reading namespace {name}"))?;
        let active = ns
            .and_then(|n| n.status)
            .and_then(|s| s.phase)
            .is_some_and(|p| p == "Active");
        if active {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "namespace {name} did not appear within {}s (does a Tenant in examples/ \
                 declare it? is the operator running? see its log)",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_multi_document_files_and_skips_empty_documents() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("b.yaml"),
            "# header\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: x}\ndata: {k: v}\n",
        )
        .unwrap();
        fs::write(
            dir.path().join("a.yml"),
            "apiVersion: tenancy.idem.dev/v1alpha1\nkind: Tenant\nmetadata: {name: t}\n",
        )
        .unwrap();
        fs::write(dir.path().join("notes.txt"), "not yaml: [").unwrap();
        let got: Vec<String> = read_dir(dir.path())
            .unwrap()
            .iter()
            .map(Manifest::describe)
            .collect();
        assert_eq!(got, ["Tenant t", "Namespace x", "ConfigMap x/c"]);
    }

    #[test]
    fn an_object_without_a_name_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.yaml");
        fs::write(&file, "apiVersion: v1\nkind: Namespace\nmetadata: {}\n").unwrap();
        let err = format!("{:#}", read_file(&file).unwrap_err());
        assert!(err.contains("bad.yaml document 1"), "{err}");
        assert!(err.contains("metadata.name"), "{err}");
    }

    #[test]
    fn invalid_yaml_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("broken.yaml");
        fs::write(&file, "kind: [unclosed\n").unwrap();
        let err = format!("{:#}", read_file(&file).unwrap_err());
        assert!(err.contains("broken.yaml is not valid YAML"), "{err}");
    }

    #[test]
    fn the_examples_and_operator_manifests_parse() {
        let root = crate::generated::repo_root();
        let examples = read_dir(&root.join("examples")).unwrap();
        assert!(examples.iter().filter(|m| m.kind() == "Tenant").count() >= 3);
        assert!(examples.iter().any(|m| m.kind() == "TenantApp"));
        let kinds: Vec<String> = read_dir(&root.join(crate::manifests::DIR))
            .unwrap()
            .iter()
            .map(|m| m.kind().to_string())
            .collect();
        for kind in [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
        ] {
            assert!(kinds.iter().any(|k| k == kind), "{kind} missing: {kinds:?}");
        }
    }
}
