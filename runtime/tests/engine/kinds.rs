//! Convergence for kinds the convergence check cannot judge alone, decided by the API server:
//! defaults inside values we own whole (a StatefulSet's `volumeClaimTemplates`, an HPA's
//! `metrics`, a custom resource's atomic list), quantities in fields the check does not know,
//! int-or-string, server-assigned fields and a Secret's write-only `stringData` (folded into
//! `data` when the child is added, so judged exactly).
//!
//! For each kind, on the real control plane:
//! 1. created, then a pass makes no request (counted at the API server) and reports no drift;
//!    a new applier (a restarted process) asks at most one dry-run, then none;
//! 2. another field manager's change is restored, reported once, naming that field only; the
//!    same change made again after that repair is restored and reported again;
//! 3. a change to an immutable field is a terminal error (invalid child), and the revert is
//!    converged with no request and no drift report.

use idem_runtime::TenantKey;
use idem_runtime::apply::{Applier, ApplyError, ChildOutcome, ChildScope, DesiredChildren, Owner};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
use kube::{Client, CustomResource, Resource};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::common::*;
use crate::user::CountedUser;

/// A custom kind of the test's own: an atomic list whose items the server defaults, an
/// int-or-string, a quantity-like string, a field the server defaults outside what we own,
/// and an immutable field (a CEL transition rule).
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(group = "kinds.idem.dev", version = "v1", kind = "Gadget", namespaced)]
pub struct GadgetSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    items: Option<Vec<GadgetItem>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    port: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tier: Option<String>,
}

/// An item of [`GadgetSpec::items`].
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct GadgetItem {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<String>,
}

async fn ensure_gadget_crd(client: &Client) {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.kinds.idem.dev"},
        "spec": {"group": "kinds.idem.dev", "scope": "Namespaced",
            "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget",
                "listKind": "GadgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "items": {"type": "array", "items": {"type": "object",
                            "required": ["name"], "properties": {
                                "name": {"type": "string"},
                                "mode": {"type": "string", "default": "Filesystem"}}}},
                        "port": {"x-kubernetes-int-or-string": true},
                        "size": {"type": "string"},
                        "key": {"type": "string", "x-kubernetes-validations": [
                            {"rule": "self == oldSelf", "message": "key is immutable"}]},
                        "tier": {"type": "string", "default": "standard"}}}}}}}]}
    }))
    .expect("the Gadget CRD");
    idem_tests::install_crd(client, &crd)
        .await
        .expect("install the Gadget CRD");
}

/// One kind's case: the desired child, another manager's change (a merge patch) and the path
/// the repair must name, and optionally a desired child with an immutable field changed.
struct Case {
    desired: Value,
    tamper: Value,
    tampered_path: &'static str,
    immutable: Option<Value>,
}

/// Requests on one resource counted by the API server: (dry-run applies, other requests), but
/// for lists, watches and subresources.
async fn requests(group: &str, resource: &str) -> (u64, u64) {
    let text = idem_tests::shared().metrics().await.expect("metrics");
    let (mut dry, mut other) = (0, 0);
    for (labels, v) in request_samples(&text, group, resource) {
        // The kinds' own controllers (in the controller-manager) watch them and write their
        // status: those requests are not the engine's.
        if labels.get("subresource").is_some_and(|s| !s.is_empty())
            || matches!(labels.get("verb"), Some("LIST" | "WATCH"))
        {
            continue;
        }
        if labels.get("dry_run").is_some_and(|d| !d.is_empty()) {
            dry += v;
        } else {
            other += v;
        }
    }
    (dry, other)
}

fn one<K>(body: &Value) -> DesiredChildren
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    K::Scope: ChildScope,
{
    let child: K = serde_json::from_value(body.clone()).expect("a valid child body");
    let mut d = DesiredChildren::new();
    d.add(&child).expect("add");
    d
}

/// The live child, as the engine would get it from its cache.
async fn live(api: &Api<DynamicObject>, name: &str) -> DynamicObject {
    api.get(name).await.expect("get the child")
}

