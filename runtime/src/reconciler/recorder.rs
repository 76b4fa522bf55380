//! Publishes Kubernetes Events (`events.k8s.io/v1`) as kube-runtime's `Recorder` does, with a
//! bounded memory of the series it may count up.
//!
//! An Event repeated (same type, action, reason, reporter, regarding and related objects)
//! within [`SERIES_TTL`] of the last one counts up the first one's `series` instead of making
//! another object, as client-go's and kube-runtime's recorders do. kube-runtime's keeps a
//! whole copy of every Event it published for that long, with no bound, and scans all of them
//! at each publish: a fleet being created (a few Events per tenant) cost the operator ~17 MB
//! of its 28 MB of heap at 1,000 Tenants, and each publish took time in proportion to them. This
//! one keeps per repeatable Event an 8-byte digest of its key, its name and namespace, its
//! count and when it was last seen, at most [`MOST_REMEMBERED`] of them, forgotten in the
//! order they were last seen. An Event not remembered (past the bound) is published as a new
//! object when it repeats: the per-object Event budget
//! ([`EventBudget`](super::budget::EventBudget)) bounds how often that can be.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};

/// How long after an Event was last published a repeat counts up its series (kube-runtime's
/// and client-go's six minutes).
pub(crate) const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// The most Events remembered for their series at once, whatever the fleet's size (~100 bytes
/// each).
pub(crate) const MOST_REMEMBERED: usize = 4_096;

/// The longest name of an object, an Event's included (a DNS subdomain).
const MAX_NAME: usize = 253;

/// Publishes Events as one reporter; clones share the memory of series.
#[derive(Clone)]
pub(crate) struct Recorder {
    client: Client,
    reporter: Reporter,
    series: Arc<Mutex<Series>>,
}

/// What is remembered of a published Event for its series.
#[derive(Debug)]
struct Seen {
    name: String,
    namespace: String,
    count: i32,
    at: Instant,
}

/// The Events remembered, by the digest of their key, and the order they were last seen in.
#[derive(Debug, Default)]
struct Series {
    by_key: HashMap<u64, Seen>,
    /// `(last seen, key)`, oldest first; an entry whose time is not its Event's last is stale.
    order: VecDeque<(Instant, u64)>,
}

impl Series {
    /// Forgets what was last seen [`SERIES_TTL`] before `now` or earlier, and the oldest
    /// beyond [`MOST_REMEMBERED`] when one more is to be remembered.
    fn forget(&mut self, now: Instant, room_for_one: bool) {
        while let Some(&(at, key)) = self.order.front() {
            let expired = at + SERIES_TTL <= now;
            let full = room_for_one && self.by_key.len() >= MOST_REMEMBERED;
            if !expired && !full {
                break;
            }
            self.order.pop_front();
            if self.by_key.get(&key).is_some_and(|s| s.at == at) {
                self.by_key.remove(&key);
            }
        }
    }

    /// Remembers `seen` under `key`, as last seen at `seen.at`.
    fn remember(&mut self, key: u64, seen: Seen) {
        self.order.push_back((seen.at, key));
        self.by_key.insert(key, seen);
        // Stale order entries (Events seen again since) are dropped as they reach the front;
        // compacted when they outnumber the live ones, so repeats cannot grow the queue.
        if self.order.len() > 2 * self.by_key.len() + 64 {
            let by_key = &self.by_key;
            self.order
                .retain(|(at, key)| by_key.get(key).is_some_and(|s| s.at == *at));
        }
    }
}

