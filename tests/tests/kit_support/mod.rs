//! A small resource for the kit's own tests: a namespaced `Widget` whose `spec.items` become
//! one ConfigMap child each, reconciled by a correct reconcile (read from a watch cache,
//! server-side apply when different, children of items no longer desired deleted — those its
//! cache shows and those this session created —, status only when changed) or by one with a
//! deliberate [`Flaw`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use idem_tests::kit::{BoxError, Children, Subject};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A failure [`Flaw::ConflictIsFatal`] does not retry.
#[derive(Debug, thiserror::Error)]
#[error("permanent failure: {0}")]
struct Fatal(String);

/// Label on every child: the Widget's name.
pub const WIDGET_LABEL: &str = "kit.idem.dev/widget";
/// Label on every child: its item key.
pub const ITEM_LABEL: &str = "kit.idem.dev/item";
/// The reconcile's field manager.
pub const MANAGER: &str = "widget-controller";

/// Desired state: one ConfigMap `<widget>-<key>` with `data.value = <value>` per item.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(
    group = "kit.idem.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
pub struct WidgetSpec {
    /// Item key → value.
    pub items: BTreeMap<String, String>,
}

/// Observed state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WidgetStatus {
    /// `Created`, `Ready` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The error of a failed reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When `phase` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The children it created ([`Flaw::StaleRecord`] only), by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<Vec<String>>,
    /// `Stalled` ([`Flaw::StallsQuietly`] only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// What is wrong with a reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// Nothing: the correct reconcile.
    None,
    /// Creates the children with POST once, remembering in `status.phase` that it did; a
    /// create that meets AlreadyExists fails the reconcile (and is recorded as `Failed`).
    PostOnce,
    /// Writes status on every pass, with a new `lastTransitionTime`.
    StatusEveryPass,
    /// Appends an entry to a list in each child on every pass.
    AppendsToList,
    /// Creates a missing child (looked up by label) under a random name.
    RandomName,
    /// Creates missing children but never repairs existing ones.
    NoRepair,
    /// Repairs a child by replacing it whole (PUT), dropping fields others set.
    ReplacesWhole,
    /// Takes a 409 Conflict for a permanent failure: records `Failed` and stops for good.
    ConflictIsFatal,
    /// After a failed pass, applies every child again instead of only what differs.
    RedoAllAfterError,
    /// Creates the children with POST on every pass; AlreadyExists fails the reconcile: it
    /// never converges, even without faults.
    PostAlways,
    /// Not a flaw: applies every child on every pass (forced server-side apply, a no-op on
    /// the server once converged) instead of reading a cache: correct, but not free.
    BlindApply,
    /// Not a flaw: records a failed pass's error in status (one more write per fault).
    ErrorInStatus,
    /// Never says it is done ([`Subject::settled`] is always false).
    NeverSettles,
    /// Makes its children, then says `Stalled=True` for the generation (once) and is never
    /// done: what a resource does with input it cannot act on.
    StallsQuietly,
    /// Never returns from a reconcile.
    Hangs,
    /// Not a flaw: also a child `<widget>-secret` whose value is generated when it is created
    /// (POST; on AlreadyExists it takes what is there), never written again but for its labels.
    GeneratedOnce,
    /// Also a child `<widget>-secret` with a generated value, read from the cache first and
    /// applied (forced) with a new value when the cache has none: racing reconciles write over
    /// each other's value.
    GeneratedRacy,
    /// Deletes only the children its record in `status.created` names, and writes that record
    /// whole from the object it was handed (plus what it created, minus what it deleted): a
    /// pass handed an object older than the last status write drops entries, and their
    /// children are never deleted.
    StaleRecord,
}

/// The item label of the generated child ([`Flaw::GeneratedOnce`], [`Flaw::GeneratedRacy`]).
pub const GENERATED_ITEM: &str = "generated";

