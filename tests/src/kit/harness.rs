//! What every check needs: fresh instances of the primary object, sessions on the kit's
//! counted clients, single passes, convergence, end-state snapshots and clean-up.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::{Client, Resource, ResourceExt};

use idem_runtime::apply::Labels;

use super::identity::Identity;
use super::probe::{ABORTED, Probe, Sent};
use super::state::{EndState, key};
use super::{Error, Options, Subject};
use crate::ControlPlane;

/// One instance of the primary object, made by the kit.
#[derive(Clone, Debug)]
pub(crate) struct Instance {
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    pub(crate) uid: String,
}

/// One reconcile pass as the kit's client saw it.
#[derive(Clone, Debug)]
pub(crate) struct Pass {
    /// The requests it made, in order.
    pub(crate) sent: Vec<Sent>,
    /// `Err` with the error (or why the kit stopped it).
    pub(crate) result: Result<(), String>,
}

impl Pass {
    pub(crate) fn writes(&self) -> usize {
        self.sent.iter().filter(|s| s.is_write()).count()
    }
}

/// How an instance converged.
#[derive(Clone, Debug, Default)]
pub(crate) struct Convergence {
    /// Every pass, the last one included.
    pub(crate) passes: Vec<Pass>,
    /// Converged only in the sense that passes stopped changing the end state while still
    /// writing (no pass without writes).
    pub(crate) kept_writing: bool,
}

impl Convergence {
    /// Requests of all passes.
    pub(crate) fn requests(&self) -> usize {
        self.passes.iter().map(|p| p.sent.len()).sum()
    }
}

/// The instance converged from scratch with a clean client, whose session stays open.
pub(crate) struct Reference<S: Subject> {
    pub(crate) instance: Instance,
    pub(crate) probe: Arc<Probe>,
    pub(crate) session: S::Session,
    pub(crate) convergence: Convergence,
    /// Its end state, anonymised ([`EndState::anonymized`]).
    pub(crate) state: EndState,
    /// Requests the API server carried out for the kit's user while it converged.
    pub(crate) server_requests: u64,
    /// The kinds of its children with created-once values ([`Subject::created_once`]).
    pub(crate) once_kinds: Vec<ApiResource>,
}

/// Equal end states after this many passes in a row that wrote count as converged.
const STABLE_PASSES: usize = 3;

/// How long passes that write nothing must leave the primary with the same `Stalled`
/// condition before a convergence stops waiting for it to settle: a condition that clears by
/// itself (a Deployment's `ReplicaFailure` once its quota's status is filled) clears sooner.
pub(crate) const STALLED_GRACE: Duration = Duration::from_secs(10);

/// Where a convergence's wait for [`Subject::settled`] ended.
pub(crate) enum Settle {
    /// Settled after a pass without writes.
    Settled,
    /// [`Options::settle_timeout`] passed (or the probe tripped).
    TimedOut,
    /// Passes without writes left it with the same `Stalled` condition for [`STALLED_GRACE`].
    Stalled,
}

pub(crate) struct Harness<'a, S: Subject> {
    pub(crate) cp: &'a ControlPlane,
    pub(crate) subject: &'a S,
    pub(crate) options: &'a Options,
    pub(crate) admin: Client,
    pub(crate) identity: Identity,
    primary: ApiResource,
    instances: Mutex<Vec<Instance>>,
}

fn setup(what: &str) -> impl Fn(kube::Error) -> Error + '_ {
    move |e| Error::Setup(format!("{what}: {e}"))
}

impl<'a, S: Subject> Harness<'a, S> {
    pub(crate) async fn new(
        cp: &'a ControlPlane,
        subject: &'a S,
        options: &'a Options,
    ) -> Result<Self, Error> {
        let admin = cp.client();
        let identity = Identity::create(cp, &admin).await?;
        Ok(Self {
            cp,
            subject,
            options,
            admin,
            identity,
            primary: ApiResource::erase::<S::Primary>(&()),
            instances: Mutex::new(Vec::new()),
        })
    }