/// One pass given the live object (no read): its outcome and the requests it made, as
/// (dry-run applies, other requests). The pass's applier acts as `user`, whose requests the
/// API server counts apart (a FlowSchema of its own), so that other clients' requests on the
/// kind meanwhile (the namespace controller emptying other tests' namespaces, the garbage
/// collector) are not taken for the pass's; only the engine makes dry-runs.
async fn pass_counted(
    applier: &Applier,
    user: &CountedUser,
    owner: &Owner,
    desired: &DesiredChildren,
    api: &Api<DynamicObject>,
    group: &str,
    plural: &str,
) -> (ChildOutcome, (u64, u64)) {
    let name = desired.children()[0].key().name.to_string();
    let observed = live(api, &name).await;
    let (dry_before, all_before) = (requests(group, plural).await.0, user.requests().await);
    let outcome = applier
        .apply_observed(owner, &desired.children()[0], Some(observed))
        .await
        .expect("pass");
    let (dry_after, all_after) = (requests(group, plural).await.0, user.requests().await);
    let dry = dry_after - dry_before;
    (outcome, (dry, (all_after - all_before).saturating_sub(dry)))
}

async fn run<K>(kind: &str, case: Case)
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    K::Scope: ChildScope,
{
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.write().await;
    let ns = namespace(&client, &format!("kind-{}", kind.to_lowercase())).await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(TenantKey::new(&ns))).expect("owner");
    let desired = one::<K>(&case.desired);
    let ar = ApiResource::erase::<K>(&());
    let (group, plural) = (ar.group.clone(), ar.plural.clone());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let name = desired.children()[0].key().name.to_string();
    let user = CountedUser::create(&client, "engine-kinds").await;

    // 1. Created; then converged with no request and no drift report.
    let applier = Applier::new(user.client());
    let first = requests(&group, &plural).await;
    let report = applier.reconcile(&owner, &desired).await.expect("create");
    assert_eq!(
        report.children[0].1,
        ChildOutcome::Created,
        "{kind}: {report:?}"
    );
    let report = applier
        .reconcile(&owner, &desired)
        .await
        .expect("second pass");
    assert_eq!(
        report.children[0].1,
        ChildOutcome::Unchanged,
        "{kind}: the pass after the create wrote again (the server's own form of the desired body taken for drift): {report:?}"
    );
    assert!(report.repaired.is_empty(), "{kind}: {:?}", report.repaired);
    let first_dry_runs = requests(&group, &plural).await.0 - first.0;
    assert_eq!(
        first_dry_runs, 0,
        "{kind}: the first convergence asked the server (its create's answer is enough)"
    );
    let (outcome, (dry, other)) =
        pass_counted(&applier, &user, &owner, &desired, &api, &group, &plural).await;
    assert_eq!(outcome, ChildOutcome::Unchanged, "{kind}");
    assert_eq!(
        (dry, other),
        (0, 0),
        "{kind}: a converged pass made requests"
    );
    // A restarted process: at most one dry-run, no write; then nothing.
    let restarted = Applier::new(user.client());
    let (outcome, (dry, other)) =
        pass_counted(&restarted, &user, &owner, &desired, &api, &group, &plural).await;
    assert_eq!(outcome, ChildOutcome::Unchanged, "{kind}: after a restart");
    assert!(
        dry <= 1 && other == 0,
        "{kind}: after a restart a converged pass made {dry} dry-runs and {other} other requests"
    );
    let (outcome, counts) =
        pass_counted(&restarted, &user, &owner, &desired, &api, &group, &plural).await;
    assert_eq!(
        (outcome, counts),
        (ChildOutcome::Unchanged, (0, 0)),
        "{kind}: the second pass after a restart"
    );
    eprintln!(
        "{kind}: first convergence {first_dry_runs} dry-runs; converged pass 0 requests; \
         after a restart {dry} dry-run(s) and {other} other requests, then 0"
    );

    // 2. Another manager's change: restored, reported once, naming that field only.
    let pp = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..PatchParams::default()
    };
    api.patch(&name, &pp, &Patch::Merge(&case.tamper))
        .await
        .expect("tamper");
    let report = applier.reconcile(&owner, &desired).await.expect("repair");
    assert_eq!(
        report.children[0].1,
        ChildOutcome::Applied,
        "{kind}: {report:?}"
    );
    assert_eq!(report.repaired.len(), 1, "{kind}: {:?}", report.repaired);
    let paths: Vec<&str> = report.repaired[0]
        .drift
        .iter()
        .map(|d| d.path.as_str())
        .collect();
    assert_eq!(
        paths,
        [case.tampered_path],
        "{kind}: the repair names other fields than the changed one: {:?}",
        report.repaired[0].drift
    );
    let after = live(&api, &name).await;
    let restored = serde_json::to_value(&after).expect("json");
    let check = applier
        .reconcile(&owner, &desired)
        .await
        .expect("after repair");
    assert_eq!(
        check.children[0].1,
        ChildOutcome::Unchanged,
        "{kind}: not converged after the repair: {restored}"
    );
    let (outcome, counts) =
        pass_counted(&applier, &user, &owner, &desired, &api, &group, &plural).await;
    assert_eq!(
        (outcome, counts),
        (ChildOutcome::Unchanged, (0, 0)),
        "{kind}"
    );
    // The same change again, after our apply (no create's entry left to own what it set):
    // restored and reported again.
    api.patch(&name, &pp, &Patch::Merge(&case.tamper))
        .await
        .expect("tamper again");
    let report = applier
        .reconcile(&owner, &desired)
        .await
        .expect("second repair");
    assert_eq!(
        report.children[0].1,
        ChildOutcome::Applied,
        "{kind}: the change made again after a repair was not restored: {report:?}"
    );
    let paths: Vec<&str> = report
        .repaired
        .iter()
        .flat_map(|r| r.drift.iter().map(|d| d.path.as_str()))
        .collect();
    assert_eq!(paths, [case.tampered_path], "{kind}: the second repair");
    let (outcome, counts) =
        pass_counted(&applier, &user, &owner, &desired, &api, &group, &plural).await;
    assert_eq!(
        (outcome, counts),
        (ChildOutcome::Unchanged, (0, 0)),
        "{kind}: after the second repair"
    );
    // And once more while no process runs: a restarted one restores it.
    api.patch(&name, &pp, &Patch::Merge(&case.tamper))
        .await
        .expect("tamper while down");
    let restarted = Applier::new(user.client());
    let report = restarted
        .reconcile(&owner, &desired)
        .await
        .expect("repair after a restart");
    assert_eq!(
        report.children[0].1,
        ChildOutcome::Applied,
        "{kind}: a change made while no process ran was not restored: {report:?}\n{}",
        serde_json::to_string(&live(&api, &name).await.metadata.managed_fields).unwrap()
    );
    let (outcome, counts) =
        pass_counted(&restarted, &user, &owner, &desired, &api, &group, &plural).await;
    assert_eq!(
        (outcome, counts),
        (ChildOutcome::Unchanged, (0, 0)),
        "{kind}: after the repair of a restarted process"
    );

    // 3. An immutable field changed: a terminal error; the revert converges silently.
    if let Some(changed) = case.immutable {
        let err = applier
            .reconcile(&owner, &one::<K>(&changed))
            .await
            .expect_err("an immutable field cannot change");
        assert!(
            matches!(&err, ApplyError::Api { .. }) && err.is_invalid_child(),
            "{kind}: not an invalid child: {err}"
        );
        let reason = err.to_string();
        assert!(
            !reason.contains('\n'),
            "{kind}: a one-line reason: {reason}"
        );
        // The revert: no drift report. (Where the refused apply was preceded by moving our
        // create's record into our apply's, one apply gives up the server's defaults that
        // record held.)
        let report = applier.reconcile(&owner, &desired).await.expect("revert");
        assert!(
            matches!(
                report.children[0].1,
                ChildOutcome::Unchanged | ChildOutcome::Applied
            ),
            "{kind}: {report:?}"
        );
        assert!(report.repaired.is_empty(), "{kind}: {:?}", report.repaired);
        let (outcome, counts) =
            pass_counted(&applier, &user, &owner, &desired, &api, &group, &plural).await;
        assert_eq!(
            (outcome, counts),
            (ChildOutcome::Unchanged, (0, 0)),
            "{kind}"
        );
    }
}