/// The Widget resource with one [`Flaw`], in namespace `ns`.
pub struct Widgets {
    /// Namespace of the widgets and their children.
    pub ns: String,
    /// The reconcile's flaw.
    pub flaw: Flaw,
    /// How many items (children) a widget has.
    pub items: usize,
}

/// A session: a client and a watch cache of the namespace's children.
pub struct Cache {
    client: Client,
    store: Store<ConfigMap>,
    task: tokio::task::JoinHandle<()>,
    /// The last pass failed ([`Flaw::RedoAllAfterError`]).
    failed: AtomicBool,
    /// Names of the children this session created (its cache may not show them yet).
    created: Mutex<BTreeSet<String>>,
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Installs the Widget CRD and makes a namespace for one test; widgets have `items` items.
pub async fn setup(flaw: Flaw, items: usize) -> Widgets {
    let client = idem_tests::shared().client();
    idem_tests::install_crd(&client, &Widget::crd())
        .await
        .unwrap();
    let ns = idem_tests::create_namespace(&client, "kit").await.unwrap();
    Widgets { ns, flaw, items }
}

/// Seconds since the epoch with nanoseconds: every pass gets a different time.
fn now() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    format!("{}.{:09}", d.as_secs(), d.subsec_nanos())
}

fn child(w: &Widget, key: &str, value: &str, name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: w.namespace(),
            labels: Some(BTreeMap::from([
                (WIDGET_LABEL.to_owned(), w.name_any()),
                (ITEM_LABEL.to_owned(), key.to_owned()),
            ])),
            owner_references: Some(vec![owner(w)]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("value".to_owned(), value.to_owned())])),
        ..ConfigMap::default()
    }
}

fn owner(w: &Widget) -> OwnerReference {
    w.controller_owner_ref(&())
        .expect("a widget read from the API has a uid")
}

/// Whether `actual` has every label, the data and the owner reference of `desired`.
fn matches(actual: &ConfigMap, desired: &ConfigMap) -> bool {
    let labels = actual.labels();
    desired
        .labels()
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
        && actual.data == desired.data
        && desired
            .owner_references()
            .iter()
            .all(|o| actual.owner_references().contains(o))
}

impl Widgets {
    async fn write_status(
        &self,
        c: &Cache,
        w: &Widget,
        phase: &str,
        message: Option<String>,
        always: bool,
    ) -> Result<(), BoxError> {
        self.write_status_recording(c, w, phase, message, always, None)
            .await
    }

