//! A manager's `rbac` objects are enough for it to work on the real control plane: the
//! example `BaseTenant` manager (runtime/examples/base_tenant.rs), run as the ServiceAccount
//! `rbac` prints and nothing more (impersonated), in a shard ring of one, creates a BaseTenant's children, repairs
//! their drift with an Event, and removes its finalizer when the BaseTenant is deleted, under
//! the cleanup guard `rbac` prints with its objects; no
//! request it sends is forbidden (its own request counter by status code). So does a manager
//! of a namespaced kind owning only ConfigMaps that installs its own CRD, in a shard ring.

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;

use std::net::SocketAddr;
use std::time::Duration;

use base_tenant::{BaseTenant, BaseTenants};
use idem_runtime::manager::rbac::rule;
use idem_runtime::manager::{Manager, ManagerOptions, Reconciles};
use idem_tests::ports::free_addr;
use idem_tests::{create_namespace, eventually, shared, unique_name};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{ResourceQuota, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::oneshot;

const TIMEOUT: Duration = Duration::from_secs(120);

/// A namespaced kind whose tenant is its namespace, owning one ConfigMap: nothing of it
/// lists Namespaces.
mod notes {
    use idem_runtime::prelude::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use kube::{CustomResource, ResourceExt as _};
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(
        CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema,
    )]
    #[kube(
        group = "rbac.idem.dev",
        version = "v1",
        kind = "Note",
        namespaced,
        status = "NoteStatus"
    )]
    #[idempotent(tenant = namespace)]
    pub struct NoteSpec {
        pub text: String,
    }

    #[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct NoteStatus {
        pub observed_generation: Option<i64>,
        #[serde(default)]
        pub conditions: Vec<Condition>,
        #[serde(default)]
        pub created_children: Vec<CreatedChild>,
    }

    #[derive(Clone)]
    pub struct Notes;
    impl Reconciler for Notes {
        type Resource = Note;
        fn children() -> ChildKinds<Note> {
            ChildKinds::new().owns::<ConfigMap>()
        }
        fn desired(&self, note: &Note) -> Result<DesiredChildren, ReconcileError> {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": note.name_any()}, "data": {"text": note.spec.text},
            }))
            .map_err(|e| ReconcileError::terminal("InvalidSpec", e.to_string()))?;
            let mut children = DesiredChildren::new();
            children.add(&cm)?;
            Ok(children)
        }
    }
}

/// Creates the objects `rbac` printed, as the admin.
async fn create_all(client: &Client, namespace: &str, objects: Vec<Value>) {
    let pp = PostParams::default();
    for object in objects {
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        match kind.as_str() {
            "ServiceAccount" => {
                let o: ServiceAccount = serde_json::from_value(object).unwrap();
                Api::namespaced(client.clone(), namespace)
                    .create(&pp, &o)
                    .await
                    .map(drop)
            }
            "ClusterRole" => {
                let o: ClusterRole = serde_json::from_value(object).unwrap();
                Api::all(client.clone()).create(&pp, &o).await.map(drop)
            }
            "ClusterRoleBinding" => {
                let o: ClusterRoleBinding = serde_json::from_value(object).unwrap();
                Api::all(client.clone()).create(&pp, &o).await.map(drop)
            }
            "Role" => {
                let o: Role = serde_json::from_value(object).unwrap();
                Api::namespaced(client.clone(), namespace)
                    .create(&pp, &o)
                    .await
                    .map(drop)
            }
            "RoleBinding" => {
                let o: RoleBinding = serde_json::from_value(object).unwrap();
                Api::namespaced(client.clone(), namespace)
                    .create(&pp, &o)
                    .await
                    .map(drop)
            }
            "ValidatingAdmissionPolicy" => {
                let o: ValidatingAdmissionPolicy = serde_json::from_value(object).unwrap();
                Api::all(client.clone()).create(&pp, &o).await.map(drop)
            }
            "ValidatingAdmissionPolicyBinding" => {
                let o: ValidatingAdmissionPolicyBinding = serde_json::from_value(object).unwrap();
                Api::all(client.clone()).create(&pp, &o).await.map(drop)
            }
            other => panic!("rbac printed a {other}"),
        }
        .unwrap_or_else(|e| panic!("create the {kind}: {e}"));
    }
}

