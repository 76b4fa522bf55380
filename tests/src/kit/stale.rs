//! Stale-read-safe: the reconcile sees the world late, as a controller behind a lagging API
//! server does (its watch caches, and the primary object it is handed, trail the API server by
//! [`DELAY`]), while the spec flips to [`Subject::flipped`] and straight back. The end state
//! must equal the serial one — the same flips made one after another, each converged with
//! fresh reads: nothing leaked (a child of the flipped spec left behind), nothing lost, the
//! same status (the record of the children, `observedGeneration`).
//!
//! The kit plays the controller: it watches the primary object through a client whose watch
//! events arrive [`DELAY`] late and hands the reconcile each new generation that watch shows,
//! as it shows it (so the pass of the flipped spec runs when that spec is already gone, and the
//! pass of the last spec gets the object as it was before the previous pass's status write);
//! the session's own client has its watch events delayed as much. A pass that fails is made
//! again; while the subject is not [`Subject::settled`] a pass follows every 100 ms (its
//! children's progress, a requeue). The end state is judged once the last generation was
//! reconciled and the subject is settled, after children being deleted are gone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, DynamicObject, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio::sync::mpsc;

use super::harness::{Harness, Instance, Reference, describe};
use super::probe::Probe;
use super::report::CheckReport;
use super::state::EndState;
use super::{Error, Subject};
use crate::faults::Faults;

/// How late the reconcile's watch events (and the primary objects it is handed) are.
pub(crate) const DELAY: Duration = Duration::from_secs(2);

/// Runs the check.
///
/// # Errors
/// [`Error::Setup`] when the cluster cannot be read or written by the kit.
pub(crate) async fn run<S: Subject>(
    h: &Harness<'_, S>,
    _reference: &Reference<S>,
    r: &mut CheckReport,
) -> Result<(), Error> {
    r.figure("watch delay", format!("{} s", DELAY.as_secs()));
    let probe_instance = h.subject.primary("kit-probe");
    if h.subject.flipped(&probe_instance).is_none() {
        r.figure(
            "flips",
            "none: the subject gives no `Subject::flipped` spec",
        );
        return Ok(());
    }
    let serial = match serial(h).await? {
        Ok(state) => state,
        Err(why) => {
            r.fail(format!("the serial flips do not converge: {why}"));
            return Ok(());
        }
    };

    let instance = h.instance().await?;
    let faults = Faults::new();
    let probe = Probe::new();
    let client = h.identity.faulty_client(probe.clone(), &faults)?;
    let session = match h.session_with(client).await? {
        Ok(s) => s,
        Err(e) => {
            r.fail(e);
            return Ok(());
        }
    };
    if let Err(why) = h.converge(&session, &probe, &instance).await? {
        r.fail(format!(
            "the instance does not converge before the flips: {why}"
        ));
        h.discard(&instance).await;
        return Ok(());
    }
    let admin_faults = faults.clone();
    let mut view = View::<S>::start(h, &instance, &admin_faults)?;
    let current = h.read_primary(&instance).await?;
    view.catch_up(&current).await?;

    faults.delay_watches(DELAY);
    let original = h.read_primary(&instance).await?;
    let flipped = h
        .subject
        .flipped(&original)
        .ok_or_else(|| Error::Setup("`Subject::flipped` gave no spec the second time".into()))?;
    set_spec(h, &instance, &flipped).await?;
    let last = set_spec(h, &instance, &original).await?;
    let generation = last.meta().generation.unwrap_or(0);

    let outcome = play(h, &session, &probe, &instance, &mut view, generation).await?;
    view.stop();
    drop(session);
    faults.clear();
    r.figure("passes", outcome.passes.len());
    match outcome.result {
        Err(why) => r.fail(format!(
            "with watch events {} s late, after the spec flipped and back: {why}",
            DELAY.as_secs()
        )),
        Ok(()) => {
            let state = settled_state(h, &instance).await?;
            let diffs = state.diff(&serial);
            if !diffs.is_empty() {
                r.fail(format!(
                    "with watch events {} s late, the spec flipped and straight back (generation \
                     {generation}); once the subject said it was done, the end state differs \
                     from the serial one (the same flips, each converged):\n{}\nthe passes, \
                     each with the generation it was handed:\n{}",
                    DELAY.as_secs(),
                    diffs.join("\n"),
                    outcome.describe()
                ));
            }
        }
    }
    h.discard(&instance).await;
    Ok(())
}

