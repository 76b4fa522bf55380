//! Applying children: zero writes when converged, restoring rivals' changes to owned fields,
//! leaving others' fields and unowned objects alone, pruning only what we own.

use std::collections::BTreeMap;
use std::time::Duration;

use idem_runtime::apply::{ChildOutcome, Labels};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn second_apply_makes_zero_writes() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.write().await;
    let ns = namespace(&client, "zero-writes").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let kinds = [
        ("", "configmaps"),
        ("apps", "deployments"),
        ("", "resourcequotas"),
        ("", "services"),
        ("test.idem.dev", "widgets"),
    ];
    let mut initial = Vec::new();
    for (g, r) in kinds {
        initial.push(counts(g, r).await);
    }
    let (report, _) = reconcile(&client, &w).await.expect("first reconcile");
    assert!(
        report
            .children
            .iter()
            .all(|(_, o)| *o == ChildOutcome::Created),
        "{report:?}"
    );
    // The counter sees the first reconcile's writes (so a zero below means zero), and a create
    // is one write (its Update entry is moved to an Apply entry only when an apply is needed).
    let mut child_writes = 0;
    for ((g, r), i) in kinds.iter().zip(&initial) {
        let c = counts(g, r).await;
        assert!(
            c.writes + c.status_writes > i.writes + i.status_writes,
            "no write seen on {r}"
        );
        if *r != "widgets" {
            child_writes += c.writes - i.writes;
        }
    }
    assert_eq!(
        child_writes,
        report.children.len() as u64,
        "one write per created child"
    );
    let config = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("w-config")
        .await
        .expect("config");
    let ours: Vec<_> = config
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| e.manager.as_deref() == Some(Widget::FIELD_MANAGER))
        .map(|e| e.operation.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        ours,
        ["Update"],
        "the create's own record, not moved by a second write"
    );

    // Let the deployment controller settle: it writes the revision annotation on the
    // Deployment itself once.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    for _ in 0..100 {
        let d = deployments.get("w").await.expect("get deployment");
        let annotated = d
            .metadata
            .annotations
            .is_some_and(|a| a.contains_key("deployment.kubernetes.io/revision"));
        if annotated {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The server canonicalised the quota: "1000m" is stored as "1", "1024Mi" as "1Gi".
    let quota = Api::<ResourceQuota>::namespaced(client.clone(), &ns)
        .get("w-quota")
        .await
        .expect("quota");
    let hard = quota.spec.and_then(|s| s.hard).expect("hard");
    assert_eq!(hard["cpu"].0, "1", "server canonicalises 1000m");
    assert_eq!(hard["memory"].0, "1Gi", "server canonicalises 1024Mi");

    let mut before = Vec::new();
    for (g, r) in kinds {
        before.push(counts(g, r).await);
    }
    let w = get_widget(&client, &ns, "w").await;
    let (report, status) = reconcile(&client, &w).await.expect("second reconcile");
    assert!(
        report
            .children
            .iter()
            .all(|(_, o)| *o == ChildOutcome::Unchanged),
        "{report:?}"
    );
    assert!(report.pruned.is_empty());
    assert!(
        matches!(status, idem_runtime::status::StatusOutcome::Unchanged),
        "{status:?}"
    );
    for ((g, r), b) in kinds.iter().zip(before) {
        let a = counts(g, r).await;
        assert_eq!(
            a.writes - b.writes,
            0,
            "writes on {r} during the second reconcile"
        );
        if *r == "widgets" {
            assert_eq!(
                a.status_writes - b.status_writes,
                0,
                "status writes on widgets"
            );
        }
    }
}

#[tokio::test]
async fn rival_change_to_owned_field_is_restored_and_others_fields_kept() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "rival").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    reconcile(&client, &w).await.expect("first reconcile");

    // A rival field manager takes our data key and adds a key and a label of its own.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let rival = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "w-config", "labels": {"rival": "yes"}},
        "data": {"greeting": "tampered", "rival-key": "kept"}
    });
    cms.patch(
        "w-config",
        &PatchParams::apply("rival").force(),
        &Patch::Apply(&rival),
    )
    .await
    .expect("rival apply");

    let (report, _) = reconcile(&client, &w).await.expect("reconcile");
    let outcome = report
        .children
        .iter()
        .find(|(k, _)| &*k.name == "w-config")
        .map(|(_, o)| o.clone());
    assert_eq!(outcome, Some(ChildOutcome::Applied));
    let cm = cms.get("w-config").await.expect("get");
    let data = cm.data.expect("data");
    assert_eq!(data["greeting"], "hello", "owned field restored");
    assert_eq!(
        data["rival-key"], "kept",
        "field owned by another manager left alone"
    );
    assert_eq!(cm.metadata.labels.expect("labels")["rival"], "yes");

    // Converged again: the next reconcile writes nothing to it.
    let (report, _) = reconcile(&client, &w).await.expect("reconcile");
    assert!(
        report
            .children
            .iter()
            .all(|(_, o)| *o == ChildOutcome::Unchanged),
        "{report:?}"
    );
}

