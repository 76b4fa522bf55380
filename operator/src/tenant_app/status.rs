//! A TenantApp's readiness: `Ready` when the Deployment has as many available replicas as
//! desired at the current generation, `Reconciling` while it rolls out, `Stalled` when a child
//! name is taken or the app is not in a tenant namespace.

use idem_runtime::apply::ApplyReport;
use idem_runtime::status::Readiness;
use k8s_openapi::api::apps::v1::Deployment;

/// Available replicas of the Deployment (0 when it has no status yet).
pub fn available(deployment: Option<&Deployment>) -> i32 {
    deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

/// The readiness of an app that desires `replicas` pods, given the apply report and the live
/// Deployment.
pub fn readiness(
    replicas: i32,
    report: &ApplyReport,
    deployment: Option<&Deployment>,
) -> Readiness {
    let applied = report.readiness();
    if !matches!(applied, Readiness::Ready { .. }) {
        return applied;
    }
    let available = available(deployment);
    let observed = deployment
        .and_then(|d| {
            Some((
                d.metadata.generation?,
                d.status.as_ref()?.observed_generation?,
            ))
        })
        .is_some_and(|(generation, observed)| observed >= generation);
    let updated = deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.updated_replicas)
        .unwrap_or(0);
    if observed && available == replicas && (replicas == 0 || updated == replicas) {
        Readiness::Ready {
            reason: "Available".into(),
            message: format!("{available} of {replicas} replicas available"),
        }
    } else {
        Readiness::Reconciling {
            reason: "Progressing".into(),
            message: format!("{available} of {replicas} replicas available"),
        }
    }
}

/// The readiness of an app outside a tenant namespace.
pub fn not_in_tenant_namespace(namespace: &str) -> Readiness {
    Readiness::Stalled {
        reason: "NotInTenantNamespace".into(),
        message: format!(
            "namespace {namespace} is not managed by idem (it has no tenancy.idem.dev/tenant label); create TenantApps in a tenant's namespace"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(generation: i64, observed: i64, available: i32, updated: i32) -> Deployment {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "generation": generation},
            "status": {"observedGeneration": observed, "availableReplicas": available, "updatedReplicas": updated},
        }))
        .unwrap()
    }

    #[test]
    fn ready_only_when_all_replicas_of_the_current_generation_are_available() {
        let report = ApplyReport::default();
        assert!(matches!(
            readiness(2, &report, Some(&deployment(3, 3, 2, 2))),
            Readiness::Ready { .. }
        ));
        assert!(matches!(
            readiness(2, &report, Some(&deployment(3, 2, 2, 2))),
            Readiness::Reconciling { .. }
        ));
        assert!(matches!(
            readiness(2, &report, Some(&deployment(3, 3, 1, 2))),
            Readiness::Reconciling { .. }
        ));
        assert!(matches!(
            readiness(2, &report, None),
            Readiness::Reconciling { .. }
        ));
    }
}