    /// As `write_status`, with `status.created` set to `record` when given.
    async fn write_status_recording(
        &self,
        c: &Cache,
        w: &Widget,
        phase: &str,
        message: Option<String>,
        always: bool,
        record: Option<Vec<String>>,
    ) -> Result<(), BoxError> {
        let old = w.status.clone().unwrap_or_default();
        let same_phase = old.phase.as_deref() == Some(phase);
        let status = WidgetStatus {
            phase: Some(phase.to_owned()),
            message,
            observed_generation: w.metadata.generation,
            last_transition_time: if same_phase && !always {
                old.last_transition_time.clone()
            } else {
                Some(now())
            },
            created: record.or_else(|| old.created.clone()),
            conditions: old.conditions.clone(),
        };
        if status == old && !always {
            return Ok(());
        }
        let api: Api<Widget> = Api::namespaced(c.client.clone(), &self.ns);
        let mut patch = serde_json::json!({"status": status});
        // A merge patch removes a field only when told so: clear an earlier error.
        if status.message.is_none() {
            patch["status"]["message"] = serde_json::Value::Null;
        }
        api.patch_status(
            &w.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        Ok(())
    }

    /// [`Flaw::StallsQuietly`]'s status: `Stalled=True` for the generation, written once.
    async fn write_stalled(&self, c: &Cache, w: &Widget) -> Result<(), BoxError> {
        let old = w.status.clone().unwrap_or_default();
        if old.observed_generation == w.metadata.generation && old.conditions.is_some() {
            return Ok(());
        }
        let stalled = serde_json::json!({"type": "Stalled", "status": "True",
            "reason": "CannotBeDone", "message": "the widget asks for what cannot be",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": w.metadata.generation});
        let patch = serde_json::json!({"status": {"phase": "Stalled",
            "observedGeneration": w.metadata.generation, "conditions": [stalled]}});
        Api::<Widget>::namespaced(c.client.clone(), &self.ns)
            .patch_status(
                &w.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(())
    }

    /// The child with a generated value, first (so that racers reach it together).
    async fn generated(&self, c: &Cache, w: &Widget) -> Result<(), BoxError> {
        let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &self.ns);
        let apply = PatchParams::apply(MANAGER).force();
        let name = format!("{}-secret", w.name_any());
        let cached = c.store.get(&ObjectRef::new(&name).within(&self.ns));
        let fresh = || format!("{:016x}", rand::random::<u64>());
        match (self.flaw, cached) {
            (Flaw::GeneratedRacy, None) => {
                let desired = child(w, GENERATED_ITEM, &fresh(), &name);
                api.patch(&name, &apply, &Patch::Apply(&desired)).await?;
            }
            (Flaw::GeneratedRacy, Some(cur)) => {
                let value = cur.data.as_ref().and_then(|d| d.get("value")).cloned();
                let desired = child(w, GENERATED_ITEM, &value.unwrap_or_else(fresh), &name);
                if !matches(&cur, &desired) {
                    api.patch(&name, &apply, &Patch::Apply(&desired)).await?;
                }
            }
            (_, None) => {
                let desired = child(w, GENERATED_ITEM, &fresh(), &name);
                match api.create(&PostParams::default(), &desired).await {
                    Err(kube::Error::Api(e)) if e.reason == "AlreadyExists" => {}
                    other => {
                        other?;
                    }
                }
            }
            (_, Some(cur)) => {
                // Only the labels and the owner reference are kept up to date.
                let mut desired = child(w, GENERATED_ITEM, "", &name);
                desired.data = None;
                let mut have = (*cur).clone();
                have.data = None;
                if !matches(&have, &desired) {
                    api.patch(&name, &apply, &Patch::Apply(&desired)).await?;
                }
            }
        }
        Ok(())
    }

    /// Applies the children; returns the names of those it created (not in its cache).
    async fn reconcile_children(&self, c: &Cache, w: &Widget) -> Result<Vec<String>, BoxError> {
        let mut made = Vec::new();
        if matches!(self.flaw, Flaw::GeneratedOnce | Flaw::GeneratedRacy) {
            self.generated(c, w).await?;
        }
        let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &self.ns);
        let apply = PatchParams::apply(MANAGER).force();
        let redo = self.flaw == Flaw::RedoAllAfterError && c.failed.swap(false, Ordering::SeqCst);
        for (key, value) in &w.spec.items {
            let name = format!("{}-{key}", w.name_any());
            let mut desired = child(w, key, value, &name);
            let cached = c.store.get(&ObjectRef::new(&name).within(&self.ns));
            match self.flaw {
                Flaw::AppendsToList => {
                    let log = cached
                        .as_ref()
                        .and_then(|c| c.data.as_ref()?.get("log").cloned())
                        .unwrap_or_default();
                    let data = desired.data.get_or_insert_default();
                    data.insert("log".into(), format!("{log}reconciled;"));
                }
                Flaw::RandomName => {
                    let exists = c.store.state().iter().any(|cm| {
                        cm.labels().get(WIDGET_LABEL) == Some(&w.name_any())
                            && cm.labels().get(ITEM_LABEL) == Some(key)
                    });
                    if !exists {
                        let suffix: u32 = rand::random::<u32>() % 100_000;
                        desired.metadata.name = Some(format!("{name}-{suffix:05}"));
                        api.create(&PostParams::default(), &desired).await?;
                    }
                    continue;
                }
                Flaw::NoRepair if cached.is_some() => continue,
                Flaw::ReplacesWhole => {
                    match cached {
                        None => {
                            api.create(&PostParams::default(), &desired).await?;
                        }
                        Some(cur) if !matches(&cur, &desired) => {
                            desired.metadata.resource_version = cur.resource_version();
                            api.replace(&name, &PostParams::default(), &desired).await?;
                        }
                        Some(_) => {}
                    }
                    continue;
                }
                _ => {}
            }
            let blind = self.flaw == Flaw::BlindApply;
            let absent = cached.is_none();
            if !redo && !blind && cached.is_some_and(|cur| matches(&cur, &desired)) {
                continue;
            }
            match api.patch(&name, &apply, &Patch::Apply(&desired)).await {
                Err(kube::Error::Api(e)) if e.code == 409 && self.flaw == Flaw::ConflictIsFatal => {
                    return Err(Fatal(e.message).into());
                }
                Err(e) => {
                    c.failed.store(true, Ordering::SeqCst);
                    return Err(e.into());
                }
                Ok(_) => {}
            }
            if absent {
                c.created.lock().unwrap().insert(name.clone());
                made.push(name);
            }
        }
        Ok(made)
    }

    /// The names of the children `w` desires.
    fn desired_names(w: &Widget) -> BTreeSet<String> {
        w.spec
            .items
            .keys()
            .map(|key| format!("{}-{key}", w.name_any()))
            .collect()
    }

    /// Deletes `name` (already gone is fine).
    async fn delete(&self, c: &Cache, name: &str) -> Result<(), BoxError> {
        let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &self.ns);
        match api.delete(name, &Default::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the children of items no longer desired: those the cache shows and those this
    /// session created (which the cache may not show yet).
    async fn prune_known(&self, c: &Cache, w: &Widget) -> Result<(), BoxError> {
        let desired = Self::desired_names(w);
        let mut known: BTreeSet<String> = c
            .store
            .state()
            .iter()
            .filter(|cm| {
                cm.labels().get(WIDGET_LABEL) == Some(&w.name_any())
                    && cm.metadata.deletion_timestamp.is_none()
            })
            .map(|cm| cm.name_any())
            .collect();
        let prefix = format!("{}-", w.name_any());
        known.extend(
            c.created
                .lock()
                .unwrap()
                .iter()
                .filter(|n| n.starts_with(&prefix))
                .cloned(),
        );
        for name in known.difference(&desired) {
            self.delete(c, name).await?;
            c.created.lock().unwrap().remove(name);
        }
        Ok(())
    }

    /// [`Flaw::StaleRecord`]: deletes the undesired children the record of the object handed
    /// to the pass names (plus those this pass created); returns the record to write.
    async fn prune_recorded(
        &self,
        c: &Cache,
        w: &Widget,
        made: Vec<String>,
    ) -> Result<Vec<String>, BoxError> {
        let desired = Self::desired_names(w);
        let mut record: BTreeSet<String> = w
            .status
            .as_ref()
            .and_then(|s| s.created.clone())
            .unwrap_or_default()
            .into_iter()
            .chain(made)
            .collect();
        for name in record.clone().difference(&desired) {
            self.delete(c, name).await?;
            record.remove(name);
        }
        Ok(record.into_iter().collect())
    }

    async fn post_once(&self, c: &Cache, w: &Widget) -> Result<(), BoxError> {
        if self.flaw == Flaw::PostOnce
            && w.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Created")
        {
            return Ok(());
        }
        let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &self.ns);
        for (key, value) in &w.spec.items {
            let name = format!("{}-{key}", w.name_any());
            if let Err(e) = api
                .create(&PostParams::default(), &child(w, key, value, &name))
                .await
            {
                self.write_status(c, w, "Failed", Some(e.to_string()), false)
                    .await?;
                return Err(e.into());
            }
        }
        self.write_status(c, w, "Created", None, false).await
    }
}

impl Subject for Widgets {
    type Primary = Widget;
    type Session = Cache;

    fn primary(&self, name: &str) -> Widget {
        let mut w = Widget::new(
            name,
            WidgetSpec {
                items: BTreeMap::new(),
            },
        );
        w.metadata.namespace = Some(self.ns.clone());
        w.spec.items = (0..self.items)
            .map(|i| (format!("i{i}"), i.to_string()))
            .collect();
        w
    }

    fn children(&self, primary: &Widget) -> Children {
        Children::labelled(format!("{WIDGET_LABEL}={}", primary.name_any())).kind::<ConfigMap>()
    }

    async fn session(&self, client: Client) -> Result<Cache, BoxError> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &self.ns);
        let (store, writer) = reflector::store();
        let watched = api.clone();
        let stream = reflector::reflector(
            writer,
            watcher(watched, watcher::Config::default().labels(WIDGET_LABEL)),
        )
        .applied_objects()
        .for_each(|_| futures::future::ready(()));
        let task = tokio::spawn(stream);
        tokio::time::timeout(Duration::from_secs(30), store.wait_until_ready()).await??;
        if self.flaw == Flaw::ErrorInStatus {
            // The watch is up (its request sent) before the session returns, so that the next
            // request through this client is the reconcile's: a marker must come through it.
            let marker = format!("session-{}", rand::random::<u32>());
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(marker.clone());
            cm.metadata.labels = Some(BTreeMap::from([(WIDGET_LABEL.to_owned(), marker.clone())]));
            api.create(&PostParams::default(), &cm).await?;
            let seen = ObjectRef::new(&marker).within(&self.ns);
            tokio::time::timeout(Duration::from_secs(30), async {
                while store.get(&seen).is_none() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await?;
            api.delete(&marker, &Default::default()).await?;
        }
        Ok(Cache {
            client,
            store,
            task,
            failed: AtomicBool::new(false),
            created: Mutex::new(BTreeSet::new()),
        })
    }

    fn created_once(&self, child: &serde_json::Value) -> Vec<String> {
        let item = child.pointer(&format!(
            "/metadata/labels/{}",
            ITEM_LABEL.replace('/', "~1")
        ));
        if item.and_then(serde_json::Value::as_str) == Some(GENERATED_ITEM) {
            vec!["/data".to_owned()]
        } else {
            Vec::new()
        }
    }

    fn settled(&self, _w: &Widget) -> bool {
        !matches!(self.flaw, Flaw::NeverSettles | Flaw::StallsQuietly)
    }

    async fn reconcile(&self, c: &Cache, w: Arc<Widget>) -> Result<(), BoxError> {
        if self.flaw == Flaw::Hangs {
            std::future::pending::<()>().await;
        }
        if matches!(self.flaw, Flaw::PostOnce | Flaw::PostAlways) {
            return self.post_once(c, &w).await;
        }
        let phase = w.status.as_ref().and_then(|s| s.phase.as_deref());
        if self.flaw == Flaw::ConflictIsFatal && phase == Some("Failed") {
            return Ok(()); // "needs a human"
        }
        let made = match self.reconcile_children(c, &w).await {
            Err(e) if e.is::<Fatal>() => {
                return self
                    .write_status(c, &w, "Failed", Some(e.to_string()), false)
                    .await;
            }
            Err(e) if self.flaw == Flaw::ErrorInStatus => {
                self.write_status(c, &w, "Failed", Some(e.to_string()), false)
                    .await?;
                return Err(e);
            }
            other => other?,
        };
        let record = match self.flaw {
            Flaw::None => {
                self.prune_known(c, &w).await?;
                None
            }
            Flaw::StaleRecord => Some(self.prune_recorded(c, &w, made).await?),
            _ => None,
        };
        if self.flaw == Flaw::StallsQuietly {
            return self.write_stalled(c, &w).await;
        }
        let always = self.flaw == Flaw::StatusEveryPass;
        self.write_status_recording(c, &w, "Ready", None, always, record)
            .await
    }

    fn flipped(&self, w: &Widget) -> Option<Widget> {
        let mut flipped = w.clone();
        flipped
            .spec
            .items
            .insert(format!("i{}", self.items), "flipped".into());
        Some(flipped)
    }
}