#[tokio::test]
async fn field_dropped_from_desired_is_removed_from_child() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "drop-field").await;
    let mut spec = widget_spec();
    spec.config.insert("extra".into(), "1".into());
    let w = create_widget(&client, &ns, "w", spec).await;
    reconcile(&client, &w)
        .await
        .expect("first reconcile (creates)");

    let api: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let patch = json!({"spec": {"config": {"extra": null}}});
    let w = api
        .patch("w", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("edit spec");
    reconcile(&client, &w).await.expect("reconcile");
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("w-config")
        .await
        .expect("get");
    let data: BTreeMap<_, _> = cm.data.expect("data");
    assert_eq!(data.get("extra"), None, "dropped key removed by the apply");
    assert_eq!(data["greeting"], "hello");
    assert!(
        cm.metadata
            .annotations
            .expect("annotations")
            .contains_key(Labels::of::<Widget>().fingerprint())
    );
}

#[tokio::test]
async fn unowned_child_is_not_modified_and_a_condition_says_why() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "unowned").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let foreign = ConfigMap {
        metadata: ObjectMeta {
            name: Some("w-config".into()),
            ..ObjectMeta::default()
        },
        data: Some([("greeting".to_string(), "theirs".to_string())].into()),
        ..ConfigMap::default()
    };
    let created = cms
        .create(&PostParams::default(), &foreign)
        .await
        .expect("create foreign");
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let (report, _) = reconcile(&client, &w)
        .await
        .expect("reconcile is not an error");

    let (key, why) = report.not_owned().next().expect("reported as not owned");
    assert_eq!(&*key.name, "w-config");
    assert!(why.contains("not controlled"), "{why}");
    let after = cms.get("w-config").await.expect("get");
    assert_eq!(
        after.metadata.resource_version, created.metadata.resource_version,
        "untouched"
    );
    assert_eq!(after.data.expect("data")["greeting"], "theirs");

    let w = get_widget(&client, &ns, "w").await;
    let stalled = condition(&w, "Stalled");
    assert_eq!(
        (stalled.status.as_str(), stalled.reason.as_str()),
        ("True", "ChildNotOwned")
    );
    assert!(stalled.message.contains("ConfigMap/") && stalled.message.contains("w-config"));
    assert_eq!(condition(&w, "Ready").status, "False");
    // The other children were still applied.
    assert!(
        Api::<Deployment>::namespaced(client.clone(), &ns)
            .get_opt("w")
            .await
            .expect("get")
            .is_some()
    );
}

#[tokio::test]
async fn prune_deletes_only_owned_children() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "prune").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    reconcile(&client, &w).await.expect("first reconcile");

    // An object carrying our labels but not our ownerReference must survive pruning.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let owner_uid = Labels::of::<Widget>().owner_uid();
    let mut impostor: Service = serde_json::from_value(json!({
        "metadata": {"name": "impostor", "labels": {
            owner_uid: w.metadata.uid.clone().expect("uid"),
            "app.kubernetes.io/managed-by": "idem-operator"}},
        "spec": {"ports": [{"port": 80}]}
    }))
    .expect("service json");
    impostor.metadata.namespace = Some(ns.clone());
    services
        .create(&PostParams::default(), &impostor)
        .await
        .expect("create impostor");

    let api: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let w = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"service": false}})),
        )
        .await
        .expect("edit spec");
    let (report, _) = reconcile(&client, &w).await.expect("reconcile");
    assert_eq!(report.pruned.len(), 1, "{report:?}");
    assert_eq!(&*report.pruned[0].name, "w");
    assert!(
        services.get_opt("impostor").await.expect("get").is_some(),
        "not ours: kept"
    );
    // Our Service is gone or going (deletion is asynchronous for objects with finalizers).
    let ours = services.get_opt("w").await.expect("get");
    assert!(ours.is_none_or(|s| s.metadata.deletion_timestamp.is_some()));
    // Pruning again is a no-op (NotFound or already deleting is success).
    let (report, _) = reconcile(&client, &w).await.expect("reconcile again");
    assert!(report.pruned.is_empty());
}