/// The end state of the same flips made serially, each converged with fresh reads by a clean
/// session; `Ok(Err)` when one does not converge.
async fn serial<S: Subject>(h: &Harness<'_, S>) -> Result<Result<EndState, String>, Error> {
    let instance = h.instance().await?;
    let probe = Probe::new();
    let session = match h.session(probe.clone()).await? {
        Ok(s) => s,
        Err(e) => return Ok(Err(e)),
    };
    if let Err(why) = h.converge(&session, &probe, &instance).await? {
        return Ok(Err(why));
    }
    let original = h.read_primary(&instance).await?;
    let Some(flipped) = h.subject.flipped(&original) else {
        return Ok(Err("`Subject::flipped` gave no spec".into()));
    };
    for spec in [&flipped, &original] {
        set_spec(h, &instance, spec).await?;
        if let Err(why) = h.converge(&session, &probe, &instance).await? {
            return Ok(Err(why));
        }
    }
    drop(session);
    let state = settled_state(h, &instance).await?;
    h.discard(&instance).await;
    Ok(Ok(state))
}

/// The anonymised end state once no child is being deleted any more (at most
/// [`Options::settle_timeout`](super::Options::settle_timeout); then as it is).
async fn settled_state<S: Subject>(
    h: &Harness<'_, S>,
    instance: &Instance,
) -> Result<EndState, Error> {
    let start = Instant::now();
    loop {
        let state = h.anonymized(instance).await?;
        if !state.terminating() || start.elapsed() >= h.options.settle_timeout {
            return Ok(state);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Replaces the spec of `instance` with `like`'s (admin client; a conflict with a status
/// write is read again and retried). Returns the object as stored.
async fn set_spec<S: Subject>(
    h: &Harness<'_, S>,
    instance: &Instance,
    like: &S::Primary,
) -> Result<DynamicObject, Error> {
    let ar = kube::core::ApiResource::erase::<S::Primary>(&());
    let api: Api<DynamicObject> = match &instance.namespace {
        Some(ns) => Api::namespaced_with(h.admin.clone(), ns, &ar),
        None => Api::all_with(h.admin.clone(), &ar),
    };
    let spec = serde_json::to_value(like)
        .map_err(|e| Error::Setup(e.to_string()))?
        .get("spec")
        .cloned()
        .unwrap_or_default();
    for _ in 0..10 {
        let mut obj = api
            .get(&instance.name)
            .await
            .map_err(|e| Error::Setup(format!("reading the primary object: {e}")))?;
        obj.data["spec"] = spec.clone();
        match api
            .replace(&instance.name, &PostParams::default(), &obj)
            .await
        {
            Ok(stored) => return Ok(stored),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(Error::Setup(format!("changing the spec: {e}"))),
        }
    }
    Err(Error::Setup(
        "changing the spec: still conflicting after 10 attempts".into(),
    ))
}

/// The primary object as a delayed watch shows it: each version, in order.
struct View<S: Subject> {
    events: mpsc::UnboundedReceiver<S::Primary>,
    task: tokio::task::JoinHandle<()>,
    /// The last version received.
    latest: Option<Arc<S::Primary>>,
}

impl<S: Subject> View<S> {
    /// Watches `instance` with an admin client whose watches `faults` delays.
    fn start(h: &Harness<'_, S>, instance: &Instance, faults: &Faults) -> Result<Self, Error> {
        let client = faults
            .client(h.cp.config())
            .map_err(|e| Error::Setup(format!("client: {e}")))?;
        let ar = kube::core::ApiResource::erase::<S::Primary>(&());
        let api: Api<DynamicObject> = match &instance.namespace {
            Some(ns) => Api::namespaced_with(client, ns, &ar),
            None => Api::all_with(client, &ar),
        };
        let config = watcher::Config::default().fields(&format!("metadata.name={}", instance.name));
        let (tx, events) = mpsc::unbounded_channel();
        let uid = instance.uid.clone();
        let stream = watcher(api, config)
            .default_backoff()
            .applied_objects()
            .for_each(move |obj| {
                if let Ok(obj) = obj
                    && obj.uid().as_deref() == Some(uid.as_str())
                    && let Ok(value) = serde_json::to_value(&obj)
                    && let Ok(primary) = serde_json::from_value::<S::Primary>(value)
                {
                    let _ = tx.send(primary);
                }
                futures::future::ready(())
            });
        Ok(Self {
            events,
            task: tokio::spawn(stream),
            latest: None,
        })
    }

    /// Waits until the watch has shown `current` (its resourceVersion).
    async fn catch_up(&mut self, current: &S::Primary) -> Result<(), Error> {
        let want = current.meta().resource_version.clone();
        let wait = async {
            while let Some(obj) = self.events.recv().await {
                let rv = obj.meta().resource_version.clone();
                self.latest = Some(Arc::new(obj));
                if rv == want {
                    return true;
                }
            }
            false
        };
        match tokio::time::timeout(Duration::from_secs(30), wait).await {
            Ok(true) => Ok(()),
            _ => Err(Error::Setup(
                "the kit's watch of the primary object never showed it".into(),
            )),
        }
    }

    fn stop(&self) {
        self.task.abort();
    }
}

impl<S: Subject> Drop for View<S> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The passes the kit made as the controller, and how it ended.
struct Played {
    /// Each pass with the generation and resourceVersion it was handed.
    passes: Vec<(i64, String, super::harness::Pass)>,
    result: Result<(), String>,
}

impl Played {
    /// One line per pass; a run of passes that read alike is one line, counted.
    fn describe(&self) -> String {
        let mut lines: Vec<(String, usize)> = Vec::new();
        for (g, rv, p) in &self.passes {
            let line = format!("  generation {g} (resourceVersion {rv}): {}", describe(p));
            match lines.last_mut() {
                Some((last, n)) if *last == line => *n += 1,
                _ => lines.push((line, 1)),
            }
        }
        (lines.into_iter())
            .map(|(line, n)| match n {
                1 => line,
                n => format!("{line} (× {n})"),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Plays the controller until generation `last` was reconciled and the subject is settled: a
/// failure after more than `max_passes × 4` passes (those that wrote nothing while a child was
/// being deleted aside), or after the deadline.
async fn play<S: Subject>(
    h: &Harness<'_, S>,
    session: &S::Session,
    probe: &Probe,
    instance: &Instance,
    view: &mut View<S>,
    last: i64,
) -> Result<Played, Error> {
    let generation = |p: &S::Primary| p.meta().generation.unwrap_or(0);
    let mut played = Played {
        passes: Vec::new(),
        result: Ok(()),
    };
    let mut reconciled = view.latest.as_deref().map_or(0, generation);
    let mut failed = false;
    // Passes counted against the limit (see below).
    let mut counted = 0;
    let start = Instant::now();
    let deadline = h.options.settle_timeout + DELAY * 4;
    loop {
        if start.elapsed() >= deadline {
            played.result = Err(format!(
                "generation {last} not reconciled and settled within {} s (last generation \
                 reconciled: {reconciled}; the primary's conditions: {}); the passes:\n{}",
                deadline.as_secs(),
                h.primary_conditions(instance).await,
                played.describe()
            ));
            return Ok(played);
        }
        // Every new generation the watch shows, in order, as the watch shows it.
        let next = tokio::time::timeout(Duration::from_millis(100), view.events.recv()).await;
        let mut handed = None;
        if let Ok(Some(obj)) = next {
            let obj = Arc::new(obj);
            view.latest = Some(Arc::clone(&obj));
            if generation(&obj) > reconciled {
                handed = Some(obj);
            }
        }
        let primary = match handed {
            Some(obj) => obj,
            None if reconciled < last => continue,
            None => {
                if !failed && h.subject.settled(&h.read_primary(instance).await?) {
                    return Ok(played);
                }
                match &view.latest {
                    Some(obj) => Arc::clone(obj),
                    None => continue,
                }
            }
        };
        let g = generation(&primary);
        let rv = primary.meta().resource_version.clone().unwrap_or_default();
        let pass = h.pass_with(session, probe, primary).await;
        failed = pass.result.is_err();
        reconciled = reconciled.max(g);
        played.passes.push((g, rv, pass));
        // A pass that wrote nothing while a child is being deleted waits for what is not the
        // reconcile's to hasten (a namespace emptied by the API server's namespace
        // controller): bounded by the deadline only. Every other pass counts.
        let counts = failed
            || played.passes.last().is_some_and(|(_, _, p)| p.writes() > 0)
            || !h.children_terminating(instance).await?;
        counted += usize::from(counts);
        if counted > h.options.max_passes * 4 {
            played.result = Err(format!(
                "not settled after {counted} passes, besides those that waited for a child's \
                 deletion (the primary's conditions: {}):\n{}",
                h.primary_conditions(instance).await,
                played.describe()
            ));
            return Ok(played);
        }
    }
}