/// A kubeconfig file like the control plane's, impersonating `user`.
fn impersonating(user: &str) -> std::path::PathBuf {
    let mut kubeconfig =
        idem_tests::load_kubeconfig(shared().kubeconfig_path()).expect("the kubeconfig");
    for named in &mut kubeconfig.auth_infos {
        if let Some(auth) = named.auth_info.as_mut() {
            auth.impersonate = Some(user.to_owned());
        }
    }
    let path = std::env::temp_dir().join(format!("{}.kubeconfig", unique_name("rbac")));
    std::fs::write(&path, serde_json::to_vec(&kubeconfig).unwrap()).unwrap();
    path
}

/// A manager's options as the ServiceAccount `name` of `namespace` (impersonated), its Leases
/// there, in a shard ring of one (the member Lease, the ring's guard, the server's
/// `shardSelector` probe), its `/metrics` on `metrics_addr`.
fn ring_of_one_as(namespace: &str, name: &str, metrics_addr: SocketAddr) -> ManagerOptions {
    ManagerOptions {
        kubeconfig: Some(impersonating(&format!(
            "system:serviceaccount:{namespace}:{name}"
        ))),
        leader_elect_namespace: Some(namespace.to_owned()),
        shards: true,
        identity: Some("a".into()),
        metrics_addr,
        health_addr: free_addr(),
        ..ManagerOptions::default()
    }
}

