//! The test CRD (`Widget`, kube `CustomResource` + idem's derive), its desired children, one
//! reconcile as an operator would run it, and counting writes in the API server's `/metrics`.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use idem_runtime::IdempotentResource;
use idem_runtime::apply::{Applier, ApplyReport, DesiredChildren, Owner};
use idem_runtime::resource::IdempotentResource as _;
use idem_runtime::status::{StatusOutcome, StatusWriter};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerPort, Namespace, PodSpec, PodTemplateSpec, ResourceQuota,
    ResourceQuotaSpec, ResourceRequirements, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, PostParams};
use kube::{Client, CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::RwLock;

/// The test resource: namespaced, tenant = its namespace, kstatus conditions.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "test.idem.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
#[idempotent(tenant = namespace, field_manager = "idem-operator", prune = owner_references)]
#[serde(rename_all = "camelCase")]
pub struct WidgetSpec {
    pub image: String,
    pub replicas: i32,
    /// Keys of the ConfigMap child.
    pub config: BTreeMap<String, String>,
    /// Whether a Service child is desired.
    pub service: bool,
    #[idempotent(skip)]
    pub note: Option<String>,
}

/// The test resource's status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WidgetStatus {
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Written by a rival writer in the conflict test; idem keeps it.
    pub note: Option<String>,
}

/// Tests that count writes in `/metrics` take this for writing; all others for reading, so
/// nothing else writes while a count is taken.
pub static METRICS_LOCK: LazyLock<RwLock<()>> = LazyLock::new(|| RwLock::new(()));

pub fn client() -> Client {
    idem_tests::shared().client()
}

/// Installs the Widget CRD (idempotent) and waits until it is established.
pub async fn ensure_crd(client: &Client) {
    idem_tests::install_crd(client, &Widget::crd())
        .await
        .expect("install the Widget CRD");
}

/// A fresh namespace, after the root-CA publisher has put its ConfigMap in it (so later
/// ConfigMap write counts are ours alone).
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = idem_tests::unique_name(prefix);
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    api.create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &name);
    for _ in 0..100 {
        if cms
            .get_opt("kube-root-ca.crt")
            .await
            .expect("get")
            .is_some()
        {
            return name;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("namespace {name} never got kube-root-ca.crt");
}

pub fn widget_spec() -> WidgetSpec {
    WidgetSpec {
        image: "nginx:1.27".into(),
        replicas: 2,
        config: [("greeting".to_string(), "hello".to_string())].into(),
        service: true,
        note: None,
    }
}

/// Creates a Widget and returns it as stored.
pub async fn create_widget(client: &Client, ns: &str, name: &str, spec: WidgetSpec) -> Widget {
    let api: Api<Widget> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &Widget::new(name, spec))
        .await
        .expect("create widget")
}

pub async fn get_widget(client: &Client, ns: &str, name: &str) -> Widget {
    Api::<Widget>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("get widget")
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    }
}

fn q(s: &str) -> Quantity {
    Quantity(s.to_owned())
}

