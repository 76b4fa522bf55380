//! Create-once children against the real control plane: a `Vault` owns a Secret with a
//! generated password ([`DesiredChildren::create_once`]) and a ConfigMap holding a connection
//! URL made from it ([`Pass::ensure_once`]), reconciled by the [`Driver`] with watch caches as
//! a controller process keeps them.
//!
//! - 4 concurrent reconciles of one Vault agree on one password, in 5 of 5 rounds: the Secret
//!   is created once and never written afterwards (followed with a watch from before the race);
//! - labels changed by someone else (the Secret hidden from the label-selected cache): the
//!   value stays, the labels are put back (a `DriftRepaired` Event names them), and the next
//!   converged pass makes no request;
//! - deleted: `Stalled`, reason `ChildDeleted`, a Warning Event, no new Secret;
//! - deleted with `regenerate_deleted`: a new value, a Warning Event `Regenerated`;
//! - idem-tests' kit passes it, and fails a Vault that reads its Secret from the cache first
//!   and generates a password when it finds none (racing reconciles overwrite each other);
//! - a pass cut off by the driver's timeout after it created the Secret (before an apply, or in
//!   the middle of one) still records it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use idem_runtime::IdempotentResource;
use idem_runtime::apply::{CreatedChild, DesiredChildren, Labels, MANAGED_BY_LABEL};
use idem_runtime::controller::Action;
use idem_runtime::reconciler::{ChildKinds, Driver, Outcome, Pass, ReconcileError, Reconciler};
use idem_tests::kit::{BoxError, Check, Children, Kit, Subject};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::RwLock;

/// A database's credentials: a Secret with a generated password, and a ConfigMap with the
/// connection URL made from it.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "test.idem.dev",
    version = "v1",
    kind = "Vault",
    namespaced,
    status = "VaultStatus"
)]
#[idempotent(tenant = namespace, field_manager = "vault-controller")]
#[serde(rename_all = "camelCase")]
pub struct VaultSpec {
    /// A deleted Secret is created anew with a new password (else: `Stalled`).
    #[serde(default)]
    pub regenerate: bool,
}

/// The Vault's status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VaultStatus {
    /// The generation the conditions describe.
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling, Stalled.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The children its reconciles created.
    #[serde(default)]
    pub created_children: Vec<CreatedChild>,
}

fn secret_name(v: &Vault) -> String {
    format!("{}-password", v.name_any())
}

fn url_name(v: &Vault) -> String {
    format!("{}-url", v.name_any())
}

/// A Secret with a new random password.
fn generated() -> Secret {
    let password = format!("{:032x}", rand::random::<u128>());
    Secret {
        data: Some(BTreeMap::from([(
            "password".to_owned(),
            ByteString(password.into_bytes()),
        )])),
        ..Secret::default()
    }
}

fn password(secret: &Secret) -> String {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get("password"))
        .map(|b| b.0.clone())
        .unwrap_or_default();
    String::from_utf8(bytes).unwrap_or_default()
}

fn url_config(v: &Vault, secret: &Secret) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(url_name(v)),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "url".to_owned(),
            format!("postgres://app:{}@db", password(secret)),
        )])),
        ..ConfigMap::default()
    }
}

/// The Vault reconciler, creating its Secret once.
struct Vaults;

impl Reconciler for Vaults {
    type Resource = Vault;

    fn children() -> ChildKinds<Vault> {
        ChildKinds::new().owns::<Secret>().owns::<ConfigMap>()
    }

    async fn reconcile(
        &self,
        v: &Vault,
        pass: &mut Pass<Vault>,
    ) -> Result<Outcome<Vault>, ReconcileError> {
        let mut children = DesiredChildren::new();
        children.create_once::<Secret, _>(&secret_name(v), generated);
        if v.spec.regenerate {
            children.regenerate_deleted::<Secret>();
        }
        if let Some(secret) = pass
            .ensure_once::<Secret>(&children, &secret_name(v))
            .await?
        {
            children.add(&url_config(v, &secret))?;
        }
        let report = pass.apply(&children).await?;
        Ok(Outcome::new(report.readiness()))
    }

    fn child_record(status: &mut VaultStatus) -> Option<&mut Vec<CreatedChild>> {
        Some(&mut status.created_children)
    }
}

