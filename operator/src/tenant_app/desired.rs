//! The desired children of a TenantApp: ConfigMap `<app>-config`, Deployment `<app>` (its pod
//! template carries a hash of the config so a config change rolls the pods) and Service `<app>`,
//! each labelled with the shard bucket of its namespace.

use std::collections::BTreeMap;

use idem_runtime::compare::fingerprint;
use idem_runtime::prelude::*;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, PodSpec, PodTemplateSpec,
    SecurityContext, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use crate::resources::TenantApp;

/// Pod-template annotation with a hash of `spec.config`: changing the config rolls the pods.
pub const CONFIG_HASH_ANNOTATION: &str = "tenancy.idem.dev/config-hash";
/// Label selecting an app's pods.
pub const APP_LABEL: &str = "app.kubernetes.io/name";

/// The ConfigMap's name for app `name`.
pub fn config_map_name(name: &str) -> String {
    format!("{name}-config")
}

/// The three children of `app`, in apply order: ConfigMap, Deployment, Service.
///
/// # Errors
/// [`ApplyError`] when a child cannot be serialised.
pub fn children(app: &TenantApp) -> Result<DesiredChildren, ApplyError> {
    let (config_map, deployment, service) = objects(app);
    let mut desired = DesiredChildren::new();
    desired.add(&config_map)?.add(&deployment)?.add(&service)?;
    // A Deployment the API server refuses to make as desired was made invalid by another
    // writer's fields (the CRD admits only specs whose children the server accepts, e.g.
    // someone's `privileged: true` beside our `allowPrivilegeEscalation: false`): deleted and
    // created again as desired, rather than left as they made it.
    desired.allow_recreate::<Deployment>();
    Ok(desired)
}

/// A stable hash (hex) of the config files.
pub fn config_hash(config: &BTreeMap<String, String>) -> String {
    format!("{}", fingerprint(&serde_json::json!(config)))
}

/// The children as typed objects.
pub fn objects(app: &TenantApp) -> (ConfigMap, Deployment, Service) {
    let name = app.name_any();
    let spec = &app.spec;
    let labels = BTreeMap::from([(APP_LABEL.to_string(), name.clone())]);
    // The bucket of the app's namespace, where its children live: a sharded replica's child
    // watches select the children of its TenantApps by it (`crate::shard`).
    let bucket = crate::shard::namespace_bucket(app.namespace().as_deref().unwrap_or_default());
    let meta = |n: &str| ObjectMeta {
        name: Some(n.to_string()),
        labels: Some(BTreeMap::from([(
            crate::shard::NAMESPACE_BUCKET_LABEL.to_owned(),
            bucket.clone(),
        )])),
        ..ObjectMeta::default()
    };
    let config_name = config_map_name(&name);
    let config_hash = config_hash(&spec.config);

    let config_map = ConfigMap {
        metadata: meta(&config_name),
        data: Some(spec.config.clone()),
        ..ConfigMap::default()
    };
    let container = Container {
        name: "app".into(),
        image: Some(spec.image.clone()),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: spec.port,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        env: (!spec.env.is_empty()).then(|| {
            spec.env
                .iter()
                .map(|(k, v)| EnvVar {
                    name: k.clone(),
                    value: Some(v.clone()),
                    value_from: None,
                })
                .collect()
        }),
        // A tenant's app never gains more privileges than its process started with.
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "config".into(),
            mount_path: format!("/etc/{name}"),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };
    let deployment = Deployment {
        metadata: meta(&name),
        spec: Some(DeploymentSpec {
            replicas: spec.replicas,
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    annotations: Some(BTreeMap::from([(
                        CONFIG_HASH_ANNOTATION.to_string(),
                        config_hash,
                    )])),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    volumes: Some(vec![Volume {
                        name: "config".into(),
                        config_map: Some(ConfigMapVolumeSource {
                            name: config_name,
                            ..ConfigMapVolumeSource::default()
                        }),
                        ..Volume::default()
                    }]),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };
    let service = Service {
        metadata: meta(&name),
        spec: Some(ServiceSpec {
            selector: Some(labels),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: spec.port,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    (config_map, deployment, service)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::TenantAppSpec;

    fn app(config: &[(&str, &str)]) -> TenantApp {
        let mut app = TenantApp::new(
            "web",
            TenantAppSpec {
                image: "nginx:1.27".into(),
                replicas: Some(2),
                port: 8080,
                env: BTreeMap::new(),
                config: config
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
        );
        app.metadata.namespace = Some("t-apps".into());
        app
    }

    fn hash(app: &TenantApp) -> String {
        let (_, deploy, _) = objects(app);
        let template = deploy.spec.unwrap().template.metadata.unwrap();
        template.annotations.unwrap()[CONFIG_HASH_ANNOTATION].clone()
    }

    #[test]
    fn three_children_in_apply_order() {
        let desired = children(&app(&[])).unwrap();
        let kinds: Vec<String> = desired
            .children()
            .iter()
            .map(|c| c.key().kind.to_string())
            .collect();
        assert_eq!(kinds, ["ConfigMap", "Deployment", "Service"]);
        assert_eq!(&*desired.children()[0].key().name, "web-config");
    }

    #[test]
    fn replicas_left_to_someone_else_are_not_in_the_desired_deployment() {
        let body = |app: &TenantApp| serde_json::to_value(objects(app).1).unwrap();
        let mut scaled_elsewhere = app(&[]);
        assert_eq!(body(&scaled_elsewhere)["spec"]["replicas"], 2);
        scaled_elsewhere.spec.replicas = None;
        let spec = body(&scaled_elsewhere)["spec"].clone();
        assert!(spec.get("replicas").is_none(), "{spec}");
        assert!(spec.get("template").is_some());
    }

    #[test]
    fn a_config_change_changes_the_pod_template_hash() {
        assert_eq!(hash(&app(&[("a", "1")])), hash(&app(&[("a", "1")])));
        assert_ne!(hash(&app(&[("a", "1")])), hash(&app(&[("a", "2")])));
    }
}