#[tokio::test]
async fn tenant_from_namespace_label_is_resolved_from_the_server() {
    use idem_runtime::resource::{TenantError, TenantRef};
    use k8s_openapi::api::core::v1::Namespace;
    let client = client();
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "tenant-label").await;
    let r = TenantRef::NamespaceLabel {
        namespace: ns.clone(),
        label: "tenancy.idem.dev/tenant",
    };
    let missing = r.clone().resolve(&client).await;
    assert!(
        matches!(missing, Err(TenantError::MissingLabel { .. })),
        "{missing:?}"
    );
    let label = json!({"metadata": {"labels": {"tenancy.idem.dev/tenant": "acme"}}});
    Api::<Namespace>::all(client.clone())
        .patch(&ns, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("label namespace");
    assert_eq!(r.resolve(&client).await.expect("resolved").as_str(), "acme");
}

#[tokio::test]
async fn terminating_child_is_repaired_in_place_and_reported_as_reconciling() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "terminating").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    reconcile(&client, &w).await.expect("first reconcile");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let desired = cms.get("w-config").await.expect("created").data;
    // Hold the child in deletion with a finalizer of someone else's, and drift it: still in
    // effect while it is held, so what drifted is put back (never recreated meanwhile).
    let hold = json!({"metadata": {"finalizers": ["example.com/hold"]}, "data": {"greeting": "x"}});
    cms.patch("w-config", &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .expect("hold");
    cms.delete("w-config", &Default::default())
        .await
        .expect("delete");
    let before = cms.get("w-config").await.expect("still there");
    assert!(before.metadata.deletion_timestamp.is_some());
    assert_ne!(before.data, desired, "drifted");

    let terminating = Some(ChildOutcome::Terminating {
        finalizers: vec!["example.com/hold".into()],
        unrepaired: None,
    });
    let outcome_of = |report: &idem_runtime::apply::ApplyReport| {
        report
            .children
            .iter()
            .find(|(k, _)| &*k.name == "w-config")
            .map(|(_, o)| o.clone())
    };
    let (report, _) = reconcile(&client, &w).await.expect("reconcile");
    assert_eq!(outcome_of(&report), terminating);
    let after = cms.get("w-config").await.expect("get");
    assert_eq!(after.data, desired, "repaired in place");
    assert_eq!(after.metadata.uid, before.metadata.uid, "not recreated");
    assert!(after.metadata.deletion_timestamp.is_some());
    // Repaired, it is left alone: the next pass writes nothing.
    let (report, _) = reconcile(&client, &w).await.expect("reconcile");
    assert_eq!(outcome_of(&report), terminating);
    assert_eq!(
        cms.get("w-config")
            .await
            .expect("get")
            .metadata
            .resource_version,
        after.metadata.resource_version,
        "untouched once repaired"
    );
    let w = get_widget(&client, &ns, "w").await;
    assert_eq!(condition(&w, "Reconciling").status, "True");
    assert_eq!(condition(&w, "Ready").reason, "ChildTerminating");

    // Release it: the next reconcile creates it again and is Ready.
    let release = json!({"metadata": {"finalizers": null}});
    cms.patch("w-config", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("release");
    let w = get_widget(&client, &ns, "w").await;
    let (report, _) = reconcile(&client, &w).await.expect("reconcile");
    let outcome = report
        .children
        .iter()
        .find(|(k, _)| &*k.name == "w-config")
        .map(|(_, o)| o);
    assert_eq!(outcome, Some(&ChildOutcome::Created));
    assert_eq!(
        condition(&get_widget(&client, &ns, "w").await, "Ready").status,
        "True"
    );
}

/// An administrator's policy that refuses the in-place repair of a held child (403, as a
/// webhook's denial is by default) leaves it terminating with the server's reason: the pass
/// goes on and the owner is Reconciling, not failed and retried with backoff.
#[tokio::test]
async fn a_terminating_childs_repair_refused_by_a_policy_leaves_it_terminating_with_the_reason() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "refused-repair").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    reconcile(&client, &w).await.expect("first reconcile");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let hold = json!({"metadata": {"finalizers": ["example.com/hold"]}, "data": {"greeting": "x"}});
    cms.patch("w-config", &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .expect("hold");
    cms.delete("w-config", &Default::default())
        .await
        .expect("delete");
    // A policy refusing any change of the ConfigMaps' data in this namespace, with 403.
    let policy = idem_tests::admission::RefusingPolicy::create(
        &client,
        &format!("refuse-data-{ns}"),
        ("", "configmaps"),
        &ns,
        ("object.data == oldObject.data", "the data is frozen"),
        || {
            let change = json!({"data": {"greeting": "y"}});
            let cms = cms.clone();
            async move {
                let dry_run = PatchParams::default().dry_run();
                cms.patch("w-config", &dry_run, &Patch::Merge(&change))
                    .await
            }
        },
    )
    .await;

    let (report, _) = reconcile(&client, &w)
        .await
        .expect("the refusal does not fail the pass");
    let outcome = report
        .children
        .iter()
        .find(|(k, _)| &*k.name == "w-config")
        .map(|(_, o)| o.clone());
    let Some(ChildOutcome::Terminating {
        finalizers,
        unrepaired: Some(why),
    }) = outcome
    else {
        panic!("terminating, with the refusal: {outcome:?}");
    };
    assert_eq!(finalizers, ["example.com/hold"]);
    assert!(
        why.contains("403") && why.contains("the data is frozen"),
        "{why}"
    );
    let w = get_widget(&client, &ns, "w").await;
    let ready = condition(&w, "Ready");
    assert_eq!(ready.reason, "ChildTerminating");
    assert!(
        ready.message.contains("the data is frozen"),
        "{}",
        ready.message
    );

    policy.remove().await;
    let release = json!({"metadata": {"finalizers": null}});
    cms.patch("w-config", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("release");
}

#[tokio::test]
async fn a_child_the_server_rejects_does_not_keep_its_siblings_from_being_applied() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "one-invalid").await;
    let mut spec = widget_spec();
    // A ConfigMap key with a space: the API server answers 422 Invalid. The ConfigMap is the
    // first child; the Deployment and the ResourceQuota after it must still be applied (in
    // the operator the same shape is an invalid RoleBinding before the isolation policy).
    spec.config = [("not a valid key".to_string(), "x".to_string())].into();
    let w = create_widget(&client, &ns, "w", spec).await;
    let err = reconcile(&client, &w)
        .await
        .expect_err("the invalid ConfigMap fails the reconcile");
    assert!(
        err.contains("ConfigMap") && err.contains("422"),
        "the error names the rejected child: {err}"
    );
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get_opt("w")
        .await
        .expect("get deployment");
    assert!(deployment.is_some(), "the Deployment after it was applied");
    let quota = Api::<ResourceQuota>::namespaced(client.clone(), &ns)
        .get_opt("w-quota")
        .await
        .expect("get quota");
    assert!(quota.is_some(), "the ResourceQuota after it was applied");
    let config = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get_opt("w-config")
        .await
        .expect("get configmap");
    assert!(config.is_none(), "the rejected ConfigMap was not created");
}