/// The Vault reconciler as the user first wrote it: the Secret read from the cache, a
/// new password generated when it is not there, applied like any child.
struct CacheFirstVaults;

impl Reconciler for CacheFirstVaults {
    type Resource = Vault;

    fn children() -> ChildKinds<Vault> {
        Vaults::children()
    }

    async fn reconcile(
        &self,
        v: &Vault,
        pass: &mut Pass<Vault>,
    ) -> Result<Outcome<Vault>, ReconcileError> {
        let cached = pass
            .caches()
            .and_then(|c| c.lookup::<Secret>(v.namespace().as_deref(), &secret_name(v)))
            .flatten();
        let mut secret = cached.unwrap_or_else(generated);
        secret.metadata = ObjectMeta {
            name: Some(secret_name(v)),
            ..ObjectMeta::default()
        };
        let mut children = DesiredChildren::new();
        children.add(&secret)?.add(&url_config(v, &secret))?;
        let report = pass.apply(&children).await?;
        Ok(Outcome::new(report.readiness()))
    }

    fn child_record(status: &mut VaultStatus) -> Option<&mut Vec<CreatedChild>> {
        Some(&mut status.created_children)
    }
}

/// Tests that count requests at the API server take this for writing, all others for reading.
static COUNTING: RwLock<()> = RwLock::const_new(());

const WAIT: Duration = Duration::from_secs(30);

async fn setup(prefix: &str) -> (Client, String) {
    let client = idem_tests::shared().client();
    idem_tests::install_crd(&client, &Vault::crd())
        .await
        .expect("install the Vault CRD");
    let ns = idem_tests::create_namespace(&client, prefix)
        .await
        .expect("namespace");
    (client, ns)
}

async fn create_vault(client: &Client, ns: &str, regenerate: bool) -> Arc<Vault> {
    let name = idem_tests::unique_name("v");
    let api: Api<Vault> = Api::namespaced(client.clone(), ns);
    Arc::new(
        api.create(
            &PostParams::default(),
            &Vault::new(&name, VaultSpec { regenerate }),
        )
        .await
        .expect("create the Vault"),
    )
}

async fn get_vault(client: &Client, v: &Vault) -> Arc<Vault> {
    let api: Api<Vault> = Api::namespaced(client.clone(), &v.namespace().unwrap());
    Arc::new(api.get(&v.name_any()).await.expect("get the Vault"))
}

