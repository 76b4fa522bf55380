//! Drift server-side apply cannot repair: a rival's list item merged beside ours makes every
//! apply 422 Invalid. The engine never replaces (PUT) the child; kinds that opt in are deleted
//! and created again.

use idem_runtime::apply::{Applier, ChildOutcome, DesiredChildren, Owner};
use idem_runtime::resource::IdempotentResource as _;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::common::*;

/// `(name, port, targetPort, protocol)` of one Service port.
type Port = (Option<String>, i32, Option<IntOrString>, Option<String>);

/// Each port of a Service.
fn ports(svc: &Service) -> Vec<Port> {
    svc.spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name, p.port, p.target_port, p.protocol))
        .collect()
}

#[tokio::test]
async fn invalid_apply_is_an_error_not_a_replace_unless_the_kind_opts_in_to_recreate() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.write().await;
    let ns = namespace(&client, "replace").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    reconcile(&client, &w).await.expect("first reconcile");
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let created = services.get("w").await.expect("service");
    let spec = created.spec.clone().expect("spec");
    let cluster_ip = spec.cluster_ip.clone().expect("clusterIP allocated");
    assert_ne!(cluster_ip, "None");
    let ours = (
        Some("http".to_owned()),
        80,
        Some(IntOrString::Int(8080)),
        Some("TCP".to_owned()),
    );
    assert_eq!(ports(&created), vec![ours.clone()]);

    // A rival field manager (as `kubectl patch --type merge`) replaces the ports list with one
    // item of another port number and our port's name.
    let rival = PatchParams {
        field_manager: Some("rival".into()),
        ..PatchParams::default()
    };
    let merge = json!({"spec": {"ports": [{"name": "http", "port": 9999, "targetPort": 8080}]}});
    services
        .patch("w", &rival, &Patch::Merge(&merge))
        .await
        .expect("rival merge patch");

    // Server-side apply alone cannot repair it: it keeps the rival's item beside ours.
    let apply = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "w"},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    });
    let pp = PatchParams::apply(Widget::FIELD_MANAGER).force();
    let dry = PatchParams {
        dry_run: true,
        ..pp.clone()
    };
    match services.patch("w", &dry, &Patch::Apply(&apply)).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
            assert!(s.message.contains("Duplicate value"), "{}", s.message);
        }
        other => panic!("expected 422 Invalid from a plain apply, got {other:?}"),
    }

    // The rival also labels the Service: a PUT replace would drop that.
    let label =
        json!({"metadata": {"labels": {"rival": "yes"}, "finalizers": ["example.com/rival"]}});
    services
        .patch("w", &rival, &Patch::Merge(&label))
        .await
        .expect("rival label");

    // No silent destructive fallback: the reconcile fails with the server's 422 and the
    // Service keeps everything (the rival's label and finalizer, its uid).
    let w = get_widget(&client, &ns, "w").await;
    let puts = async || {
        let text = idem_tests::shared().metrics().await.expect("metrics");
        idem_tests::metrics::requests(&text, "PUT", "", "services")
    };
    let puts_before = puts().await;
    let err = reconcile(&client, &w).await.expect_err("422 is an error");
    assert!(
        err.contains("apply Service/") && err.contains("422 Invalid"),
        "{err}"
    );
    let kept = services.get("w").await.expect("service");
    assert_eq!(kept.metadata.uid, created.metadata.uid);
    assert_eq!(
        kept.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("rival"))
            .map(String::as_str),
        Some("yes")
    );
    assert_eq!(puts().await - puts_before, 0, "no PUT was made");

    // A kind that opts in is recreated: deleted (uid precondition) and created again.
    let tenant = w.tenant().expect("tenant");
    let tenant = tenant.resolve(&client).await.expect("resolve tenant");
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(tenant)).expect("owner");
    let mut desired = desired_children(&w);
    desired.allow_recreate::<Service>();
    // The rival's finalizer holds the deletion: released by the rival once asked to go.
    let services2 = services.clone();
    let releaser = tokio::spawn(async move {
        loop {
            let s = services2.get("w").await.expect("get");
            if s.metadata.deletion_timestamp.is_some() {
                let p = json!({"metadata": {"finalizers": null}});
                services2
                    .patch("w", &PatchParams::default(), &Patch::Merge(&p))
                    .await
                    .expect("release");
                return;
            }
            tokio::task::yield_now().await;
        }
    });
    let mut recreated = None;
    for _ in 0..50 {
        let report = Applier::new(client.clone())
            .reconcile(&owner, &desired)
            .await
            .expect("recreating reconcile");
        let outcome = report
            .children
            .iter()
            .find(|(k, _)| &*k.kind == "Service")
            .map(|(_, o)| o.clone())
            .expect("service outcome");
        match outcome {
            ChildOutcome::Recreated { reason } => {
                assert!(reason.contains("422"), "{reason}");
                assert!(
                    format!("{:?}", report.readiness()).contains("recreated"),
                    "{:?}",
                    report.readiness()
                );
                recreated = Some(reason);
            }
            ChildOutcome::Created => break,
            ChildOutcome::Terminating { .. } => {}
            other => panic!("{other:?}"),
        }
        let now = services.get_opt("w").await.expect("get");
        if now.as_ref().is_some_and(|s| {
            s.metadata.uid != created.metadata.uid && s.metadata.deletion_timestamp.is_none()
        }) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    releaser.await.expect("releaser");
    assert!(recreated.is_some(), "recreated once");
    let fresh = services.get("w").await.expect("service");
    assert_ne!(fresh.metadata.uid, created.metadata.uid, "a new object");
    assert_eq!(ports(&fresh), vec![ours.clone()]);
    let _ = (
        cluster_ip,
        spec,
        ServicePort::default(),
        ServiceSpec::default(),
        ObjectMeta::default(),
        DesiredChildren::new(),
    );
}