#[tokio::test]
async fn a_child_the_server_rejects_does_not_keep_another_kinds_undesired_child() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "prune-past-invalid").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    reconcile(&client, &w).await.expect("first reconcile");
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    assert!(services.get_opt("w").await.expect("get").is_some());
    let before = configs.get("w-config").await.expect("the ConfigMap");
    // The Service no longer desired, and the ConfigMap made invalid in the same change (in
    // the operator: a RoleBinding removed while a tenant owner makes another child fail).
    let api: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let w = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"service": false, "config": {"not a valid key": "x"}}})),
        )
        .await
        .expect("edit spec");
    let err = reconcile(&client, &w)
        .await
        .expect_err("the invalid ConfigMap fails the reconcile");
    assert!(err.contains("ConfigMap") && err.contains("422"), "{err}");
    pruned(&services, "w").await;
    // The failed child's own kind is left as it was: the ConfigMap is still there, unchanged.
    let after = configs.get("w-config").await.expect("the ConfigMap");
    assert_eq!(after.metadata.uid, before.metadata.uid);
    assert_eq!(after.data, before.data);
}

/// Waits (30 s at most) until `name` is gone or being deleted: pruned.
async fn pruned<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match api.get_opt(name).await.expect("get") {
            None => return,
            Some(o) if o.meta().deletion_timestamp.is_some() => return,
            Some(_) => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} was not pruned"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Applies ConfigMaps `cms` (name, data) as `w`'s children, pruning ConfigMaps.
