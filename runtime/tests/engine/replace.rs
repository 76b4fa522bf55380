//! Drift server-side apply cannot repair: a rival's list item merged beside ours makes every
//! apply 422 Invalid, and the engine replaces the child instead.

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

/// Whether `manager` has a main-resource entry with operation `op` in the Service's
/// managedFields.
fn has_entry(svc: &Service, manager: &str, op: &str) -> bool {
    svc.metadata.managed_fields.iter().flatten().any(|e| {
        e.manager.as_deref() == Some(manager)
            && e.operation.as_deref() == Some(op)
            && e.subresource.as_deref().unwrap_or("").is_empty()
    })
}

#[tokio::test]
async fn rival_port_with_our_name_is_repaired_by_replace() {
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

    let w = get_widget(&client, &ns, "w").await;
    let (report, _) = reconcile(&client, &w).await.expect("repairing reconcile");
    let outcome = report
        .children
        .iter()
        .find(|(k, _)| &*k.kind == "Service")
        .map(|(_, o)| o.clone());
    assert_eq!(outcome, Some(ChildOutcome::Replaced), "{report:?}");
    assert!(report.wrote());
    let repaired = services.get("w").await.expect("service");
    assert_eq!(ports(&repaired), vec![ours.clone()]);
    let after = repaired.spec.clone().expect("spec");
    assert_eq!(
        after.cluster_ip,
        Some(cluster_ip),
        "clusterIP kept by the PUT"
    );
    assert_eq!(
        after.cluster_ips, spec.cluster_ips,
        "clusterIPs kept by the PUT"
    );
    assert!(repaired.metadata.owner_references.is_some());
    // The PUT is recorded as an Update of ours, not yet folded.
    assert!(has_entry(&repaired, Widget::FIELD_MANAGER, "Update"));

    // Converged: the next reconcile writes nothing.
    let w = get_widget(&client, &ns, "w").await;
    let before = counts("", "services").await;
    let (report, _) = reconcile(&client, &w).await.expect("third reconcile");
    let after_counts = counts("", "services").await;
    assert!(
        report
            .children
            .iter()
            .all(|(_, o)| *o == ChildOutcome::Unchanged),
        "{report:?}"
    );
    assert!(!report.wrote());
    assert_eq!(after_counts.writes - before.writes, 0, "service writes");

    // Ownership recorded by the PUT is folded into our Apply entry before the next apply, so a
    // field dropped from the desired object afterwards is removed: here the port's name, which
    // the PUT (re)created and so recorded under the Update entry.
    let tenant = w.tenant().expect("tenant");
    let tenant = tenant.resolve(&client).await.expect("resolve tenant");
    let owner = Owner::new(&w, Widget::FIELD_MANAGER, Some(tenant)).expect("owner");
    let mut desired = DesiredChildren::new();
    desired
        .add(&Service {
            metadata: ObjectMeta {
                name: Some("w".into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                selector: after.selector.clone(),
                ports: Some(vec![ServicePort {
                    port: 80,
                    target_port: Some(IntOrString::Int(8080)),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        })
        .expect("service");
    let report = Applier::new(client.clone())
        .reconcile(&owner, &desired)
        .await
        .expect("apply without the port name");
    assert_eq!(report.children[0].1, ChildOutcome::Applied, "{report:?}");
    let trimmed = services.get("w").await.expect("service");
    assert_eq!(
        ports(&trimmed),
        vec![(None, 80, Some(IntOrString::Int(8080)), Some("TCP".into()))]
    );
    assert!(!has_entry(&trimmed, Widget::FIELD_MANAGER, "Update"));
    assert!(has_entry(&trimmed, Widget::FIELD_MANAGER, "Apply"));
    assert_eq!(
        trimmed.spec.and_then(|s| s.cluster_ip),
        after.cluster_ip,
        "clusterIP unchanged"
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
