//! A TenantApp's readiness: `Ready` when the Deployment has as many available replicas as
//! desired at the current generation, `Reconciling` while it rolls out, `Stalled` when a child
//! name is taken, the app is not in a tenant namespace, or the Deployment reports a failure
//! (`ReplicaFailure`, `ProgressDeadlineExceeded`).

use idem_runtime::prelude::*;
use k8s_openapi::api::apps::v1::Deployment;

use crate::context::NotTenantNamespace;
use crate::resources::TENANT_LABEL;

/// Available replicas of the Deployment (0 when it has no status yet).
pub fn available(deployment: Option<&Deployment>) -> i32 {
    deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

/// The pods an app desires: its `replicas`, or when it leaves the count to someone else, the
/// Deployment's (1, the Deployment's default, before it is known).
pub fn desired_replicas(replicas: Option<i32>, deployment: Option<&Deployment>) -> i32 {
    replicas
        .or_else(|| deployment?.spec.as_ref()?.replicas)
        .unwrap_or(1)
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
    if let Some(failure) = deployment.and_then(failure) {
        return failure;
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
        // Say what is still awaited: "2 of 2 available" alone reads as done, and "4 of 1"
        // reads as a miscount while pods of a scale-down terminate.
        let count = if available > replicas {
            format!("{available} replicas available, scaling down to {replicas}")
        } else {
            format!("{available} of {replicas} replicas available")
        };
        let message = if !observed {
            format!("{count}; the Deployment controller has not yet seen the latest change")
        } else if replicas > 0 && updated < replicas {
            format!("{updated} of {replicas} replicas updated, {available} available")
        } else {
            count
        };
        // A rollout someone paused (`kubectl rollout pause`: the field is theirs, not the
        // app's) waits until they resume it; saying so is all the app can do.
        match deployment.filter(|d| d.spec.as_ref().and_then(|s| s.paused) == Some(true)) {
            Some(d) => Readiness::Reconciling {
                reason: "DeploymentPaused".into(),
                message: format!(
                    "{message}; Deployment {} is paused (spec.paused): its rollout waits until \
                     it is resumed (kubectl rollout resume)",
                    d.metadata.name.as_deref().unwrap_or_default()
                ),
            },
            None => Readiness::Reconciling {
                reason: "Progressing".into(),
                message,
            },
        }
    }
}

/// A failure the Deployment reports, as the app's `Stalled` readiness: condition
/// `ReplicaFailure=True` (pods cannot be created: quota, admission, a bad pod template) with
/// reason `ReplicaFailure`, or `Progressing=False` with reason `ProgressDeadlineExceeded`
/// (kstatus: both mean the rollout will not finish by itself). The message carries the
/// Deployment's own reason and message.
pub fn failure(deployment: &Deployment) -> Option<Readiness> {
    let conditions = deployment.status.as_ref()?.conditions.as_ref()?;
    let name = deployment.metadata.name.as_deref().unwrap_or_default();
    let describe = |c: &k8s_openapi::api::apps::v1::DeploymentCondition| {
        format!(
            "Deployment {name}: {}: {}",
            c.reason.as_deref().unwrap_or("unknown reason"),
            c.message.as_deref().unwrap_or_default()
        )
    };
    if let Some(c) = conditions
        .iter()
        .find(|c| c.type_ == "ReplicaFailure" && c.status == "True")
    {
        return Some(Readiness::Stalled {
            reason: "ReplicaFailure".into(),
            message: idem_runtime::status::shorten(
                &describe(c),
                idem_runtime::status::MAX_MESSAGE_BYTES,
            ),
        });
    }
    conditions
        .iter()
        .find(|c| {
            c.type_ == "Progressing"
                && c.status == "False"
                && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
        })
        .map(|c| Readiness::Stalled {
            reason: "ProgressDeadlineExceeded".into(),
            message: idem_runtime::status::shorten(
                &describe(c),
                idem_runtime::status::MAX_MESSAGE_BYTES,
            ),
        })
}

/// The readiness of an app outside a tenant namespace, saying why the namespace is not one.
pub fn not_in_tenant_namespace(namespace: &str, why: &NotTenantNamespace) -> Readiness {
    const ELSEWHERE: &str = "create TenantApps in a tenant's namespace";
    let why = match why {
        NotTenantNamespace::Missing => format!("does not exist; {ELSEWHERE}"),
        NotTenantNamespace::Unlabelled { controller: None } => format!(
            "is not a tenant's: no Tenant controls it (only namespaces a Tenant created count); {ELSEWHERE}"
        ),
        NotTenantNamespace::Unlabelled {
            controller: Some(tenant),
        } => format!(
            "is controlled by Tenant {tenant} but lacks the label {TENANT_LABEL}, which names its apps' tenant: the Tenant puts it back unless it is paused"
        ),
        NotTenantNamespace::NotControlled { tenant } => format!(
            "is labelled {TENANT_LABEL}={tenant} but no Tenant controls it (it has no controller ownerReference to Tenant {tenant} carrying that Tenant's uid; only namespaces a Tenant created count); {ELSEWHERE}"
        ),
    };
    Readiness::Stalled {
        reason: "NotInTenantNamespace".into(),
        message: format!("namespace {namespace} {why}"),
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
    fn not_in_tenant_namespace_says_the_real_reason() {
        let message = |why| match not_in_tenant_namespace("ns", &why) {
            Readiness::Stalled { message, .. } => message,
            other => panic!("{other:?}"),
        };
        let forged = message(NotTenantNamespace::NotControlled {
            tenant: "acme".into(),
        });
        assert!(forged.contains("no Tenant controls it"), "{forged}");
        assert!(
            !forged.contains("has no tenancy.idem.dev/tenant label"),
            "{forged}"
        );
        assert!(
            message(NotTenantNamespace::Unlabelled { controller: None })
                .contains("no Tenant controls it")
        );
        let unlabelled = message(NotTenantNamespace::Unlabelled {
            controller: Some("acme".into()),
        });
        assert!(
            unlabelled.contains("controlled by Tenant acme")
                && unlabelled.contains(&format!("lacks the label {TENANT_LABEL}"))
                && !unlabelled.contains("no Tenant controls it"),
            "{unlabelled}"
        );
        assert!(message(NotTenantNamespace::Missing).contains("does not exist"));
    }

    #[test]
    fn a_deployment_failure_is_stalled_with_its_reason() {
        let failing: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "generation": 1},
            "status": {"observedGeneration": 1, "conditions": [
                {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                 "message": "pods \"web-1\" is forbidden: exceeded quota"}]},
        }))
        .unwrap();
        match readiness(1, &ApplyReport::default(), Some(&failing)) {
            Readiness::Stalled { reason, message } => {
                assert_eq!(reason, "ReplicaFailure");
                assert!(
                    message.contains("FailedCreate") && message.contains("exceeded quota"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_paused_rollout_is_named() {
        let mut paused = deployment(2, 2, 1, 0);
        paused.spec = Some(k8s_openapi::api::apps::v1::DeploymentSpec {
            paused: Some(true),
            ..Default::default()
        });
        match readiness(1, &ApplyReport::default(), Some(&paused)) {
            Readiness::Reconciling { reason, message } => {
                assert_eq!(reason, "DeploymentPaused");
                assert!(
                    message.contains("0 of 1 replicas updated")
                        && message.contains("Deployment web is paused"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Not paused: progressing as before.
        assert!(matches!(
            readiness(1, &ApplyReport::default(), Some(&deployment(2, 2, 1, 0))),
            Readiness::Reconciling { reason, .. } if reason == "Progressing"
        ));
    }

    #[test]
    fn the_desired_count_is_the_apps_or_else_the_deployments() {
        let mut d = Deployment::default();
        assert_eq!(desired_replicas(Some(2), Some(&d)), 2);
        assert_eq!(desired_replicas(None, None), 1);
        assert_eq!(desired_replicas(None, Some(&d)), 1);
        d.spec = Some(k8s_openapi::api::apps::v1::DeploymentSpec {
            replicas: Some(5),
            ..Default::default()
        });
        assert_eq!(desired_replicas(None, Some(&d)), 5);
        assert_eq!(desired_replicas(Some(0), Some(&d)), 0);
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

    #[test]
    fn progressing_says_what_is_still_awaited() {
        let report = ApplyReport::default();
        let message = |d| match readiness(2, &report, Some(&d)) {
            Readiness::Reconciling { message, .. } => message,
            other => panic!("{other:?}"),
        };
        // Scaled back by the operator: all available, the change not yet seen.
        assert_eq!(
            message(deployment(4, 3, 2, 2)),
            "2 of 2 replicas available; the Deployment controller has not yet seen the latest change"
        );
        assert_eq!(
            message(deployment(3, 3, 2, 1)),
            "1 of 2 replicas updated, 2 available"
        );
        assert_eq!(message(deployment(3, 3, 1, 2)), "1 of 2 replicas available");
        // Scaled down: the extra pods are still terminating.
        assert_eq!(
            message(deployment(3, 3, 4, 2)),
            "4 replicas available, scaling down to 2"
        );
        assert_eq!(
            message(deployment(4, 3, 4, 4)),
            "4 replicas available, scaling down to 2; the Deployment controller has not yet seen \
             the latest change"
        );
    }
}