/// Asserts that the manager's request counter in `/metrics` text `text` counts requests and
/// none answered 403.
fn assert_none_refused(text: &str) {
    let sent: Vec<&str> = (text.lines())
        .filter(|l| l.starts_with("idem_rest_client_requests_total{"))
        .collect();
    assert!(!sent.is_empty(), "the manager counts its requests: {text}");
    let refused: Vec<&&str> = sent.iter().filter(|l| l.contains("\"403\"")).collect();
    assert!(
        refused.is_empty(),
        "requests forbidden to the account `rbac` printed: {refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_runs_on_the_rbac_it_prints() {
    let client = shared().client();
    base_tenant::install_crd(&client).await.expect("install");
    let namespace = create_namespace(&client, "rbac").await.unwrap();
    // One ServiceAccount and ClusterRole per run of this test: the name is the manager's.
    let name = unique_name("base-tenant");
    let metrics_addr = free_addr();
    let options = ring_of_one_as(&namespace, &name, metrics_addr);
    let manager = Manager::new(name.clone(), options).add(Reconciles::new(BaseTenants));
    let mut objects = manager.rbac(&namespace).unwrap();
    let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            // The kind has a finalizer: its cleanup guard, under which the deletion below runs,
            // the guard against a deletion in the foreground, and the one against deleting an
            // object that lost its finalizer.
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    // The namespace exists already (applied, it would be left as it is).
    objects.remove(0);
    // What `rbac` cannot know, as its output says: the example's RoleBindings grant `edit`,
    // which RBAC lets only an account holding every permission of `edit`, or allowed to
    // `bind` it, grant.
    let mut bind = rule("rbac.authorization.k8s.io", &["clusterroles"], &["bind"]);
    bind.resource_names = Some(vec!["edit".into()]);
    let rules = objects[1]["rules"]
        .as_array_mut()
        .expect("the ClusterRole's rules");
    rules.push(serde_json::to_value(bind).unwrap());
    create_all(&client, &namespace, objects).await;

    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(manager.run_until(async move {
        let _ = stopped.await;
    }));

    let tenant = unique_name("rbac");
    let tenants: Api<BaseTenant> = Api::all(client.clone());
    let spec = json!({"owners": ["alice"], "cpu": "1", "memory": "1Gi"});
    tenants
        .create(
            &PostParams::default(),
            &BaseTenant::new(&tenant, serde_json::from_value(spec).unwrap()),
        )
        .await
        .expect("create the BaseTenant");
    let ready = || async {
        let t = tenants.get(&tenant).await.map_err(|e| e.to_string())?;
        let status = t.status.clone().unwrap_or_default();
        let ready = (status.conditions.iter()).any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(()).ok_or(format!("{status:?}"))
    };
    eventually("the BaseTenant Ready", ready).await;

    // Drift: another manager takes the quota's CPU; it is repaired, and the Event written.
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &tenant);
    let drift = json!({"apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "quota"}, "spec": {"hard": {"requests.cpu": "7"}}});
    quotas
        .patch(
            "quota",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(drift),
        )
        .await
        .expect("the drift");
    eventually("the quota repaired", || async {
        let q = quotas.get("quota").await.map_err(|e| e.to_string())?;
        let cpu =
            (q.spec.and_then(|s| s.hard)).and_then(|h| h.get("requests.cpu").map(|v| v.0.clone()));
        (cpu.as_deref() == Some("1"))
            .then_some(())
            .ok_or(format!("{cpu:?}"))
    })
    .await;
    let events: Api<Event> = Api::all(client.clone());
    eventually("a DriftRepaired Event", || async {
        let list = events
            .list(&ListParams::default().fields(&format!("regarding.name={tenant}")))
            .await
            .map_err(|e| e.to_string())?;
        let reasons: Vec<String> = list.items.iter().filter_map(|e| e.reason.clone()).collect();
        (reasons.iter().any(|r| r == "DriftRepaired"))
            .then_some(())
            .ok_or(format!("{reasons:?}"))
    })
    .await;

    // Deleted: the manager takes its finalizer off.
    tenants
        .delete(&tenant, &DeleteParams::default())
        .await
        .expect("delete the BaseTenant");
    eventually("the BaseTenant gone", || async {
        match tenants.get_opt(&tenant).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    let text = idem_tests::metrics::scrape(metrics_addr)
        .await
        .expect("the manager's /metrics");
    let _ = stop.send(());
    let _ = tokio::time::timeout(TIMEOUT, task).await;
    assert_none_refused(&text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_manager_whose_kind_owns_no_namespaces_runs_on_the_rbac_it_prints() {
    use notes::{Note, Notes};
    let client = shared().client();
    let namespace = create_namespace(&client, "notes").await.unwrap();
    let name = unique_name("notes");
    let metrics_addr = free_addr();
    let options = ring_of_one_as(&namespace, &name, metrics_addr);
    let manager = Manager::new(name.clone(), options)
        .add(Reconciles::new(Notes))
        .installing_crds();
    let mut objects = manager.rbac(&namespace).unwrap();
    objects.retain(|o| o["kind"] != "Namespace");
    create_all(&client, &namespace, objects).await;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(manager.run_until(async move {
        let _ = stopped.await;
    }));

    // The manager installs the CRD; the note is created once the API server serves the kind.
    let notes: Api<Note> = Api::namespaced(client.clone(), &namespace);
    let note = Note::new("n", notes::NoteSpec { text: "x".into() });
    eventually("the Note created", || async {
        notes
            .create(&PostParams::default(), &note)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .await;
    eventually("the Note Ready", || async {
        let n = notes.get("n").await.map_err(|e| e.to_string())?;
        let status = n.status.clone().unwrap_or_default();
        let ready = (status.conditions.iter()).any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(()).ok_or(format!("{status:?}"))
    })
    .await;
    let text = idem_tests::metrics::scrape(metrics_addr)
        .await
        .expect("the manager's /metrics");
    let _ = stop.send(());
    let _ = tokio::time::timeout(TIMEOUT, task).await;
    assert_none_refused(&text);
    // The ring's probe of the server's shardSelector answered (1 or 0, not missing).
    assert!(
        text.lines()
            .any(|l| l.starts_with("idem_shard_server_side ")),
        "{text}"
    );
}