fn condition(v: &Vault, type_: &str) -> Option<(String, String, String)> {
    v.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// One controller process: a driver reading Secrets and ConfigMaps from watch caches.
struct Session<R: Reconciler<Resource = Vault>> {
    driver: Driver<R>,
    client: Client,
    watches: Vec<tokio::task::JoinHandle<()>>,
}

impl<R: Reconciler<Resource = Vault>> Drop for Session<R> {
    fn drop(&mut self) {
        for w in &self.watches {
            w.abort();
        }
    }
}

async fn cache<K, R>(
    client: &Client,
    caches: &idem_runtime::apply::ChildCaches,
) -> Result<tokio::task::JoinHandle<()>, BoxError>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    R: Reconciler<Resource = Vault>,
{
    let (store, writer) = reflector::store::<K>();
    let config = Driver::<R>::children_config();
    let stream = reflector::reflector(writer, watcher(Api::<K>::all(client.clone()), config))
        .default_backoff()
        .for_each(|_| futures::future::ready(()));
    let task = tokio::spawn(stream);
    tokio::time::timeout(WAIT, store.wait_until_ready()).await??;
    caches.register(store);
    Ok(task)
}

async fn session<R: Reconciler<Resource = Vault>>(
    client: Client,
    reconciler: R,
) -> Result<Session<R>, BoxError> {
    let caches = idem_runtime::apply::ChildCaches::new();
    let watches = vec![
        cache::<Secret, R>(&client, &caches).await?,
        cache::<ConfigMap, R>(&client, &caches).await?,
    ];
    let driver = Driver::new(client.clone(), reconciler).with_caches(caches);
    Ok(Session {
        driver,
        client,
        watches,
    })
}

impl<R: Reconciler<Resource = Vault>> Session<R> {
    async fn reconcile(&self, v: &Arc<Vault>) -> Result<Action, ReconcileError> {
        self.driver
            .reconcile_once(self.client.clone(), Arc::clone(v))
            .await
    }

    /// The session's cache of the Vault's Secret (`None`: absent).
    fn cached_secret(&self, v: &Vault) -> Option<Secret> {
        self.driver
            .caches()
            .lookup::<Secret>(v.namespace().as_deref(), &secret_name(v))
            .flatten()
    }

    /// Reconciles until Ready (a pass that creates reconciles again on its children's events).
    async fn converge(&self, client: &Client, v: &Arc<Vault>) -> Arc<Vault> {
        let mut v = Arc::clone(v);
        for _ in 0..5 {
            self.reconcile(&v).await.expect("reconcile");
            v = get_vault(client, &v).await;
            if condition(&v, "Ready").is_some_and(|c| c.0 == "True") {
                return v;
            }
        }
        panic!("not Ready: {:?}", v.status);
    }
}

/// One watch event of a Secret: its type, uid, resourceVersion and password.
type Seen = (String, String, u64, String);

/// Every version of the Secrets of one namespace, watched from before the test's writes.
struct Versions {
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Drop for Versions {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Versions {
    async fn follow(client: &Client, ns: &str) -> Self {
        let api: Api<Secret> = Api::namespaced(client.clone(), ns);
        let listed = api
            .list_metadata(&ListParams::default())
            .await
            .expect("list");
        let from = listed.metadata.resource_version.unwrap_or_default();
        let mut stream = api
            .watch(&WatchParams::default(), &from)
            .await
            .expect("watch")
            .boxed();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let store = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Some(Ok(event)) = stream.next().await {
                let (what, s) = match event {
                    WatchEvent::Added(s) => ("ADDED", s),
                    WatchEvent::Modified(s) => ("MODIFIED", s),
                    WatchEvent::Deleted(s) => ("DELETED", s),
                    _ => continue,
                };
                let rv = s
                    .resource_version()
                    .unwrap_or_default()
                    .parse()
                    .unwrap_or(0);
                store.lock().unwrap().push((
                    what.to_owned(),
                    s.uid().unwrap_or_default(),
                    rv,
                    password(&s),
                ));
            }
        });
        Self { task, seen }
    }

    /// The versions seen, once the watch has delivered `secret`'s current version.
    async fn until(&self, secret: &Secret) -> Vec<Seen> {
        let rv: u64 = secret.resource_version().unwrap().parse().unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let seen = self.seen.lock().unwrap().clone();
            if seen.iter().any(|(_, _, at, _)| *at >= rv) {
                return seen;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "watch behind: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn owned_secrets(list: &[Secret], v: &Vault) -> Vec<Secret> {
    let uid = v.uid().unwrap();
    list.iter()
        .filter(|s| s.owner_references().iter().any(|r| r.uid == uid))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn four_concurrent_reconciles_agree_on_one_password_in_five_rounds() {
    let _guard = COUNTING.read().await;
    let (client, ns) = setup("once-race").await;
    let mut sessions = Vec::new();
    for _ in 0..4 {
        let s = session(idem_tests::shared().client(), Vaults)
            .await
            .expect("session");
        sessions.push(s);
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    for round in 1..=5 {
        let versions = Versions::follow(&client, &ns).await;
        let v = create_vault(&client, &ns, false).await;
        let results = futures::future::join_all(sessions.iter().map(|s| s.reconcile(&v))).await;
        for r in &results {
            assert!(r.is_ok(), "round {round}: {results:?}");
        }
        let all = secrets.list(&ListParams::default()).await.unwrap().items;
        let owned = owned_secrets(&all, &v);
        assert_eq!(owned.len(), 1, "round {round}: one Secret: {owned:?}");
        let secret = &owned[0];
        let value = password(secret);
        assert_eq!(value.len(), 32, "round {round}");
        let seen: Vec<_> = versions
            .until(secret)
            .await
            .into_iter()
            .filter(|(_, uid, _, _)| Some(uid) == secret.uid().as_ref())
            .collect();
        assert_eq!(
            seen.iter().filter(|(what, ..)| what == "ADDED").count(),
            1,
            "round {round}: created once: {seen:?}"
        );
        assert!(
            seen.iter().all(|(_, _, _, p)| *p == value),
            "round {round}: the password never changed after its creation: {seen:?}"
        );
        let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get(&url_name(&v))
            .await
            .expect("the URL ConfigMap");
        assert_eq!(
            cm.data.unwrap()["url"],
            format!("postgres://app:{value}@db"),
            "round {round}: every racer built the URL from the one password"
        );
        let stored = sessions[0].converge(&client, &v).await;
        let record = &stored.status.as_ref().unwrap().created_children;
        assert!(
            record
                .iter()
                .any(|c| Some(&c.uid) == secret.uid().as_ref() && c.kind == "Secret"),
            "round {round}: recorded: {record:?}"
        );
        assert_eq!(
            password(&secrets.get(&secret_name(&v)).await.unwrap()),
            value
        );
        eprintln!("round {round}: one password, created once, 4 racers agreed");
    }
}

/// Requests the API server counted on the resources these tests touch (every verb but WATCH,
/// which is counted when a watch ends).
async fn requests() -> u64 {
    let text = idem_tests::shared().metrics().await.expect("metrics");
    idem_tests::metrics::all_requests(&text)
        .iter()
        .filter(|c| c.verb != "WATCH")
        .filter(|c| {
            matches!(
                (c.group.as_str(), c.resource.as_str()),
                ("", "secrets" | "configmaps" | "events")
                    | ("events.k8s.io", "events")
                    | ("test.idem.dev", "vaults")
            )
        })
        .map(|c| c.count)
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_whose_labels_were_changed_keeps_its_password_and_gets_them_back() {
    let _guard = COUNTING.write().await;
    let (client, ns) = setup("once-labels").await;
    let s = session(client.clone(), Vaults).await.expect("session");
    let v = create_vault(&client, &ns, false).await;
    let v = s.converge(&client, &v).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let before = secrets.get(&secret_name(&v)).await.unwrap();
    let value = password(&before);
    let cm_before = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get(&url_name(&v))
        .await
        .unwrap();

    let counted = requests().await;
    assert_eq!(s.reconcile(&v).await.unwrap(), Action::await_change());
    assert_eq!(
        requests().await - counted,
        0,
        "a converged pass makes no request"
    );

    // Someone removes the label the caches select by and changes the owner's uid label: the
    // Secret leaves the label-selected cache.
    let owner_uid = Labels::of::<Vault>().owner_uid();
    let patch = serde_json::json!({"metadata": {"labels": {
        MANAGED_BY_LABEL: null, owner_uid: "someone-else"}}});
    secrets
        .patch(
            &secret_name(&v),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while s.cached_secret(&v).is_some() {
        assert!(tokio::time::Instant::now() < deadline, "still cached");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let v = get_vault(&client, &v).await;
    s.reconcile(&v).await.expect("reconcile");
    let after = secrets.get(&secret_name(&v)).await.unwrap();
    assert_eq!(after.uid(), before.uid(), "the same Secret");
    assert_eq!(password(&after), value, "the password was not regenerated");
    assert_eq!(
        after.labels().get(MANAGED_BY_LABEL).map(String::as_str),
        Some("vault-controller"),
        "its labels are back: {:?}",
        after.labels()
    );
    assert_eq!(after.labels().get(owner_uid), v.uid().as_ref());
    // Said as any child's repair is: one DriftRepaired naming the labels put back and who
    // changed them (the merge patch's manager), none before the change.
    let deadline = tokio::time::Instant::now() + WAIT;
    let repaired = loop {
        let found = events(&client, &v, "DriftRepaired").await;
        if !found.is_empty() {
            break found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no DriftRepaired Event"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(repaired.len(), 1, "{repaired:?}");
    let (type_, note) = &repaired[0];
    assert_eq!(type_, "Warning");
    assert!(
        note.contains(&format!(".metadata.labels.{MANAGED_BY_LABEL} removed"))
            && note.contains(&format!(".metadata.labels.{owner_uid} changed by "))
            && !note.contains("ownerReferences"),
        "{note}"
    );
    let cm_after = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get(&url_name(&v))
        .await
        .unwrap();
    assert_eq!(cm_after.resource_version(), cm_before.resource_version());
    let v = get_vault(&client, &v).await;
    assert_eq!(condition(&v, "Ready").unwrap().0, "True");

    // Back in the cache: a converged pass makes no request again.
    let deadline = tokio::time::Instant::now() + WAIT;
    let rv = |s: &Secret| s.resource_version().and_then(|rv| rv.parse::<u64>().ok());
    while s.cached_secret(&v).is_none_or(|c| rv(&c) < rv(&after)) {
        assert!(tokio::time::Instant::now() < deadline, "not cached again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let counted = requests().await;
    s.reconcile(&v).await.expect("reconcile");
    assert_eq!(
        requests().await - counted,
        0,
        "a converged pass after the repair makes no request"
    );
}

/// The Events about `v` with `reason`: `(type, note)`.
async fn events(client: &Client, v: &Vault, reason: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &v.namespace().unwrap());
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.uid.clone()) == v.uid()
                && e.reason.as_deref() == Some(reason)
        })
        .map(|e| (e.type_.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

async fn delete_secret<R: Reconciler<Resource = Vault>>(
    client: &Client,
    s: &Session<R>,
    v: &Vault,
) -> Secret {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &v.namespace().unwrap());
    let old = secrets.get(&secret_name(v)).await.unwrap();
    secrets
        .delete(&secret_name(v), &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while s.cached_secret(v).is_some() {
        assert!(tokio::time::Instant::now() < deadline, "still cached");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    old
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_secret_stalls_with_child_deleted_and_no_new_password() {
    let _guard = COUNTING.read().await;
    let (client, ns) = setup("once-deleted").await;
    let s = session(client.clone(), Vaults).await.expect("session");
    let v = create_vault(&client, &ns, false).await;
    let v = s.converge(&client, &v).await;
    let old = delete_secret(&client, &s, &v).await;

    let action = s.reconcile(&v).await.expect("a terminal error is handled");
    assert_eq!(
        action,
        Action::terminal(),
        "not retried until the Vault changes"
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    assert!(
        secrets.get_opt(&secret_name(&v)).await.unwrap().is_none(),
        "no new Secret"
    );
    let stored = get_vault(&client, &v).await;
    let (status, reason, message) = condition(&stored, "Stalled").expect("Stalled");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "ChildDeleted"));
    assert!(
        message.contains(&format!("Secret/{ns}/{}", secret_name(&v)))
            && message.contains("was deleted")
            && message.contains(old.uid().as_deref().unwrap()),
        "{message}"
    );
    let warnings = events(&client, &v, "ChildDeleted").await;
    assert!(
        warnings.iter().any(|(t, _)| t == "Warning"),
        "a Warning Event ChildDeleted: {warnings:?}"
    );
    // Again (a resync): still no Secret.
    s.reconcile(&stored).await.expect("handled");
    assert!(secrets.get_opt(&secret_name(&v)).await.unwrap().is_none());

    // The message's way back: the Secret restored from a backup with the owner's controller
    // ownerReference is not taken while the record names the old uid ...
    assert!(
        message.contains("status.createdChildren")
            && message.contains("--subresource=status")
            && message.contains("then annotate the owner"),
        "the message says how to restore it: {message}"
    );
    let mut restored = old.clone();
    restored.metadata = ObjectMeta {
        name: old.metadata.name.clone(),
        namespace: old.metadata.namespace.clone(),
        labels: old.metadata.labels.clone(),
        owner_references: old.metadata.owner_references.clone(),
        ..ObjectMeta::default()
    };
    let restored = secrets
        .create(&PostParams::default(), &restored)
        .await
        .expect("restore");
    s.reconcile(&get_vault(&client, &v).await)
        .await
        .expect("handled");
    let (_, reason, _) =
        condition(&*get_vault(&client, &v).await, "Stalled").expect("still Stalled");
    assert_eq!(
        reason, "ChildDeleted",
        "taken while the record names the old uid"
    );
    // ... and is, once the old uid's entry is removed from the record (a status write).
    let record = &stored.status.as_ref().unwrap().created_children;
    let index = record
        .iter()
        .position(|c| Some(&c.uid) == old.uid().as_ref())
        .expect("the old uid is recorded");
    Api::<Vault>::namespaced(client.clone(), &ns)
        .patch_status(
            &v.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(serde_json::json!([
                    {"op": "test", "path": format!("/status/createdChildren/{index}/uid"),
                        "value": old.uid()},
                    {"op": "remove", "path": format!("/status/createdChildren/{index}")}
                ]))
                .unwrap(),
            ),
        )
        .await
        .expect("remove the record's entry");
    let v = s.converge(&client, &get_vault(&client, &v).await).await;
    let live = secrets.get(&secret_name(&v)).await.unwrap();
    assert_eq!(
        live.uid(),
        restored.uid(),
        "the restored Secret is the child"
    );
    assert_eq!(password(&live), password(&old), "with the old password");
    let record = &v.status.as_ref().unwrap().created_children;
    assert!(
        record
            .iter()
            .any(|c| Some(&c.uid) == restored.uid().as_ref()),
        "recorded: {record:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_secret_of_an_opted_in_kind_gets_a_new_password_and_an_event() {
    let _guard = COUNTING.read().await;
    let (client, ns) = setup("once-regen").await;
    let s = session(client.clone(), Vaults).await.expect("session");
    let v = create_vault(&client, &ns, true).await;
    let v = s.converge(&client, &v).await;
    let old = delete_secret(&client, &s, &v).await;

    let v = s.converge(&client, &v).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let new = secrets.get(&secret_name(&v)).await.expect("a new Secret");
    assert_ne!(new.uid(), old.uid());
    assert_ne!(password(&new), password(&old), "a new password");
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get(&url_name(&v))
        .await
        .unwrap();
    assert_eq!(
        cm.data.unwrap()["url"],
        format!("postgres://app:{}@db", password(&new)),
        "the URL follows the new password"
    );
    let record = &v.status.as_ref().unwrap().created_children;
    assert!(record.iter().any(|c| Some(&c.uid) == new.uid().as_ref()));
    assert!(!record.iter().any(|c| Some(&c.uid) == old.uid().as_ref()));
    let regenerated = events(&client, &v, "Regenerated").await;
    assert!(
        regenerated
            .iter()
            .any(|(t, note)| t == "Warning" && note.contains(&secret_name(&v))),
        "{regenerated:?}"
    );
}

/// The Vault for idem-tests' kit, with reconciler `R`.
struct VaultSubject<R> {
    ns: String,
    reconciler: fn() -> R,
}

impl<R: Reconciler<Resource = Vault>> Subject for VaultSubject<R> {
    type Primary = Vault;
    type Session = Session<R>;

    fn primary(&self, name: &str) -> Vault {
        let mut v = Vault::new(name, VaultSpec { regenerate: false });
        v.metadata.namespace = Some(self.ns.clone());
        v
    }

    fn children(&self, _: &Vault) -> Children {
        Children::owned().kind::<Secret>().kind::<ConfigMap>()
    }

    fn label_names(&self) -> Labels {
        Labels::of::<Vault>()
    }

    async fn session(&self, client: Client) -> Result<Session<R>, BoxError> {
        session(client, (self.reconciler)()).await
    }

    async fn reconcile(&self, s: &Session<R>, v: Arc<Vault>) -> Result<(), BoxError> {
        s.reconcile(&v).await?;
        Ok(())
    }

    fn created_once(&self, child: &serde_json::Value) -> Vec<String> {
        // The password, and the URL made from it: both differ in every instance by design.
        match child.get("kind").and_then(serde_json::Value::as_str) {
            Some("Secret") => vec!["/data".to_owned()],
            Some("ConfigMap") => vec!["/data/url".to_owned()],
            _ => Vec::new(),
        }
    }

    fn settled(&self, v: &Vault) -> bool {
        condition(v, "Ready").is_some_and(|c| c.0 == "True")
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kit_passes_a_create_once_secret_and_fails_one_read_from_the_cache_first() {
    let _guard = COUNTING.read().await;
    let (_, ns) = setup("once-kit").await;
    let subject = VaultSubject {
        ns: ns.clone(),
        reconciler: || Vaults,
    };
    let report = Kit::new(idem_tests::shared(), subject)
        .run_all()
        .await
        .expect("the kit runs");
    eprintln!("create once:\n{report}");
    report.assert_idempotent();

    let racy = VaultSubject {
        ns,
        reconciler: || CacheFirstVaults,
    };
    let report = Kit::new(idem_tests::shared(), racy)
        .checks(&[Check::Repeat, Check::Race])
        .run_all()
        .await
        .expect("the kit runs");
    eprintln!("cache first:\n{report}");
    assert!(
        !report.caught(Check::Repeat),
        "serially it converges\n{report}"
    );
    assert!(report.caught(Check::Race), "{report}");
    let evidence = report.get(Check::Race).unwrap().evidence.join("\n");
    assert!(
        evidence.contains("is created once, yet changed after its creation"),
        "{evidence}"
    );
}

/// The Vault's URL ConfigMap's `url`, as stored.
async fn stored_url(client: &Client, v: &Vault) -> String {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &v.namespace().unwrap());
    api.get(&url_name(v))
        .await
        .unwrap()
        .data
        .and_then(|d| d.get("url").cloned())
        .unwrap_or_default()
}

/// A Secret at the Vault's create-once name with a password the attacker knows, carrying the
/// Vault's controller ownerReference and labels (all visible to anyone who can read the Vault
/// or its old Secret, and writable by anyone who may create Secrets in the namespace).
fn forged_secret(v: &Vault, labels: Option<BTreeMap<String, String>>) -> Secret {
    let mut s = Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(v)),
            labels,
            owner_references: Some(vec![v.controller_owner_ref(&()).unwrap()]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "password".to_owned(),
            ByteString(b"known-to-the-attacker".to_vec()),
        )])),
        ..Secret::default()
    };
    s.metadata.namespace = v.namespace();
    s
}

/// The recorded Secret is deleted and replaced by one with a known password that copies the
/// Vault's controller ownerReference and labels: another object at the recorded child's name
/// is `ChildDeleted` whatever it claims — a value the users of the old one do not know is never
/// taken silently — and the connection URL keeps the old password.
#[tokio::test(flavor = "multi_thread")]
async fn a_replaced_secret_copying_the_owner_reference_is_child_deleted() {
    let _guard = COUNTING.read().await;
    let (client, ns) = setup("once-forged").await;
    let s = session(client.clone(), Vaults).await.expect("session");
    let v = create_vault(&client, &ns, false).await;
    let v = s.converge(&client, &v).await;
    let url_before = stored_url(&client, &v).await;
    let old = delete_secret(&client, &s, &v).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let forged = secrets
        .create(
            &PostParams::default(),
            &forged_secret(&v, old.metadata.labels.clone()),
        )
        .await
        .expect("create the forged Secret");
    let deadline = tokio::time::Instant::now() + WAIT;
    while s.cached_secret(&v).and_then(|c| c.uid()) != forged.uid() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "forged Secret not cached"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let action = s.reconcile(&v).await;
    let stored = get_vault(&client, &v).await;
    let url_after = stored_url(&client, &v).await;
    let record: Vec<String> = stored
        .status
        .as_ref()
        .map(|st| st.created_children.iter().map(|c| c.uid.clone()).collect())
        .unwrap_or_default();
    eprintln!(
        "action {action:?}\nReady {:?}\nStalled {:?}\nurl before {url_before}\nurl after  {url_after}\nrecord {record:?} (old uid {:?}, forged uid {:?})",
        condition(&stored, "Ready"),
        condition(&stored, "Stalled"),
        old.uid(),
        forged.uid()
    );
    let (status, reason, _) = condition(&stored, "Stalled").unwrap_or_default();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ChildDeleted"),
        "a replaced create-once Secret with a copied ownerReference was taken silently"
    );
    assert_eq!(
        url_before, url_after,
        "the URL was rebuilt from the forged password"
    );
}

/// A Vault reconciler that makes its Secret and then never finishes (a stuck request, a slow
/// webhook after it).
struct StuckVaults;

impl Reconciler for StuckVaults {
    type Resource = Vault;

    fn children() -> ChildKinds<Vault> {
        Vaults::children()
    }

    async fn reconcile(
        &self,
        v: &Vault,
        pass: &mut Pass<Vault>,
    ) -> Result<Outcome<Vault>, ReconcileError> {
        let mut children = DesiredChildren::new();
        children.create_once::<Secret, _>(&secret_name(v), generated);
        pass.ensure_once::<Secret>(&children, &secret_name(v))
            .await?;
        std::future::pending().await
    }

    fn child_record(status: &mut VaultStatus) -> Option<&mut Vec<CreatedChild>> {
        Vaults::child_record(status)
    }
}

/// A pass cut off by the driver's timeout after it created a child still records it: the
/// next pass takes that Secret as the one created once (not a `ChildDeleted` if it were
/// gone, not an unrecorded object never pruned).
#[tokio::test]
async fn a_pass_cut_off_by_the_timeout_records_the_child_it_created() {
    let (client, ns) = setup("once-timeout").await;
    let v = create_vault(&client, &ns, false).await;
    let driver = Driver::new(client.clone(), StuckVaults).with_config(
        idem_runtime::reconciler::DriverConfig {
            timeout: Some(Duration::from_secs(2)),
            ..Default::default()
        },
    );
    let result = driver.reconcile_once(client.clone(), Arc::clone(&v)).await;
    assert!(
        matches!(result, Err(ReconcileError::Timeout(_))),
        "{result:?}"
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let secret = secrets
        .get(&secret_name(&v))
        .await
        .expect("the Secret made");
    let stored = get_vault(&client, &v).await;
    let recorded: Vec<String> = stored
        .status
        .as_ref()
        .map(|s| s.created_children.iter().map(|c| c.uid.clone()).collect())
        .unwrap_or_default();
    assert_eq!(recorded, vec![secret.uid().unwrap()], "{:?}", stored.status);
}

/// A client whose ConfigMap creates never get an answer (a request stuck on the wire); every
/// other request goes through.
#[derive(Clone)]
struct StallConfigMapCreates(Client);

impl tower::Service<http::Request<kube::client::Body>> for StallConfigMapCreates {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, kube::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), kube::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move {
            if request.method() == http::Method::POST
                && request.uri().path().ends_with("/configmaps")
            {
                std::future::pending::<()>().await;
            }
            client.send(request).await
        })
    }
}

/// A Vault reconciler applying a plain Secret and its URL ConfigMap in one apply.
struct OneApplyVaults;

impl Reconciler for OneApplyVaults {
    type Resource = Vault;

    fn children() -> ChildKinds<Vault> {
        Vaults::children()
    }

    async fn reconcile(
        &self,
        v: &Vault,
        pass: &mut Pass<Vault>,
    ) -> Result<Outcome<Vault>, ReconcileError> {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(secret_name(v)),
                ..ObjectMeta::default()
            },
            ..generated()
        };
        let mut children = DesiredChildren::new();
        children.add(&secret)?.add(&url_config(v, &secret))?;
        let report = pass.apply(&children).await?;
        Ok(Outcome::new(report.readiness()))
    }

    fn child_record(status: &mut VaultStatus) -> Option<&mut Vec<CreatedChild>> {
        Vaults::child_record(status)
    }
}

/// A pass cut off by the timeout in the middle of an apply (its ConfigMap's create never
/// answered) still records the Secret that apply had created.
#[tokio::test]
async fn a_pass_cut_off_in_the_middle_of_an_apply_records_what_it_created() {
    let (client, ns) = setup("once-timeout-apply").await;
    let v = create_vault(&client, &ns, false).await;
    let stalling = Client::new(StallConfigMapCreates(client.clone()), ns.clone());
    let driver = Driver::new(stalling.clone(), OneApplyVaults).with_config(
        idem_runtime::reconciler::DriverConfig {
            timeout: Some(Duration::from_secs(3)),
            ..Default::default()
        },
    );
    let result = driver.reconcile_once(stalling, Arc::clone(&v)).await;
    assert!(
        matches!(result, Err(ReconcileError::Timeout(_))),
        "{result:?}"
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let secret = secrets
        .get(&secret_name(&v))
        .await
        .expect("the Secret made");
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    assert!(configs.get_opt(&url_name(&v)).await.unwrap().is_none());
    let stored = get_vault(&client, &v).await;
    let recorded: Vec<String> = stored
        .status
        .as_ref()
        .map(|s| s.created_children.iter().map(|c| c.uid.clone()).collect())
        .unwrap_or_default();
    assert_eq!(recorded, vec![secret.uid().unwrap()], "{:?}", stored.status);
}