impl Recorder {
    /// A recorder publishing through `client` as `reporter`.
    pub(crate) fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            series: Arc::default(),
        }
    }

    /// The digest of the key a repeat of `event` about `regarding` shares with it: every field
    /// of both references, as kube-runtime's key (a child's reference carries the version it
    /// was repaired at, so each repair of it is an Event of its own, naming who changed it).
    fn key(&self, event: &Event, regarding: &ObjectReference) -> u64 {
        static SEED: std::sync::LazyLock<u64> = std::sync::LazyLock::new(rand::random);
        let mut h = foldhash::fast::FixedState::with_seed(*SEED).build_hasher();
        matches!(event.type_, EventType::Warning).hash(&mut h);
        (&event.action, &event.reason).hash(&mut h);
        (&self.reporter.controller, &self.reporter.instance).hash(&mut h);
        for r in std::iter::once(Some(regarding)).chain([event.secondary.as_ref()]) {
            r.map(|r| {
                (
                    &r.api_version,
                    &r.kind,
                    &r.namespace,
                    &r.name,
                    &r.uid,
                    &r.resource_version,
                    &r.field_path,
                )
            })
            .hash(&mut h);
        }
        h.finish()
    }

    /// Publishes `event` about `regarding`: a new Event, or the next count of the series of
    /// the same Event published less than [`SERIES_TTL`] ago. An Event about a cluster-scoped
    /// object goes in namespace `default`.
    ///
    /// # Errors
    /// When the API server refuses the Event.
    pub(crate) async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = self.key(event, regarding);
        let now = Instant::now();
        let repeat = {
            let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
            series.forget(now, false);
            // Checked here too: `forget` stops at the first entry not expired, and publishes
            // that overlap append out of time order.
            (series.by_key.get(&key))
                .filter(|s| s.at + SERIES_TTL > now)
                .map(|s| (s.name.clone(), s.namespace.clone(), s.count + 1))
        };
        if let Some((name, namespace, count)) = repeat {
            let patch = serde_json::json!({"series": {
                "count": count,
                "lastObservedTime": MicroTime(Timestamp::now()),
            }});
            let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
            match events
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.note(key, name, namespace, count, now);
                    return Ok(());
                }
                // Gone (the API server's Event TTL, or deleted), or refused (a tenant owner
                // put an object of their own under its name): a new Event instead, which
                // becomes the series' from now on.
                Err(e) => {
                    tracing::debug!(error = %e, event = %name, "an Event's series could not be counted up; publishing a new Event");
                }
            }
        }
        let created = self.event(event, regarding);
        let namespace = created.metadata.namespace.clone().unwrap_or_default();
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let created = events.create(&PostParams::default(), &created).await?;
        let name = created.metadata.name.unwrap_or_default();
        self.note(key, name, namespace, 1, now);
        Ok(())
    }

    /// Remembers the Event `name` in `namespace` as published `count` times, last at `at`.
    fn note(&self, key: u64, name: String, namespace: String, count: i32, at: Instant) {
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        let new = !series.by_key.contains_key(&key);
        series.forget(at, new);
        series.remember(
            key,
            Seen {
                name,
                namespace,
                count,
                at,
            },
        );
    }

    /// The Event object `event` about `regarding` is published as, the first time.
    fn event(&self, event: &Event, regarding: &ObjectReference) -> K8sEvent {
        let now = Timestamp::now();
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let named = regarding.name.as_ref().unwrap_or(&self.reporter.controller);
        // An object name may be 253 characters long, an Event name too: the suffix (a dot and
        // at most 16 hex digits) is kept whole, the object's name cut, at a character
        // boundary and not after a dot or dash.
        let mut cut = named.len().min(MAX_NAME - 17);
        while !named.is_char_boundary(cut) {
            cut -= 1;
        }
        let named = named[..cut].trim_end_matches(['.', '-']);
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            note: event.note.clone(),
            metadata: ObjectMeta {
                namespace: Some(namespace),
                name: Some(format!("{named}.{:x}", now.as_nanosecond())),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                (self.reporter.instance.clone())
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            type_: Some(match event.type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            ..K8sEvent::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorder whose client reaches no server (these tests send nothing).
    fn recorder() -> Recorder {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("a url"));
        let client = Client::try_from(config).expect("a client");
        let reporter = Reporter {
            controller: "idem".into(),
            instance: None,
        };
        Recorder::new(client, reporter)
    }

    fn seen(at: Instant) -> Seen {
        Seen {
            name: "e".into(),
            namespace: "default".into(),
            count: 1,
            at,
        }
    }

    #[test]
    fn series_are_forgotten_after_their_ttl_and_the_oldest_beyond_the_bound() {
        let t0 = Instant::now();
        let mut s = Series::default();
        s.remember(1, seen(t0));
        s.remember(2, seen(t0 + Duration::from_secs(60)));
        s.forget(t0 + SERIES_TTL, false);
        assert!(!s.by_key.contains_key(&1), "last seen six minutes ago");
        assert!(s.by_key.contains_key(&2));
        // Seen again: the earlier time no longer counts.
        s.remember(2, seen(t0 + Duration::from_secs(300)));
        s.forget(t0 + Duration::from_secs(60) + SERIES_TTL, false);
        assert!(s.by_key.contains_key(&2), "seen again at 300 s");
        let mut full = Series::default();
        for key in 0..MOST_REMEMBERED as u64 {
            full.remember(key, seen(t0 + Duration::from_millis(key)));
        }
        full.forget(t0, true);
        full.remember(u64::MAX, seen(t0));
        assert_eq!(full.by_key.len(), MOST_REMEMBERED);
        assert!(!full.by_key.contains_key(&0), "the oldest made room");
        assert!(full.by_key.contains_key(&u64::MAX));
    }

    #[test]
    fn repeats_do_not_grow_the_order_without_bound() {
        let t0 = Instant::now();
        let mut s = Series::default();
        for i in 0..10_000u64 {
            s.remember(7, seen(t0 + Duration::from_millis(i)));
        }
        assert_eq!(s.by_key.len(), 1);
        assert!(s.order.len() <= 2 + 64, "{} order entries", s.order.len());
    }

    #[tokio::test]
    async fn a_repeat_is_the_same_type_action_reason_and_objects_whatever_its_note() {
        let recorder = recorder();
        let regarding = ObjectReference {
            kind: Some("Tenant".into()),
            name: Some("acme".into()),
            uid: Some("u1".into()),
            ..ObjectReference::default()
        };
        let child = |rv: &str| ObjectReference {
            kind: Some("RoleBinding".into()),
            name: Some("owners".into()),
            resource_version: Some(rv.into()),
            ..ObjectReference::default()
        };
        let event = |reason: &str, note: &str, related| Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Repair".into(),
            secondary: Some(related),
        };
        let key = |e: &Event| recorder.key(e, &regarding);
        let first = key(&event("DriftRepaired", "by alice", child("7")));
        assert_eq!(first, key(&event("DriftRepaired", "by bob", child("7"))));
        assert_ne!(first, key(&event("DriftRepaired", "by alice", child("8"))));
        assert_ne!(first, key(&event("Other", "by alice", child("7"))));
    }

    #[tokio::test]
    async fn an_event_about_an_object_with_the_longest_name_has_a_name_it_may_have() {
        let recorder = recorder();
        let event = Event {
            type_: EventType::Normal,
            reason: "Created".into(),
            note: None,
            action: "Create".into(),
            secondary: None,
        };
        let about = |name: String| ObjectReference {
            kind: Some("ConfigMap".into()),
            namespace: Some("ns".into()),
            name: Some(name),
            ..ObjectReference::default()
        };
        let short = recorder
            .event(&event, &about("web".into()))
            .metadata
            .name
            .unwrap();
        assert!(short.starts_with("web."), "{short}");
        let longest = format!("{}-{}", "a".repeat(235), "b".repeat(17));
        let name = recorder
            .event(&event, &about(longest))
            .metadata
            .name
            .unwrap();
        assert!(name.len() <= MAX_NAME, "{} characters", name.len());
        assert!(name.starts_with(&"a".repeat(235)), "{name}");
        assert!(!name.contains("-."), "no label ends with a dash: {name}");
    }
}