#[tokio::test]
async fn unowned_child_with_the_same_drift_is_not_replaced() {
    let client = client();
    ensure_crd(&client).await;
    let _guard = METRICS_LOCK.read().await;
    let ns = namespace(&client, "replace-unowned").await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let foreign = Service {
        metadata: ObjectMeta {
            name: Some("w".into()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 9999,
                target_port: Some(IntOrString::Int(8080)),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    let created = services
        .create(&kube::api::PostParams::default(), &foreign)
        .await
        .expect("create foreign service");
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let (report, _) = reconcile(&client, &w)
        .await
        .expect("reconcile is not an error");
    let outcome = report
        .children
        .iter()
        .find(|(k, _)| &*k.kind == "Service")
        .map(|(_, o)| o.clone());
    assert!(
        matches!(outcome, Some(ChildOutcome::NotOwned { .. })),
        "{report:?}"
    );
    let after = services.get("w").await.expect("service");
    assert_eq!(
        after.metadata.resource_version, created.metadata.resource_version,
        "untouched"
    );
    assert_eq!(ports(&after), ports(&created));
}

/// A kind that opts in to recreate is not deleted for a desired body the server refuses as a
/// new object too (a port out of range): the dry-run create says so first, the child stays,
/// and the refusal is the invalid-child error.
#[tokio::test]
async fn a_child_is_not_deleted_for_a_body_the_server_refuses_as_a_new_object() {
    let client = client();
    ensure_crd(&client).await;
    let ns = namespace(&client, "replace-invalid").await;
    let w = create_widget(&client, &ns, "w", widget_spec()).await;
    let tenant = w.tenant().expect("tenant");
    let tenant = tenant.resolve(&client).await.expect("resolve tenant");
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(tenant)).expect("owner");
    let desired = |port: i32| {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "s"},
            "spec": {"ports": [{"name": "http", "port": port}]}
        }))
        .expect("service");
        let mut d = DesiredChildren::new();
        d.add(&svc).expect("add");
        d.allow_recreate::<Service>();
        d
    };
    Applier::new(client.clone())
        .reconcile(&owner, &desired(80))
        .await
        .expect("create");
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let before = services.get("s").await.expect("service");
    let err = Applier::new(client.clone())
        .reconcile(&owner, &desired(0))
        .await
        .expect_err("a port out of range is refused");
    assert!(err.is_invalid_child(), "{err}");
    assert!(err.to_string().contains("port"), "{err}");
    let after = services.get("s").await.expect("the Service is still there");
    assert_eq!(after.metadata.uid, before.metadata.uid, "not recreated");
    assert!(
        after.metadata.deletion_timestamp.is_none(),
        "not being deleted"
    );
    assert_eq!(ports(&after)[0].1, 80);
}
