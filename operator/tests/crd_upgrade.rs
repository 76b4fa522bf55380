//! Upgrading the TenantApp CRD to one that refuses names an older CRD admitted (`a.b`): new
//! apps with such a name are refused, but an app that exists already can still be changed and
//! deleted (its finalizer removed, its status written) — the name rule is checked when an app
//! is created, not at every update. In a test binary of its own: the CRD is replaced.

mod common;

use common::{TIMEOUT, apps, eventually, install_crds, why};
use idem_operator::resources::TenantApp;
use idem_tests::shared;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const HOLD: &str = "test.idem.dev/hold";

#[tokio::test]
async fn an_app_admitted_by_an_older_crd_can_be_deleted_after_the_upgrade() {
    let client = shared().client();
    let ns = idem_tests::create_namespace(&client, "crdup")
        .await
        .expect("namespace");
    // The older CRD: the same, without the root rule on the name.
    let mut older = serde_json::to_value(TenantApp::crd()).unwrap();
    let schema = older
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema")
        .and_then(serde_json::Value::as_object_mut)
        .expect("a schema");
    assert!(
        schema.remove("x-kubernetes-validations").is_some(),
        "the CRD has a root rule on the name"
    );
    let older: CustomResourceDefinition = serde_json::from_value(older).unwrap();
    idem_tests::install_crd(&client, &older)
        .await
        .expect("install the older CRD");
    let api: Api<TenantApp> = Api::namespaced(client.clone(), &ns);
    let mut old_app = TenantApp::new("a.b", apps::spec(1, "x = 1"));
    old_app.metadata.finalizers = Some(vec![HOLD.into()]);
    eventually("the older CRD admits a.b", TIMEOUT, || async {
        api.create(&PostParams::default(), &old_app)
            .await
            .map(|_| ())
            .map_err(why)
    })
    .await;

    install_crds(&client).await;
    let refused = "c.d";
    eventually(
        "the upgraded CRD refuses a new app c.d",
        TIMEOUT,
        || async {
            match api
                .create(
                    &PostParams::default(),
                    &TenantApp::new(refused, apps::spec(1, "x = 1")),
                )
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("DNS-1035") => {
                    Ok(())
                }
                Ok(_) => {
                    let _ = api.delete(refused, &DeleteParams::default()).await;
                    Err("admitted".to_owned())
                }
                Err(e) => Err(why(e)),
            }
        },
    )
    .await;

    // The app of the older CRD: a change, a status write, and its deletion all go through.
    api.patch(
        "a.b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"note": "after the upgrade"}}})),
    )
    .await
    .expect("an update of an app admitted before the upgrade");
    api.patch_status(
        "a.b",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"availableReplicas": 0}})),
    )
    .await
    .expect("a status write of an app admitted before the upgrade");
    api.delete("a.b", &DeleteParams::default())
        .await
        .expect("delete");
    api.patch(
        "a.b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("removing the finalizer of an app admitted before the upgrade");
    eventually("a.b gone", TIMEOUT, || async {
        match api.get_opt("a.b").await.map_err(why)? {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await;
}
