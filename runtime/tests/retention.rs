//! The CRD-deletion retention protocol ([`idem_runtime::reconciler::retention`]) against the
//! real control plane, with a kind of this test's own: a `Keepsake` owns a ConfigMap of its
//! name (a desired child, with idem's labels), and a user's ConfigMap refers to it with a plain
//! ownerReference. Its finalizer follows the protocol.
//!
//! - Deleting a Keepsake while the CRD is in place is an ordinary deletion: the cleanup keeps
//!   nothing and the garbage collector deletes the child.
//! - Deleting the CRD: the cleanup finds it being deleted, releases both ConfigMaps (no
//!   ownerReference to the Keepsake, no `owner-uid` label) before the finalizer goes, and
//!   publishes the Event `Retained`; once the CRD is gone both ConfigMaps are still there.
//!
//! In a test binary of its own: the CRD is deleted.

use std::time::Duration;

use idem_runtime::IdempotentResource;
use idem_runtime::apply::{DesiredChildren, Labels};
use idem_runtime::reconciler::retention::{crd_retention, release_referring, retained};
use idem_runtime::reconciler::{ChildKinds, Cleanup, Driver, Pass, ReconcileError, Reconciler};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::core::ApiResource;
use kube::{Api, Client, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;

const WAIT: Duration = Duration::from_secs(90);
const FINALIZER: &str = "retention.test.idem.dev/cleanup";

/// Something whose ConfigMap must outlive an uninstall.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "retention.test.idem.dev",
    version = "v1",
    kind = "Keepsake",
    namespaced,
    status = "KeepsakeStatus"
)]
#[idempotent(tenant = namespace, prune = owner_references)]
pub struct KeepsakeSpec {
    /// The ConfigMap's one value.
    pub note: String,
}

/// The Keepsake's status.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeepsakeStatus {
    /// The generation the conditions describe.
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling, Stalled.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The children the reconciles created (what the prune may delete).
    #[serde(default)]
    pub created_children: Vec<idem_runtime::apply::CreatedChild>,
}

/// The Keepsake reconciler: one ConfigMap; the retention protocol on deletion.
struct Keepsakes;

impl Reconciler for Keepsakes {
    type Resource = Keepsake;
    const FINALIZER: Option<&'static str> = Some(FINALIZER);

    fn children() -> ChildKinds<Keepsake> {
        ChildKinds::new().owns::<ConfigMap>()
    }

    fn desired(&self, k: &Keepsake) -> Result<DesiredChildren, ReconcileError> {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": k.name_any()}, "data": {"note": k.spec.note},
        }))
        .map_err(|e| ReconcileError::terminal("InvalidSpec", e.to_string()))?;
        let mut children = DesiredChildren::new();
        children.add(&cm)?;
        Ok(children)
    }

    async fn cleanup(
        &self,
        k: &Keepsake,
        pass: &mut Pass<Keepsake>,
    ) -> Result<Cleanup<Keepsake>, ReconcileError> {
        let Some(why) = crd_retention::<Keepsake>(pass.client()).await? else {
            return Ok(Cleanup::Done);
        };
        let config_maps = ApiResource::erase::<ConfigMap>(&());
        let uid = k.uid().unwrap_or_default();
        let ns = k.namespace();
        let kept =
            release_referring::<Keepsake>(pass.client(), &config_maps, ns.as_deref(), &uid).await?;
        let names: Vec<String> = kept.iter().map(ToString::to_string).collect();
        pass.publish(retained(format!(
            "Keepsake deleted; {why}: kept {}",
            names.join(", ")
        )))
        .await;
        Ok(Cleanup::Done)
    }
}

