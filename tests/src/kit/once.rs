//! Values created once ([`Subject::created_once`]: a generated password, a key pair): they
//! differ between instances by design, so end states compare them by presence only, and each
//! is followed through every version of its child within one instance instead — a value that
//! changes after its child was created, or a child created twice, fails the check that made the
//! instance (a racing reconcile that applied over the winner's create, a resume that generated
//! another).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, ListParams, WatchEvent, WatchParams};
use kube::core::ApiResource;
use serde_json::Value;

use super::harness::{Harness, Instance};
use super::state::key;
use super::{Error, Subject};

/// What a created-once value becomes in end states compared across instances.
pub(crate) const MASK: &str = "{created once}";

/// How long [`Follow::finish`] waits for its watches to catch up with the live children.
const CATCH_UP: Duration = Duration::from_secs(15);

/// Replaces every leaf under `pointer` in `child` by [`MASK`] (keys and lengths are kept, so a
/// missing or extra generated key is still a difference).
pub(crate) fn mask(child: &mut Value, pointer: &str) {
    fn leaves(v: &mut Value) {
        match v {
            Value::Object(map) => map.values_mut().for_each(leaves),
            Value::Array(items) => items.iter_mut().for_each(leaves),
            other => *other = Value::String(MASK.to_owned()),
        }
    }
    if let Some(v) = child.pointer_mut(pointer) {
        leaves(v);
    }
}

