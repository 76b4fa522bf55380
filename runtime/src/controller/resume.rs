//! A watch that goes on from the store an earlier run of its controller left (a shard ring
//! change): it lists only the buckets it gained, at the version the store is complete to, then
//! watches its whole share from that version; anything the API server no longer has (410 Gone)
//! or any other failure starts it over with a list of its whole share.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use std::fmt::Debug;

use kube::api::{ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::relist::relisting;
use crate::cache::Resume;
use crate::labels::Labels;
use crate::shard::Ranges;

/// The longest a watch request is asked to last (the API server's default is 30–60 minutes,
/// kube's watcher asks for 290 s): it is started again from the last version seen.
const WATCH_TIMEOUT_SECS: u32 = 290;

/// The selector requirement of the children a run with `now` holds that a run with `before`
/// did not (of the bucket label `labels.shard_bucket()`); `None` when there are none.
pub(crate) fn gained(labels: Labels, before: &Ranges, now: &Ranges) -> Option<String> {
    let label = labels.shard_bucket();
    let list = |buckets: Vec<usize>| match buckets.is_empty() {
        true => "none".to_owned(),
        false => (buckets.iter().map(usize::to_string))
            .collect::<Vec<_>>()
            .join(","),
    };
    if before.is_all() {
        None
    } else if now.is_all() {
        // Everything the earlier selector left out: other buckets, and children with no bucket
        // label or one that is no bucket.
        Some(format!(
            "{label} notin ({})",
            list(before.buckets().collect())
        ))
    } else {
        let new: Vec<usize> = now.buckets().filter(|b| !before.holds(*b)).collect();
        (!new.is_empty()).then(|| format!("{label} in ({})", list(new)))
    }
}

/// Whether a child whose bucket label holds `value` is in `now`'s share.
pub(crate) fn in_share(now: &Ranges, value: Option<&str>) -> bool {
    now.is_all()
        || value
            .and_then(|v| v.parse::<usize>().ok())
            .is_some_and(|b| now.holds(b))
}

/// What comes after a page of the resuming watch's list.
enum Next {
    /// The next page of the gained objects (`None`: the first, at the version resumed from).
    List(Option<String>),
    /// `InitDone`.
    Listed,
}

/// Where the resuming watch is.
enum Phase<K> {
    /// Listing the gained objects, page by page.
    List { token: Option<String> },
    /// Handing out a page (the kept objects first, then each listed page).
    Page { items: VecDeque<K>, next: Next },
    /// The list is complete: `InitDone`.
    Listed,
    /// Watching the whole share from `rv`.
    Watch {
        rv: String,
        events: Option<BoxStream<'static, kube::Result<WatchEvent<K>>>>,
    },
    /// Started over: the kube-runtime watcher, from a list of the whole share.
    Relist(BoxStream<'static, watcher::Result<Event<K>>>),
}

/// The events of a watch of `config`'s objects going on from a store complete to `rv`:
/// `InitApply` for each of `kept` (what the store held of the share, for a store that is built
/// again from its events) and each object of the `gained` selector (added to `config`'s) as it
/// was at `rv`, `InitDone`, then every change of `config`'s objects after `rv`. On any failure
/// it becomes [`relisting`] of `config` (which starts with `Init`: the store is then replaced
/// by a whole list, as after any broken watch). The API server's bookmarks move `leave` on
/// (every event before one was handed out, and handled before the next was asked for).
pub(crate) fn resuming<K, S>(
    api: Api<K>,
    config: watcher::Config,
    kept: Vec<K>,
    gained: Option<String>,
    rv: u64,
    leave: Option<Arc<Resume<S>>>,
) -> impl futures::Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    S: Send + Sync + 'static,
{
    let rv = rv.to_string();
    let start = Phase::Page {
        items: kept.into(),
        next: match gained {
            Some(_) => Next::List(None),
            None => Next::Listed,
        },
    };
    let base = config.label_selector.clone().unwrap_or_default();
    let list_selector = gained.map(|g| match base.is_empty() {
        true => g,
        false => format!("{base},{g}"),
    });
    futures::stream::unfold(start, move |mut phase| {
        let (api, config, rv, list_selector) = (
            api.clone(),
            config.clone(),
            rv.clone(),
            list_selector.clone(),
        );
        let leave = leave.clone();
        async move {
            let relist = |api: Api<K>, config: watcher::Config, why: String| {
                tracing::info!(kind = std::any::type_name::<K>(), error = %why,
                    "a watch going on from the last ring's store failed; listing its whole share");
                Phase::Relist(relisting(api, config).boxed())
            };
            loop {
                phase = match phase {
                    Phase::List { token } => {
                        let mut params = ListParams::default()
                            .labels(list_selector.as_deref().unwrap_or_default())
                            .limit(config.page_size.unwrap_or(500));
                        if let Some(fields) = &config.field_selector {
                            params = params.fields(fields);
                        }
                        params = match &token {
                            Some(token) => params.continue_token(token),
                            None => params.at(&rv).matching(VersionMatch::Exact),
                        };
                        match api.list(&params).await {
                            Ok(list) => Phase::Page {
                                items: list.items.into(),
                                next: match list.metadata.continue_.filter(|t| !t.is_empty()) {
                                    Some(token) => Next::List(Some(token)),
                                    None => Next::Listed,
                                },
                            },
                            Err(e) => relist(api.clone(), config.clone(), e.to_string()),
                        }
                    }
                    Phase::Page { mut items, next } => match (items.pop_front(), next) {
                        (Some(obj), next) => {
                            return Some((Ok(Event::InitApply(obj)), Phase::Page { items, next }));
                        }
                        (None, Next::List(token)) => Phase::List { token },
                        (None, Next::Listed) => Phase::Listed,
                    },
                    Phase::Listed => {
                        let watch = Phase::Watch {
                            rv: rv.clone(),
                            events: None,
                        };
                        return Some((Ok(Event::InitDone), watch));
                    }
                    Phase::Watch { rv, events: None } => {
                        let mut params = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
                        if let Some(labels) = &config.label_selector {
                            params = params.labels(labels);
                        }
                        if let Some(fields) = &config.field_selector {
                            params = params.fields(fields);
                        }
                        match api.watch(&params, &rv).await {
                            Ok(events) => Phase::Watch {
                                rv,
                                events: Some(events.boxed()),
                            },
                            Err(e) => relist(api.clone(), config.clone(), e.to_string()),
                        }
                    }
                    Phase::Watch {
                        mut rv,
                        events: Some(mut events),
                    } => match events.try_next().await {
                        Ok(Some(event)) => {
                            let out = match event {
                                WatchEvent::Added(obj) | WatchEvent::Modified(obj) => {
                                    rv = obj.resource_version().unwrap_or(rv);
                                    Event::Apply(obj)
                                }
                                WatchEvent::Deleted(obj) => {
                                    rv = obj.resource_version().unwrap_or(rv);
                                    Event::Delete(obj)
                                }
                                WatchEvent::Bookmark(mark) => {
                                    rv = mark.metadata.resource_version;
                                    if let Some(leave) = &leave {
                                        leave.complete_to(rv.parse().ok());
                                    }
                                    phase = Phase::Watch {
                                        rv,
                                        events: Some(events),
                                    };
                                    continue;
                                }
                                WatchEvent::Error(status) => {
                                    let why = format!("{} {}", status.code, status.message);
                                    phase = relist(api.clone(), config.clone(), why);
                                    continue;
                                }
                            };
                            return Some((
                                Ok(out),
                                Phase::Watch {
                                    rv,
                                    events: Some(events),
                                },
                            ));
                        }
                        // The request's time is up: on from the last version seen.
                        Ok(None) => Phase::Watch { rv, events: None },
                        Err(e) => relist(api.clone(), config.clone(), e.to_string()),
                    },
                    Phase::Relist(mut inner) => {
                        let item = inner.next().await?;
                        return Some((item, Phase::Relist(inner)));
                    }
                };
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::Ring;

    #[test]
    fn the_gained_selector_names_only_the_buckets_a_ring_change_brought() {
        let labels = Labels::operator();
        let label = labels.shard_bucket();
        let three = Ring::new(["a", "b", "c"]);
        let two = Ring::new(["a", "b"]);
        let buckets = |selector: Option<String>| -> Vec<usize> {
            let Some(selector) = selector else {
                return Vec::new();
            };
            let values = selector
                .strip_prefix(&format!("{label} in ("))
                .and_then(|s| s.strip_suffix(')'))
                .expect("a set of buckets");
            values.split(',').map(|v| v.parse().unwrap()).collect()
        };
        // Each way between a's share of two members and of three: exactly the buckets new to it.
        for (before, now) in [
            (three.ranges_of("a"), two.ranges_of("a")),
            (two.ranges_of("a"), three.ranges_of("a")),
            (three.ranges_of("c"), two.ranges_of("b")),
        ] {
            let expected: Vec<usize> = now.buckets().filter(|b| !before.holds(*b)).collect();
            assert_eq!(buckets(gained(labels, &before, &now)), expected);
        }
        let (before, now) = (three.ranges_of("a"), two.ranges_of("a"));
        assert!(now.buckets().any(|b| !before.holds(b)), "a gains buckets");
        // The same share gains none; from one member (every bucket) nothing is gained.
        assert_eq!(gained(labels, &now, &now), None);
        assert_eq!(gained(labels, &Ranges::all(), &now), None);
        // To every bucket: all the earlier selector left out, unlabelled children too.
        assert!(
            gained(labels, &before, &Ranges::all())
                .unwrap()
                .starts_with(&format!("{label} notin (")),
        );
    }

    #[test]
    fn a_child_is_in_the_share_by_its_bucket_label() {
        let now = Ring::new(["a", "b"]).ranges_of("a");
        let mine = now.buckets().next().unwrap();
        let theirs = (0..).find(|b| !now.holds(*b)).unwrap();
        assert!(in_share(&now, Some(&mine.to_string())));
        assert!(!in_share(&now, Some(&theirs.to_string())));
        assert!(!in_share(&now, None));
        assert!(!in_share(&now, Some("none")));
        assert!(in_share(&Ranges::all(), None));
    }
}
