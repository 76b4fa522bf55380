//! Small conveniences every integration test needs on a running cluster: install a CRD and
//! wait until it is Established, create a fresh namespace.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};

use crate::error::{Error, Result};

/// Field manager of the harness's own writes.
pub const FIELD_MANAGER: &str = "idem-tests";
/// How long a CRD may take to become Established (seen: well under a second).
pub const CRD_TIMEOUT: Duration = Duration::from_secs(60);

/// Installs `crd` with server-side apply (idempotent: a second call changes nothing) and waits
/// until its `Established` condition is true.
///
/// # Errors
/// [`Error::Kube`] when the apply or the watch fails; [`Error::Kubeconfig`] (with the CRD's
/// name) when it is not Established within [`CRD_TIMEOUT`].
pub async fn install_crd(client: &kube::Client, crd: &CustomResourceDefinition) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(crd),
    )
    .await?;
    match tokio::time::timeout(
        CRD_TIMEOUT,
        await_condition(api, &name, conditions::is_crd_established()),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Error::Kubeconfig(format!("watching CRD {name}: {e}"))),
        Err(_) => Err(Error::Kubeconfig(format!(
            "CRD {name} not Established after {} s",
            CRD_TIMEOUT.as_secs()
        ))),
    }
}

/// Creates a namespace named [`crate::unique_name`]`(prefix)` and returns its name.
///
/// # Errors
/// [`Error::Kube`] when the create fails.
pub async fn create_namespace(client: &kube::Client, prefix: &str) -> Result<String> {
    let name = crate::unique_name(prefix);
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(name)
}