/// Whether JSON pointer `pointer` is `under` or inside it.
pub(crate) fn within(pointer: &str, under: &str) -> bool {
    pointer == under
        || pointer
            .strip_prefix(under)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// One version of a child with created-once values.
#[derive(Clone, Debug)]
struct Version {
    uid: String,
    resource_version: u64,
    values: Vec<(String, Option<Value>)>,
}

/// Versions seen of each child of the instance, by `apiVersion kind namespace/name`.
type Seen = Arc<Mutex<BTreeMap<String, Vec<Value>>>>;

/// Every version of every child of one instance (of the kinds that have created-once values),
/// as watched from before the check's first reconcile of it.
pub(crate) struct Follow {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    seen: Seen,
}

impl Drop for Follow {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Whether `obj` is a child of `instance`: an ownerReference to it, or the selector's labels
/// (`key=value` and `key` terms; any other selector goes by ownerReference alone).
fn belongs(obj: &Value, instance: &Instance, selector: Option<&str>) -> bool {
    let owned = obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| r.get("uid").and_then(Value::as_str) == Some(instance.uid.as_str()));
    let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
    let labelled = selector.is_some_and(|s| {
        !s.contains(['!', '(', ' '])
            && s.split(',').all(|term| match term.split_once('=') {
                Some((k, v)) => labels.and_then(|l| l.get(k)) == Some(&Value::from(v)),
                None => labels.is_some_and(|l| l.contains_key(term)),
            })
    });
    owned || labelled
}

fn resource_version(obj: &Value) -> u64 {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

impl Follow {
    /// Starts following the children of kinds `kinds` of `instance` (none: a follower that
    /// finds nothing).
    ///
    /// # Errors
    /// [`Error::Setup`] when a watch cannot be started.
    pub(crate) async fn start<S: Subject>(
        h: &Harness<'_, S>,
        kinds: &[ApiResource],
        instance: &Instance,
    ) -> Result<Self, Error> {
        let seen: Seen = Arc::default();
        let mut tasks = Vec::new();
        if kinds.is_empty() {
            return Ok(Self { tasks, seen });
        }
        let primary = h.read_primary(instance).await?;
        let selector = h.subject.children(&primary).selector;
        for ar in kinds {
            let api: Api<DynamicObject> = Api::all_with(h.admin.clone(), ar);
            let listed = api
                .list_metadata(&ListParams::default().limit(1))
                .await
                .map_err(|e| Error::Setup(format!("listing {} to follow it: {e}", ar.kind)))?;
            let mut from = listed.metadata.resource_version.unwrap_or_default();
            // Established before the check's first reconcile; from the list's version, so
            // that no event after it is missed either way.
            let first = api
                .watch(&WatchParams::default(), &from)
                .await
                .map_err(|e| Error::Setup(format!("watching {}: {e}", ar.kind)))?;
            let (ar, instance, selector) = (ar.clone(), instance.clone(), selector.clone());
            let store = Arc::clone(&seen);
            tasks.push(tokio::spawn(async move {
                let mut stream = Some(first.boxed());
                loop {
                    let mut s = match stream.take() {
                        Some(s) => s,
                        None => match api.watch(&WatchParams::default(), &from).await {
                            Ok(s) => s.boxed(),
                            Err(_) => return,
                        },
                    };
                    while let Some(event) = s.next().await {
                        let obj = match event {
                            Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => o,
                            Ok(WatchEvent::Bookmark(b)) => {
                                from = b.metadata.resource_version;
                                continue;
                            }
                            Ok(WatchEvent::Deleted(_)) => continue,
                            Ok(WatchEvent::Error(_)) | Err(_) => return,
                        };
                        from = obj.metadata.resource_version.clone().unwrap_or_default();
                        let mut value = serde_json::to_value(&obj).unwrap_or_default();
                        value["apiVersion"] = ar.api_version.clone().into();
                        value["kind"] = ar.kind.clone().into();
                        if belongs(&value, &instance, selector.as_deref()) {
                            let mut seen = store.lock().unwrap_or_else(|e| e.into_inner());
                            seen.entry(key(&value)).or_default().push(value);
                        }
                    }
                }
            }));
        }
        Ok(Self { tasks, seen })
    }

    /// Waits until every live child with created-once values of `instance` was seen at its
    /// current version, then says what went wrong: one line per value that changed after its
    /// child was created, and per child created more than once.
    ///
    /// # Errors
    /// [`Error::Setup`] when the children cannot be listed.
    pub(crate) async fn finish<S: Subject>(
        self,
        h: &Harness<'_, S>,
        instance: &Instance,
    ) -> Result<Vec<String>, Error> {
        if self.tasks.is_empty() {
            return Ok(Vec::new());
        }
        let mut live: Vec<(String, u64)> = Vec::new();
        for (_, child) in h.children(instance).await? {
            let value = serde_json::to_value(&child).map_err(|e| Error::Setup(e.to_string()))?;
            if h.subject.created_once(&value).is_empty() {
                continue;
            }
            live.push((key(&value), resource_version(&value)));
        }
        let start = std::time::Instant::now();
        let lagging = loop {
            let lagging: Vec<String> = {
                let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                live.iter()
                    .filter(|(k, rv)| {
                        !seen
                            .get(k)
                            .is_some_and(|vs| vs.iter().any(|v| resource_version(v) >= *rv))
                    })
                    .map(|(k, _)| k.clone())
                    .collect()
            };
            if lagging.is_empty() || start.elapsed() >= CATCH_UP {
                break lagging;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut out: Vec<String> = lagging
            .into_iter()
            .map(|k| {
                format!(
                    "the kit's watch did not see the current version of {k} within {} s: its \
                     created-once values could not be followed",
                    CATCH_UP.as_secs()
                )
            })
            .collect();
        for (k, objects) in &seen {
            let versions: Vec<Version> = objects
                .iter()
                .filter_map(|obj| {
                    let pointers = h.subject.created_once(obj);
                    (!pointers.is_empty()).then(|| Version {
                        uid: obj
                            .pointer("/metadata/uid")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        resource_version: resource_version(obj),
                        values: pointers
                            .into_iter()
                            .map(|p| {
                                let v = obj.pointer(&p).cloned();
                                (p, v)
                            })
                            .collect(),
                    })
                })
                .collect();
            out.extend(judge(k, &versions));
        }
        Ok(out)
    }
}

/// The evidence against one child's versions: created more than once, or a created-once value
/// that changed after creation.
fn judge(child: &str, versions: &[Version]) -> Vec<String> {
    let mut out = Vec::new();
    let mut uids: Vec<&str> = Vec::new();
    for v in versions {
        if !uids.contains(&v.uid.as_str()) {
            uids.push(&v.uid);
        }
    }
    if uids.len() > 1 {
        out.push(format!(
            "{child} was created {} times (one object each: {}); a child with values created \
             once must be created once, and taken as it is when it exists",
            uids.len(),
            uids.join(", ")
        ));
    }
    for uid in uids {
        let mut of_uid = versions.iter().filter(|v| v.uid == uid);
        let Some(first) = of_uid.next() else { continue };
        for later in of_uid {
            for ((pointer, was), (_, now)) in first.values.iter().zip(&later.values) {
                if was != now {
                    let shown = |v: &Option<Value>| {
                        v.as_ref().map_or("(absent)".to_owned(), |v| {
                            super::report::clip(&v.to_string(), 80)
                        })
                    };
                    out.push(format!(
                        "{child} {pointer} is created once, yet changed after its creation: \
                         {} at resourceVersion {} → {} at {} (a reconcile wrote over the value \
                         another had created: create it once — POST, and on AlreadyExists take \
                         what is there)",
                        shown(was),
                        first.resource_version,
                        shown(now),
                        later.resource_version
                    ));
                    return out;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn masked_values_keep_their_keys() {
        let mut child = json!({"data": {"password": "YQ==", "user": "YQ=="}, "type": "Opaque"});
        mask(&mut child, "/data");
        assert_eq!(
            child,
            json!({"data": {"password": MASK, "user": MASK}, "type": "Opaque"})
        );
        assert!(within("/data/password", "/data"));
        assert!(within("/data", "/data"));
        assert!(!within("/database", "/data"));
    }

    fn version(uid: &str, rv: u64, value: &str) -> Version {
        Version {
            uid: uid.into(),
            resource_version: rv,
            values: vec![("/data".into(), Some(json!({"password": value})))],
        }
    }

    #[test]
    fn a_value_that_changes_after_creation_or_a_second_creation_is_evidence() {
        assert!(judge("s", &[version("a", 1, "x"), version("a", 2, "x")]).is_empty());
        let changed = judge("s", &[version("a", 1, "x"), version("a", 2, "y")]);
        assert_eq!(changed.len(), 1, "{changed:?}");
        assert!(
            changed[0].contains("changed after its creation"),
            "{changed:?}"
        );
        let twice = judge("s", &[version("a", 1, "x"), version("b", 3, "x")]);
        assert!(twice[0].contains("created 2 times"), "{twice:?}");
    }

    #[test]
    fn children_belong_by_owner_reference_or_selector() {
        let instance = Instance {
            name: "w".into(),
            namespace: None,
            uid: "u".into(),
        };
        let owned = json!({"metadata": {"ownerReferences": [{"uid": "u"}]}});
        assert!(belongs(&owned, &instance, None));
        let labelled = json!({"metadata": {"labels": {"a": "w", "b": "1"}}});
        assert!(belongs(&labelled, &instance, Some("a=w,b")));
        assert!(!belongs(&labelled, &instance, Some("a=v")));
        assert!(!belongs(&labelled, &instance, Some("a!=v")));
    }
}