async fn wait<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {WAIT:?} for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates Keepsake `name` in `ns` and reconciles it once (the finalizer is added, the
/// ConfigMap created); returns it as stored.
async fn keepsake(client: &Client, driver: &Driver<Keepsakes>, ns: &str, name: &str) -> Keepsake {
    let api: Api<Keepsake> = Api::namespaced(client.clone(), ns);
    let spec = KeepsakeSpec {
        note: "precious".into(),
    };
    let created = api
        .create(&PostParams::default(), &Keepsake::new(name, spec))
        .await
        .expect("create the Keepsake");
    driver
        .reconcile_once(client.clone(), Arc::new(created))
        .await
        .expect("reconcile");
    let stored = api.get(name).await.unwrap();
    assert_eq!(stored.finalizers(), [FINALIZER]);
    stored
}

/// Deletes `k` and runs its cleanup once it is being deleted.
async fn delete(client: &Client, driver: &Driver<Keepsakes>, k: &Keepsake) {
    let api: Api<Keepsake> = Api::namespaced(client.clone(), &k.namespace().unwrap());
    let name = k.name_any();
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    let deleting = api.get(&name).await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    driver
        .reconcile_once(client.clone(), Arc::new(deleting))
        .await
        .expect("the cleanup");
    wait("the Keepsake gone", || async {
        api.get_opt(&name).await.unwrap().is_none()
    })
    .await;
}

fn refers_to(meta: &ObjectMeta, uid: &str) -> bool {
    let labelled = meta.labels.as_ref().is_some_and(|l| {
        l.get(Labels::of::<Keepsake>().owner_uid())
            .is_some_and(|v| v == uid)
    });
    labelled || meta.owner_references.iter().flatten().any(|r| r.uid == uid)
}

#[tokio::test]
async fn deleting_the_crd_releases_the_owners_children_and_an_ordinary_deletion_does_not() {
    let client = idem_tests::shared().client();
    idem_tests::install_crd(&client, &Keepsake::crd())
        .await
        .expect("install the CRD");
    let ns = idem_tests::create_namespace(&client, "retention")
        .await
        .unwrap();
    let driver = Driver::new(client.clone(), Keepsakes);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);

    // An ordinary deletion: the CRD is in place, the garbage collector deletes the child.
    let plain = keepsake(&client, &driver, &ns, "plain").await;
    assert!(refers_to(
        &config_maps.get("plain").await.unwrap().metadata,
        &plain.uid().unwrap()
    ));
    delete(&client, &driver, &plain).await;
    wait(
        "the garbage collector deletes the ordinary child",
        || async { config_maps.get_opt("plain").await.unwrap().is_none() },
    )
    .await;

    // The CRD is deleted: its child and a user's object that refers to it are released.
    let kept = keepsake(&client, &driver, &ns, "kept").await;
    let uid = kept.uid().unwrap();
    let user: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "users-notes", "ownerReferences": [{
            "apiVersion": "retention.test.idem.dev/v1", "kind": "Keepsake", "name": "kept",
            "uid": uid,
        }]},
        "data": {"k": "precious"},
    }))
    .unwrap();
    config_maps
        .create(&PostParams::default(), &user)
        .await
        .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(Keepsake::crd_name(), &DeleteParams::default())
        .await
        .unwrap();
    let keepsakes: Api<Keepsake> = Api::namespaced(client.clone(), &ns);
    wait("the Keepsake being deleted with its CRD", || async {
        keepsakes
            .get_opt("kept")
            .await
            .ok()
            .flatten()
            .is_some_and(|k| k.metadata.deletion_timestamp.is_some())
    })
    .await;
    let deleting = keepsakes.get("kept").await.unwrap();
    driver
        .reconcile_once(client.clone(), Arc::new(deleting))
        .await
        .expect("the cleanup");
    for name in ["kept", "users-notes"] {
        let cm = config_maps.get(name).await.unwrap();
        assert!(
            !refers_to(&cm.metadata, &uid),
            "ConfigMap {name} still names the Keepsake after its cleanup: ownerReferences {:?}, labels {:?}",
            cm.metadata.owner_references,
            cm.metadata.labels
        );
    }
    wait("the CRD gone", || async {
        crds.get_opt(Keepsake::crd_name())
            .await
            .is_ok_and(|c| c.is_none())
    })
    .await;
    for name in ["kept", "users-notes"] {
        let cm = config_maps.get(name).await.unwrap();
        assert_eq!(
            cm.data
                .unwrap_or_default()
                .values()
                .next()
                .map(String::as_str),
            Some("precious"),
            "ConfigMap {name}"
        );
    }
    let events = Api::<Event>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    let note = events
        .items
        .into_iter()
        .find(|e| {
            e.reason.as_deref() == Some("Retained")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("kept")
        })
        .and_then(|e| e.note)
        .expect("an Event Retained on the Keepsake");
    assert!(
        note.contains("retention.test.idem.dev is being deleted"),
        "{note}"
    );
    assert!(note.contains("users-notes"), "{note}");
    assert!(
        !events_mention_plain(&client, &ns).await,
        "no Retained for the ordinary deletion"
    );
}

/// Whether an Event `Retained` names the Keepsake deleted while its CRD was in place.
async fn events_mention_plain(client: &Client, ns: &str) -> bool {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|e| {
            e.reason.as_deref() == Some("Retained")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("plain")
        })
}