fn pod_template(app: &str, restart: &str) -> Value {
    json!({"metadata": {"labels": {"app": app}},
        "spec": {"restartPolicy": restart,
            "containers": [{"name": "app", "image": "nginx:1.27",
                "resources": {"requests": {"cpu": "0.1", "memory": "64Mi"}}}]}})
}

#[tokio::test]
async fn statefulset_with_volume_claim_templates() {
    let sts = |storage: &str| {
        json!({"metadata": {"name": "db"}, "spec": {
            "serviceName": "db", "replicas": 1,
            "selector": {"matchLabels": {"app": "db"}},
            "template": pod_template("db", "Always"),
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": storage}}}}]}})
    };
    run::<k8s_openapi::api::apps::v1::StatefulSet>(
        "StatefulSet",
        Case {
            desired: sts("1Gi"),
            tamper: json!({"spec": {"replicas": 3}}),
            tampered_path: ".spec.replicas",
            immutable: Some(sts("2Gi")),
        },
    )
    .await;
}

#[tokio::test]
async fn persistent_volume_claim() {
    let pvc = |mode: &str| {
        json!({"metadata": {"name": "data", "labels": {"tier": "db"}}, "spec": {
            "accessModes": [mode], "resources": {"requests": {"storage": "1024Mi"}}}})
    };
    run::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(
        "PersistentVolumeClaim",
        Case {
            desired: pvc("ReadWriteOnce"),
            tamper: json!({"metadata": {"labels": {"tier": "web"}}}),
            tampered_path: ".metadata.labels.tier",
            immutable: Some(pvc("ReadWriteMany")),
        },
    )
    .await;
}

#[tokio::test]
async fn horizontal_pod_autoscaler_with_metric_targets() {
    run::<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>(
        "HorizontalPodAutoscaler",
        Case {
            desired: json!({"metadata": {"name": "web"}, "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 1, "maxReplicas": 5,
                "metrics": [
                    {"type": "Resource", "resource": {"name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 60}}},
                    {"type": "Pods", "pods": {"metric": {"name": "rps"},
                        "target": {"type": "AverageValue", "averageValue": "1000m"}}}],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}}}),
            tamper: json!({"spec": {"maxReplicas": 9}}),
            tampered_path: ".spec.maxReplicas",
            immutable: None,
        },
    )
    .await;
}

#[tokio::test]
async fn cron_job() {
    run::<k8s_openapi::api::batch::v1::CronJob>(
        "CronJob",
        Case {
            desired: json!({"metadata": {"name": "backup"}, "spec": {
                "schedule": "0 3 * * *",
                "jobTemplate": {"spec": {"template": pod_template("backup", "OnFailure")}}}}),
            tamper: json!({"spec": {"schedule": "0 4 * * *"}}),
            tampered_path: ".spec.schedule",
            immutable: None,
        },
    )
    .await;
}

#[tokio::test]
async fn job() {
    let job = |image: &str| {
        let mut template = pod_template("migrate", "Never");
        template["spec"]["containers"][0]["image"] = json!(image);
        json!({"metadata": {"name": "migrate"}, "spec": {
            "parallelism": 1, "backoffLimit": 2, "template": template}})
    };
    run::<k8s_openapi::api::batch::v1::Job>(
        "Job",
        Case {
            desired: job("nginx:1.27"),
            tamper: json!({"spec": {"parallelism": 0}}),
            tampered_path: ".spec.parallelism",
            immutable: Some(job("nginx:1.28")),
        },
    )
    .await;
}

#[tokio::test]
async fn ingress() {
    run::<k8s_openapi::api::networking::v1::Ingress>(
        "Ingress",
        Case {
            desired: json!({"metadata": {"name": "web"}, "spec": {
                "ingressClassName": "nginx",
                "rules": [{"host": "web.example.test", "http": {"paths": [{
                    "path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}}),
            tamper: json!({"spec": {"ingressClassName": "other"}}),
            tampered_path: ".spec.ingressClassName",
            immutable: None,
        },
    )
    .await;
}

#[tokio::test]
async fn pod_disruption_budget() {
    run::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(
        "PodDisruptionBudget",
        Case {
            desired: json!({"metadata": {"name": "db"}, "spec": {
                "minAvailable": "50%", "selector": {"matchLabels": {"app": "db"}}}}),
            tamper: json!({"spec": {"minAvailable": 1}}),
            tampered_path: ".spec.minAvailable",
            immutable: None,
        },
    )
    .await;
}

#[tokio::test]
async fn service_account() {
    run::<k8s_openapi::api::core::v1::ServiceAccount>(
        "ServiceAccount",
        Case {
            desired: json!({"metadata": {"name": "app"}, "automountServiceAccountToken": false}),
            tamper: json!({"automountServiceAccountToken": true}),
            tampered_path: ".automountServiceAccountToken",
            immutable: None,
        },
    )
    .await;
}

#[tokio::test]
async fn secret_with_data() {
    let secret = |immutable: bool| {
        json!({"metadata": {"name": "creds"}, "type": "Opaque", "immutable": immutable,
            "data": {"password": "c2VjcmV0"}})
    };
    run::<k8s_openapi::api::core::v1::Secret>(
        "Secret",
        Case {
            desired: secret(false),
            tamper: json!({"data": {"password": "b3RoZXI="}}),
            tampered_path: ".data.password",
            immutable: Some(
                json!({"metadata": {"name": "creds"}, "type": "kubernetes.io/tls",
                "immutable": false, "data": {"password": "c2VjcmV0"}}),
            ),
        },
    )
    .await;
}

#[tokio::test]
async fn secret_with_string_data() {
    run::<k8s_openapi::api::core::v1::Secret>(
        "Secret",
        Case {
            desired: json!({"metadata": {"name": "creds"}, "type": "Opaque",
                "stringData": {"password": "secret"}}),
            tamper: json!({"data": {"password": "b3RoZXI="}}),
            tampered_path: ".data.password",
            immutable: Some(
                json!({"metadata": {"name": "creds"}, "type": "kubernetes.io/tls",
                "stringData": {"password": "secret"}}),
            ),
        },
    )
    .await;
}

/// A Secret desired with `stringData` whose value changes: the apply of the new value leaves
/// no create's entry owning `data`, and another manager's change of `data` after it is still
/// restored and reported, in this process and in a restarted one.
#[tokio::test]
async fn secret_with_string_data_changed_then_tampered() {
    use k8s_openapi::api::core::v1::Secret;
    let client = client();
    ensure_crd(&client).await;
    let ns = namespace(&client, "kind-secret-changed").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(TenantKey::new(&ns))).expect("owner");
    let secret = |password: &str| {
        one::<Secret>(&json!({"metadata": {"name": "creds"}, "type": "Opaque",
            "stringData": {"password": password, "user": "app"}}))
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let password = |s: &Secret| {
        s.data
            .as_ref()
            .and_then(|d| d.get("password"))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let applier = Applier::new(client.clone());
    applier
        .reconcile(&owner, &secret("one"))
        .await
        .expect("create");
    let report = applier
        .reconcile(&owner, &secret("two"))
        .await
        .expect("change");
    assert_eq!(report.children[0].1, ChildOutcome::Applied, "{report:?}");
    assert_eq!(
        password(&api.get("creds").await.unwrap()).as_deref(),
        Some("two")
    );
    let tamper = |value: &'static str| {
        let api = api.clone();
        async move {
            let pp = PatchParams {
                field_manager: Some("kubectl-patch".into()),
                ..PatchParams::default()
            };
            api.patch(
                "creds",
                &pp,
                &Patch::Merge(json!({"data": {"password": value}})),
            )
            .await
            .expect("tamper");
        }
    };
    for (round, applier) in [
        ("same process", applier),
        ("restarted", Applier::new(client.clone())),
    ] {
        tamper("c3RvbGVu").await; // "stolen"
        let report = applier
            .reconcile(&owner, &secret("two"))
            .await
            .expect("repair");
        let live = api.get("creds").await.unwrap();
        assert_eq!(
            password(&live).as_deref(),
            Some("two"),
            "{round}: not restored ({report:?}); managedFields {}",
            serde_json::to_string(&live.metadata.managed_fields).unwrap()
        );
        let paths: Vec<&str> = report
            .repaired
            .iter()
            .flat_map(|r| r.drift.iter().map(|d| d.path.as_str()))
            .collect();
        assert_eq!(paths, [".data.password"], "{round}: {report:?}");
        let report = applier
            .reconcile(&owner, &secret("two"))
            .await
            .expect("converged");
        assert_eq!(report.children[0].1, ChildOutcome::Unchanged, "{round}");
    }
}

/// A desired Deployment with two `env` items of one name: the create is admitted (validation
/// only warns), but no server-side apply can merge such a body (the API server answers 500:
/// it cannot make the typed object). The apply of a change is an invalid child, terminal (the
/// same body fails the same way on every retry), with the server's reason.
#[tokio::test]
async fn duplicate_list_map_keys_are_an_invalid_child() {
    use k8s_openapi::api::apps::v1::Deployment;
    let client = client();
    ensure_crd(&client).await;
    let ns = namespace(&client, "kind-dup-keys").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(TenantKey::new(&ns))).expect("owner");
    let deployment = |image: &str| {
        one::<Deployment>(&json!({"metadata": {"name": "web"}, "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                {"name": "app", "image": image,
                    "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}]}}}}))
    };
    let applier = Applier::new(client.clone());
    let created = applier.reconcile(&owner, &deployment("nginx:1.27")).await;
    let err = match created {
        // Admitted at create: the apply of a change is where it fails.
        Ok(_) => applier
            .reconcile(&owner, &deployment("nginx:1.28"))
            .await
            .expect_err("an apply of duplicate keys cannot succeed"),
        Err(e) => e,
    };
    assert!(
        err.is_invalid_child(),
        "not an invalid child (it would be retried forever): {err}"
    );
    let reason = err.to_string();
    assert!(reason.contains("duplicate entries"), "{reason}");
}

/// A quantity that does not parse (`storage: lots`) is refused by the API server with its 500
/// "failed to convert new object … to smd typed", on the create and on an apply alike: an
/// invalid child, not a failure to retry forever.
#[tokio::test]
async fn a_quantity_that_does_not_parse_is_an_invalid_child() {
    use k8s_openapi::api::core::v1::ResourceQuota;
    let client = client();
    ensure_crd(&client).await;
    let ns = namespace(&client, "kind-bad-quantity").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(TenantKey::new(&ns))).expect("owner");
    let quota = |storage: &str| {
        one::<ResourceQuota>(
            &json!({"metadata": {"name": "q"}, "spec": {"hard": {"requests.storage": storage}}}),
        )
    };
    let applier = Applier::new(client.clone());
    let err = applier
        .reconcile(&owner, &quota("lots"))
        .await
        .expect_err("the create of a quantity that does not parse");
    assert!(err.is_invalid_child(), "create: {err}");
    applier
        .reconcile(&owner, &quota("1Gi"))
        .await
        .expect("a valid quota");
    let err = applier
        .reconcile(&owner, &quota("lots"))
        .await
        .expect_err("the apply of a quantity that does not parse");
    assert!(err.is_invalid_child(), "apply: {err}");
}

#[tokio::test]
async fn headless_service_with_port_defaults() {
    let svc = |cluster_ip: &str| {
        json!({"metadata": {"name": "db"}, "spec": {
            "clusterIP": cluster_ip, "selector": {"app": "db"},
            "ports": [{"name": "sql", "port": 5432, "targetPort": "sql"}]}})
    };
    run::<k8s_openapi::api::core::v1::Service>(
        "Service",
        Case {
            desired: svc("None"),
            tamper: json!({"spec": {"selector": {"app": "other"}}}),
            // A Service's selector is an atomic map: taken and restored whole.
            tampered_path: ".spec.selector",
            immutable: Some(svc("10.0.0.77")),
        },
    )
    .await;
}

#[tokio::test]
async fn service_with_a_server_assigned_cluster_ip() {
    run::<k8s_openapi::api::core::v1::Service>(
        "Service",
        Case {
            desired: json!({"metadata": {"name": "web"}, "spec": {
                "selector": {"app": "web"},
                "ports": [{"port": 80, "targetPort": 8080}]}}),
            tamper: json!({"spec": {"selector": {"app": "other"}}}),
            // A Service's selector is an atomic map: taken and restored whole.
            tampered_path: ".spec.selector",
            immutable: None,
        },
    )
    .await;
}

#[tokio::test]
async fn custom_resource_with_defaults_int_or_string_and_quantities() {
    ensure_gadget_crd(&client()).await;
    let gadget = |key: &str| {
        json!({"metadata": {"name": "g"}, "spec": {
            "items": [{"name": "a"}, {"name": "b", "mode": "Block"}],
            "port": "http", "size": "1024Mi", "key": key}})
    };
    run::<Gadget>(
        "Gadget",
        Case {
            desired: gadget("k1"),
            tamper: json!({"spec": {"port": 8080}}),
            tampered_path: ".spec.port",
            immutable: Some(gadget("k2")),
        },
    )
    .await;
}