    fn api(&self, namespace: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
        match namespace {
            Some(ns) => Api::namespaced_with(self.admin.clone(), ns, ar),
            None => Api::all_with(self.admin.clone(), ar),
        }
    }

    /// Creates a fresh instance of the primary object (admin client, not counted).
    pub(crate) async fn instance(&self) -> Result<Instance, Error> {
        let name = crate::unique_name("kit");
        let mut primary = self.subject.primary(&name);
        primary.meta_mut().name = Some(name.clone());
        let namespace = primary.meta().namespace.clone();
        let mut value = serde_json::to_value(&primary).map_err(|e| Error::Setup(e.to_string()))?;
        value["apiVersion"] = S::Primary::api_version(&()).into_owned().into();
        value["kind"] = S::Primary::kind(&()).into_owned().into();
        let obj: DynamicObject =
            serde_json::from_value(value).map_err(|e| Error::Setup(e.to_string()))?;
        let created = self
            .api(namespace.as_deref(), &self.primary)
            .create(&PostParams::default(), &obj)
            .await
            .map_err(|e| {
                // A namespaced kind created without a namespace: the server answers 404 for
                // the cluster-wide path it does not serve.
                let hint =
                    if namespace.is_none() && matches!(&e, kube::Error::Api(s) if s.code == 404) {
                        " (a namespaced primary needs metadata.namespace set in Subject::primary)"
                    } else {
                        ""
                    };
                Error::Setup(format!("creating the primary object: {e}{hint}"))
            })?;
        let instance = Instance {
            name,
            namespace,
            uid: created.uid().unwrap_or_default(),
        };
        self.lock().push(instance.clone());
        Ok(instance)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Instance>> {
        self.instances.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The primary object as the API server has it now.
    pub(crate) async fn read_primary(&self, instance: &Instance) -> Result<S::Primary, Error> {
        let obj = self
            .api(instance.namespace.as_deref(), &self.primary)
            .get(&instance.name)
            .await
            .map_err(setup("reading the primary object"))?;
        let value = serde_json::to_value(obj).map_err(|e| Error::Setup(e.to_string()))?;
        serde_json::from_value(value)
            .map_err(|e| Error::Setup(format!("decoding the primary object: {e}")))
    }

    /// The primary's `Stalled` condition (`reason: message`) when it is true for its current
    /// generation, as idem's derived resources write it for input they cannot act on.
    async fn stalled(&self, instance: &Instance) -> Option<String> {
        let obj = self
            .api(instance.namespace.as_deref(), &self.primary)
            .get(&instance.name)
            .await
            .ok()?;
        let status = &obj.data["status"];
        if status["observedGeneration"].as_i64() != obj.metadata.generation {
            return None;
        }
        let conditions = status["conditions"].as_array()?;
        let stalled = conditions
            .iter()
            .find(|c| c["type"] == "Stalled" && c["status"] == "True")?;
        Some(format!("{}: {}", stalled["reason"], stalled["message"]))
    }

    /// The primary's status conditions in one line (`type=status (reason): message`), for
    /// the evidence of a check that did not settle: a `Stalled` condition names the cause
    /// (such as a child name every instance shares in the one namespace of a run).
    pub(crate) async fn primary_conditions(&self, instance: &Instance) -> String {
        let Ok(obj) = self
            .api(instance.namespace.as_deref(), &self.primary)
            .get(&instance.name)
            .await
        else {
            return "(unreadable)".to_owned();
        };
        let conditions = obj.data["status"]["conditions"].as_array().cloned();
        let text: Vec<String> = conditions
            .unwrap_or_default()
            .iter()
            .map(|c| {
                let field = |f: &str| c[f].as_str().unwrap_or_default().to_owned();
                format!(
                    "{}={} ({}): {}",
                    field("type"),
                    field("status"),
                    field("reason"),
                    field("message")
                )
            })
            .collect();
        if text.is_empty() {
            "(none)".to_owned()
        } else {
            text.join("; ")
        }
    }

    /// A session of the subject on a new client of the kit's user with `probe`; `Ok(Err)`
    /// when the subject's `session` fails.
    pub(crate) async fn session(
        &self,
        probe: Arc<Probe>,
    ) -> Result<Result<S::Session, String>, Error> {
        self.session_with(self.identity.client(probe)?).await
    }

    /// A session on `client` (made by [`Identity::client`] or a variant of it).
    pub(crate) async fn session_with(
        &self,
        client: Client,
    ) -> Result<Result<S::Session, String>, Error> {
        Ok(self
            .subject
            .session(client)
            .await
            .map_err(|e| format!("the subject's session failed: {e}")))
    }

    /// One pass with `primary` as given; the probe counts its requests.
    pub(crate) async fn pass_with(
        &self,
        session: &S::Session,
        probe: &Probe,
        primary: Arc<S::Primary>,
    ) -> Pass {
        let first = probe.arm();
        let timeout = self.options.pass_timeout;
        let run = tokio::time::timeout(timeout, self.subject.reconcile(session, primary));
        let result = tokio::select! {
            r = run => match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(error_text(e.as_ref())),
                Err(_) => Err(format!("the pass took longer than {} s", timeout.as_secs())),
            },
            () = probe.tripped() => Err(ABORTED.to_owned()),
        };
        probe.disarm();
        let sent = probe.sent().split_off(first);
        Pass { sent, result }
    }

    /// One pass with the primary object as the API server has it now.
    pub(crate) async fn pass(
        &self,
        session: &S::Session,
        probe: &Probe,
        instance: &Instance,
    ) -> Result<Pass, Error> {
        let primary = Arc::new(self.read_primary(instance).await?);
        Ok(self.pass_with(session, probe, primary).await)
    }

    /// Passes until one makes no write (or [`STABLE_PASSES`] in a row leave the end state as
    /// it was), at most [`Options::max_passes`]; a failed pass is retried after a short
    /// backoff, as a controller would. `Ok(Err)` with the evidence when it does not converge
    /// or the probe trips.
    pub(crate) async fn converge(
        &self,
        session: &S::Session,
        probe: &Probe,
        instance: &Instance,
    ) -> Result<Result<Convergence, String>, Error> {
        let mut conv = Convergence::default();
        let mut states: Vec<EndState> = Vec::new();
        // The end states before and after the last pass that succeeded, for the evidence.
        let mut last_change: Option<(EndState, EndState)> = None;
        for i in 0..self.options.max_passes {
            let pass = self.pass(session, probe, instance).await?;
            let (ok, writes) = (pass.result.is_ok(), pass.writes());
            conv.passes.push(pass);
            if probe.has_tripped() {
                return Ok(Err(ABORTED.to_owned()));
            }
            if ok && writes == 0 {
                match self.settle(session, probe, instance, &mut conv).await? {
                    Settle::Settled => return Ok(Ok(conv)),
                    Settle::Stalled => {
                        return Ok(Err(format!(
                            "converged, but passes that wrote nothing left it Stalled for its \
                             generation, unchanged for {} s (it will not settle by waiting); \
                             the primary's conditions: {}",
                            STALLED_GRACE.as_secs(),
                            self.primary_conditions(instance).await
                        )));
                    }
                    Settle::TimedOut => {}
                }
                return Ok(Err(format!(
                    "converged but not settled (the subject's `settled`) within {} s; the \
                     last pass: {}; the primary's conditions: {}",
                    self.options.settle_timeout.as_secs(),
                    conv.passes.last().map(describe).unwrap_or_default(),
                    self.primary_conditions(instance).await
                )));
            }
            if ok {
                let state = self.anonymized(instance).await?;
                if let Some(prev) = states.last() {
                    last_change = Some((prev.clone(), state.clone()));
                }
                if states.last().is_some_and(|s| *s != state) {
                    states.clear();
                }
                states.push(state);
                if states.len() >= STABLE_PASSES {
                    conv.kept_writing = true;
                    return Ok(Ok(conv));
                }
            } else {
                states.clear();
                tokio::time::sleep(Duration::from_millis(20 << i.min(5))).await;
            }
        }
        let last = conv.passes.last().map(describe).unwrap_or_default();
        let changed = match last_change {
            Some((before, after)) => format!(
                "\nwhat the last pass changed:\n{}",
                after.diff(&before).join("\n")
            ),
            None => String::new(),
        };
        Ok(Err(format!(
            "not converged after {} passes; the last one: {last}{changed}",
            conv.passes.len()
        )))
    }

    /// Passes every 100 ms until the primary object is [`Subject::settled`] after a pass
    /// without writes, [`Options::settle_timeout`] passes, or passes without writes have left
    /// it with the same `Stalled` condition for [`STALLED_GRACE`].
    async fn settle(
        &self,
        session: &S::Session,
        probe: &Probe,
        instance: &Instance,
        conv: &mut Convergence,
    ) -> Result<Settle, Error> {
        let start = std::time::Instant::now();
        // The pass before this call wrote nothing; settle on a pass without writes only
        // (one that wrote, e.g. status on its children's progress, is not the end).
        let mut quiet = true;
        // The Stalled condition quiet passes have left, and since when.
        let mut stalled: Option<(String, std::time::Instant)> = None;
        loop {
            if quiet && self.subject.settled(&self.read_primary(instance).await?) {
                return Ok(Settle::Settled);
            }
            let now = if quiet {
                self.stalled(instance).await
            } else {
                None
            };
            stalled = match (stalled, now) {
                (Some((was, since)), Some(now)) if was == now => Some((was, since)),
                (_, now) => now.map(|now| (now, std::time::Instant::now())),
            };
            if stalled
                .as_ref()
                .is_some_and(|(_, since)| since.elapsed() >= STALLED_GRACE)
            {
                return Ok(Settle::Stalled);
            }
            if start.elapsed() >= self.options.settle_timeout || probe.has_tripped() {
                return Ok(Settle::TimedOut);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let pass = self.pass(session, probe, instance).await?;
            quiet = pass.result.is_ok() && pass.writes() == 0;
            conv.passes.push(pass);
        }
    }

    /// A new session with a clean client, then [`Harness::converge`].
    pub(crate) async fn converge_fresh(
        &self,
        instance: &Instance,
    ) -> Result<Result<Convergence, String>, Error> {
        let probe = Probe::new();
        let session = match self.session(probe.clone()).await? {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        self.converge(&session, &probe, instance).await
    }

    /// Converges a fresh instance with a clean client: the reference of every check.
    pub(crate) async fn reference(&self) -> Result<Result<Reference<S>, String>, Error> {
        let instance = self.instance().await?;
        let probe = Probe::new();
        let session = match self.session(probe.clone()).await? {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        let server_before = self.identity.server_count(self.cp).await?;
        let convergence = match self.converge(&session, &probe, &instance).await? {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let server_requests = self.identity.server_count(self.cp).await? - server_before;
        if convergence.requests() == 0 {
            return Ok(Err(
                "the reconcile made no request through the client the kit gave \
                 its session: the kit can neither count nor abort it"
                    .into(),
            ));
        }
        let state = self.anonymized(&instance).await?;
        let mut once_kinds: Vec<ApiResource> = Vec::new();
        for (ar, child) in self.children(&instance).await? {
            let value = serde_json::to_value(&child).map_err(|e| Error::Setup(e.to_string()))?;
            if !self.subject.created_once(&value).is_empty() && !once_kinds.contains(&ar) {
                once_kinds.push(ar);
            }
        }
        Ok(Ok(Reference {
            instance,
            probe,
            session,
            convergence,
            state,
            server_requests,
            once_kinds,
        }))
    }

    /// The live children of `instance`, with everything the API server has on them.
    pub(crate) async fn children(
        &self,
        instance: &Instance,
    ) -> Result<Vec<(ApiResource, DynamicObject)>, Error> {
        let primary = self.read_primary(instance).await?;
        let children = self.subject.children(&primary);
        let mut found: BTreeMap<String, (ApiResource, DynamicObject)> = BTreeMap::new();
        for ar in &children.kinds {
            let api: Api<DynamicObject> = Api::all_with(self.admin.clone(), ar);
            let mut objects = Vec::new();
            if let Some(selector) = &children.selector {
                let lp = ListParams::default().labels(selector);
                objects.extend(api.list(&lp).await.map_err(setup("listing children"))?);
            }
            let all = api
                .list(&ListParams::default())
                .await
                .map_err(setup("listing children"))?;
            objects.extend(all.items.into_iter().filter(|o| {
                o.owner_references()
                    .iter()
                    .any(|r| !instance.uid.is_empty() && r.uid == instance.uid)
            }));
            for mut obj in objects {
                obj.types = Some(kube::core::TypeMeta {
                    api_version: ar.api_version.clone(),
                    kind: ar.kind.clone(),
                });
                let value = serde_json::to_value(&obj).map_err(|e| Error::Setup(e.to_string()))?;
                found.insert(key(&value), (ar.clone(), obj));
            }
        }
        Ok(found.into_values().collect())
    }

    /// The end state of `instance` now (volatile metadata and child status dropped, the
    /// subject's [`Subject::normalize`] applied).
    pub(crate) async fn state(&self, instance: &Instance) -> Result<EndState, Error> {
        let mut primary = serde_json::to_value(self.read_primary(instance).await?)
            .map_err(|e| Error::Setup(e.to_string()))?;
        primary["apiVersion"] = self.primary.api_version.clone().into();
        primary["kind"] = self.primary.kind.clone().into();
        let children = self
            .children(instance)
            .await?
            .into_iter()
            .map(|(_, o)| serde_json::to_value(o).map_err(|e| Error::Setup(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let mut state = EndState::new(primary, children);
        for child in state.children.values_mut() {
            strip_bookkeeping(child, self.subject.label_names());
            self.subject.normalize(child);
        }
        Ok(state)
    }

    /// [`Harness::state`], anonymised by the instance's name and uid, with its created-once
    /// values masked ([`Subject::created_once`]): for comparing different instances.
    pub(crate) async fn anonymized(&self, instance: &Instance) -> Result<EndState, Error> {
        let mut state = self.state(instance).await?;
        for child in state.children.values_mut() {
            for pointer in self.subject.created_once(child) {
                super::once::mask(child, &pointer);
            }
        }
        Ok(state.anonymized(&instance.name, &instance.uid))
    }

    /// Whether a child of `instance` is being deleted.
    pub(crate) async fn children_terminating(&self, instance: &Instance) -> Result<bool, Error> {
        Ok(self.state(instance).await?.terminating())
    }

    /// Starts following `instance`'s created-once values ([`super::once::Follow`]).
    pub(crate) async fn follow(
        &self,
        reference: &Reference<S>,
        instance: &Instance,
    ) -> Result<super::once::Follow, Error> {
        super::once::Follow::start(self, &reference.once_kinds, instance).await
    }

    /// Deletes `instance` and its children now (best effort, not waited for): finalizers
    /// of the primary object are removed first, so that no reconcile is needed.
    pub(crate) async fn discard(&self, instance: &Instance) {
        let children = self.children(instance).await.unwrap_or_default();
        let api = self.api(instance.namespace.as_deref(), &self.primary);
        let unfinalize = serde_json::json!({"metadata": {"finalizers": null}});
        let _ = api
            .patch(
                &instance.name,
                &PatchParams::default(),
                &Patch::Merge(&unfinalize),
            )
            .await;
        let dp = DeleteParams::background();
        let _ = api.delete(&instance.name, &dp).await;
        for (ar, child) in children {
            let _ = self
                .api(child.namespace().as_deref(), &ar)
                .delete(&child.name_any(), &dp)
                .await;
        }
        self.lock().retain(|i| i.uid != instance.uid);
    }

    /// Discards every instance still there and removes the kit's user.
    pub(crate) async fn cleanup(&self) {
        let instances = self.lock().clone();
        for instance in &instances {
            self.discard(instance).await;
        }
        self.identity.remove().await;
    }
}

/// Longest error text kept in the evidence (characters).
const MAX_ERROR: usize = 300;

/// A reconcile's error for the evidence: an API status answer anywhere in its chain as
/// `409 AlreadyExists: <message>` (not the `Debug` dump), otherwise its text; at most
/// [`MAX_ERROR`] characters, cut with `…`.
pub(crate) fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(kube::Error::Api(s)) = err.downcast_ref::<kube::Error>() {
            let text = e.to_string();
            let outer = match text.find("ApiError") {
                Some(0) | None => String::new(),
                Some(i) => text[..i].to_owned(),
            };
            return super::report::clip(
                &format!("{outer}{} {}: {}", s.code, s.reason, s.message),
                MAX_ERROR,
            );
        }
        cur = err.source();
    }
    super::report::clip(&e.to_string(), MAX_ERROR)
}

/// `Ok, 3 requests: GET …, PATCH …` / `Err(…), …`, the requests listed up to 10.
pub(crate) fn describe(pass: &Pass) -> String {
    let result = match &pass.result {
        Ok(()) => "Ok".to_owned(),
        Err(e) => format!("Err({e})"),
    };
    let mut listed: Vec<String> = pass.sent.iter().take(10).map(ToString::to_string).collect();
    if pass.sent.len() > 10 {
        listed.push(format!("… {} more", pass.sent.len() - 10));
    }
    format!(
        "{result}, {} requests{}{}",
        pass.sent.len(),
        if listed.is_empty() { "" } else { ": " },
        listed.join(", ")
    )
}

/// Removes idem's own bookkeeping from a child before end states are compared: the
/// fingerprint annotation of the owner kind's `labels` ([`Labels::fingerprint`]: a hash of the
/// desired body, which names the instance (its namespace, its uid label), so it differs
/// between instances by construction, not by state; and `metadata.annotations` when nothing
/// else is left in it). idem's bucket labels stay,
/// anonymised by [`EndState::anonymized`](super::EndState::anonymized).
pub(crate) fn strip_bookkeeping(child: &mut serde_json::Value, labels: Labels) {
    let Some(meta) = child
        .pointer_mut("/metadata")
        .and_then(serde_json::Value::as_object_mut)
    else {
        return;
    };
    if let Some(a) = meta
        .get_mut("annotations")
        .and_then(serde_json::Value::as_object_mut)
    {
        a.remove(labels.fingerprint());
        if a.is_empty() {
            meta.remove("annotations");
        }
    }
}

#[cfg(test)]
mod bookkeeping_tests {
    use super::*;
    use idem_runtime::apply::FINGERPRINT_ANNOTATION;

    #[test]
    fn the_fingerprint_and_a_then_empty_annotations_map_are_dropped() {
        let mut only =
            serde_json::json!({"metadata": {"annotations": {FINGERPRINT_ANNOTATION: "x"}}});
        strip_bookkeeping(&mut only, Labels::operator());
        assert_eq!(only, serde_json::json!({"metadata": {}}));
        let mut more = serde_json::json!({"metadata": {"annotations": {FINGERPRINT_ANNOTATION: "x", "a": "b"}}});
        strip_bookkeeping(&mut more, Labels::operator());
        assert_eq!(
            more,
            serde_json::json!({"metadata": {"annotations": {"a": "b"}}})
        );
    }
}