async fn apply_config_maps(
    client: &kube::Client,
    w: &Widget,
    cms: &[(&str, &str)],
) -> Result<idem_runtime::apply::ApplyReport, String> {
    use idem_runtime::resource::IdempotentResource as _;
    let tenant = w.tenant().map_err(|e| e.to_string())?;
    let tenant = tenant.resolve(client).await.map_err(|e| e.to_string())?;
    let owner = idem_runtime::apply::Owner::new(w, Widget::FIELD_MANAGER, Some(tenant))
        .map_err(|e| e.to_string())?;
    let mut d = idem_runtime::apply::DesiredChildren::new();
    d.prune_kind::<ConfigMap>();
    for (name, key) in cms {
        d.add(&ConfigMap {
            metadata: ObjectMeta {
                name: Some((*name).to_owned()),
                ..ObjectMeta::default()
            },
            data: Some([((*key).to_owned(), "x".to_owned())].into()),
            ..ConfigMap::default()
        })
        .map_err(|e| e.to_string())?;
    }
    idem_runtime::apply::Applier::new(client.clone())
        .reconcile(&owner, &d)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_refused_update_does_not_hold_its_kinds_prune_and_a_refused_create_does() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "prune-same-kind").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    apply_config_maps(&client, &w, &[("a", "k"), ("b", "k"), ("c", "k")])
        .await
        .expect("first apply");
    // `a` exists and its update is refused (a key the server rejects): it replaces nothing,
    // so `b`, no longer desired, is pruned all the same (in the operator: `idem-owners`
    // padded until refused must not keep a removed `idem-rb-*` RoleBinding).
    let err = apply_config_maps(&client, &w, &[("a", "not a valid key"), ("c", "k")])
        .await
        .expect_err("a is refused");
    assert!(err.contains("422"), "{err}");
    pruned(&cms, "b").await;
    // `d` is new and its create is refused: it may be what replaces `c`, so `c` stays.
    let err = apply_config_maps(&client, &w, &[("a", "k"), ("d", "not a valid key")])
        .await
        .expect_err("d is refused");
    assert!(err.contains("422"), "{err}");
    assert!(cms.get_opt("d").await.expect("get").is_none());
    let c = cms.get_opt("c").await.expect("get").expect("c kept");
    assert!(
        c.metadata.deletion_timestamp.is_none(),
        "c is being deleted"
    );
    // Once `d` is made, `c` goes.
    apply_config_maps(&client, &w, &[("a", "k"), ("d", "k")])
        .await
        .expect("d made");
    pruned(&cms, "c").await;
}

#[tokio::test]
async fn an_undesired_child_held_by_a_finalizer_keeps_the_owner_reconciling_until_it_is_gone() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "held-prune").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    reconcile(&client, &w).await.expect("first reconcile");
    // Someone else's finalizer on the Service, then the Service no longer desired: deleted,
    // but still there (and in effect) while the finalizer holds it.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let hold = json!({"metadata": {"finalizers": ["example.com/hold"]}});
    services
        .patch("w", &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .expect("hold");
    let api: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let w = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"service": false}})),
        )
        .await
        .expect("edit spec");
    let held = vec![(
        idem_runtime::ObjectKey::namespaced("Service", &ns, "w"),
        vec!["example.com/hold".to_owned()],
    )];
    let (report, _) = reconcile(&client, &w).await.expect("reconcile");
    assert_eq!(report.pruned.len(), 1, "{report:?}");
    assert_eq!(report.pruning, held, "{report:?}");
    let stored = get_widget(&client, &ns, "w").await;
    assert_eq!(condition(&stored, "Ready").reason, "ChildTerminating");
    assert!(
        condition(&stored, "Ready")
            .message
            .contains("no longer desired"),
        "{:?}",
        condition(&stored, "Ready")
    );
    // Its deletion is under way: not deleted again, still reported.
    let (report, _) = reconcile(&client, &stored).await.expect("reconcile again");
    assert!(report.pruned.is_empty(), "{report:?}");
    assert_eq!(report.pruning, held);
    // Released and gone: Ready.
    services
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while services.get_opt("w").await.expect("get").is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Service never went"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stored = get_widget(&client, &ns, "w").await;
    let (report, _) = reconcile(&client, &stored).await.expect("reconcile");
    assert!(report.pruning.is_empty(), "{report:?}");
    assert_eq!(
        condition(&get_widget(&client, &ns, "w").await, "Ready").status,
        "True"
    );
}