/// The children a Widget desires: a ConfigMap, a Deployment (server defaults many fields), a
/// ResourceQuota (quantities the server canonicalises: "1000m" → "1") and maybe a Service.
pub fn desired_children(w: &Widget) -> DesiredChildren {
    let name = w.metadata.name.clone().expect("name");
    let labels: BTreeMap<String, String> = [("app".to_string(), name.clone())].into();
    let mut d = DesiredChildren::new();
    d.add(&ConfigMap {
        metadata: meta(&format!("{name}-config")),
        data: Some(w.spec.config.clone()),
        ..ConfigMap::default()
    })
    .expect("configmap");
    d.add(&Deployment {
        metadata: meta(&name),
        spec: Some(DeploymentSpec {
            replicas: Some(w.spec.replicas),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "app".into(),
                        image: Some(w.spec.image.clone()),
                        ports: Some(vec![ContainerPort {
                            container_port: 8080,
                            ..ContainerPort::default()
                        }]),
                        resources: Some(ResourceRequirements {
                            requests: Some(
                                [
                                    ("cpu".to_string(), q("0.1")),
                                    ("memory".to_string(), q("64Mi")),
                                ]
                                .into(),
                            ),
                            ..ResourceRequirements::default()
                        }),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    })
    .expect("deployment");
    d.add(&ResourceQuota {
        metadata: meta(&format!("{name}-quota")),
        spec: Some(ResourceQuotaSpec {
            hard: Some(
                [
                    ("cpu".to_string(), q("1000m")),
                    ("memory".to_string(), q("1024Mi")),
                    ("pods".to_string(), q("10")),
                ]
                .into(),
            ),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    })
    .expect("quota");
    if w.spec.service {
        d.add(&Service {
            metadata: meta(&name),
            spec: Some(ServiceSpec {
                selector: Some(labels),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    target_port: Some(IntOrString::Int(8080)),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        })
        .expect("service");
    } else {
        d.prune_kind::<Service>();
    }
    d
}

/// One reconcile as the operator runs it: apply children, then write the status from the
/// apply report (kstatus conditions).
pub async fn reconcile(
    client: &Client,
    w: &Widget,
) -> Result<(ApplyReport, StatusOutcome<Widget>), String> {
    let tenant = w.tenant().map_err(|e| e.to_string())?;
    let tenant = tenant.resolve(client).await.map_err(|e| e.to_string())?;
    let owner = Owner::new(w, Widget::FIELD_MANAGER, Some(tenant)).map_err(|e| e.to_string())?;
    let report = Applier::new(client.clone())
        .reconcile(&owner, &desired_children(w))
        .await
        .map_err(|e| e.to_string())?;
    let readiness = report.readiness();
    let ns = w.metadata.namespace.as_deref().expect("namespaced");
    let outcome = StatusWriter::new(Api::<Widget>::namespaced(client.clone(), ns))
        .write(w, |_, draft| {
            draft.set_readiness(&readiness);
        })
        .await
        .map_err(|e| e.to_string())?;
    Ok((report, outcome))
}

/// Counts of `apiserver_request_total` split by subresource, from the server's `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Write requests on the main resource.
    pub writes: u64,
    /// Write requests on `/status`.
    pub status_writes: u64,
    /// Responses with code 409 (any verb, any subresource).
    pub conflicts: u64,
}

/// The `apiserver_request_total` samples of `resource` in `group` (plural, `""` = core) in
/// the metrics text `text`: each sample's labels and value.
pub fn request_samples(text: &str, group: &str, resource: &str) -> Vec<(Labels, u64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let labels = Labels(
            labels
                .split("\",")
                .filter_map(|kv| kv.split_once("=\""))
                .map(|(k, v)| (k.to_owned(), v.trim_end_matches('"').to_owned()))
                .collect(),
        );
        if labels.get("group") != Some(group) || labels.get("resource") != Some(resource) {
            continue;
        }
        out.push((labels, value.trim().parse::<f64>().unwrap_or(0.0) as u64));
    }
    out
}

/// The labels of one metrics sample.
pub struct Labels(Vec<(String, String)>);

impl Labels {
    /// The value of label `key`, if the sample has it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The counts for `resource` in `group` (plural, `""` = core) at this moment.
pub async fn counts(group: &str, resource: &str) -> Counts {
    let text = idem_tests::shared().metrics().await.expect("metrics");
    let mut c = Counts::default();
    for (labels, v) in request_samples(&text, group, resource) {
        let verb = labels.get("verb").unwrap_or_default();
        let sub = labels.get("subresource").unwrap_or_default();
        if idem_tests::metrics::WRITE_VERBS.contains(&verb) {
            if sub.is_empty() {
                c.writes += v;
            } else if sub == "status" {
                c.status_writes += v;
            }
        }
        if labels.get("code") == Some("409") {
            c.conflicts += v;
        }
    }
    c
}

/// The condition `type_` of a Widget's status.
pub fn condition<'a>(w: &'a Widget, type_: &str) -> &'a Condition {
    w.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("condition {type_} not set on {:?}", w.status))
}
