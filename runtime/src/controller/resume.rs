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

use super::relist::{not_established, streaming_refused};
use crate::cache::Resume;
use crate::shard::Ranges;

/// The annotation of the bookmark that ends a streaming list's objects.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// The longest a watch request is asked to last (the API server's default is 30–60 minutes,
/// kube's watcher asks for 290 s): it is started again from the last version seen.
const WATCH_TIMEOUT_SECS: u32 = 290;

/// The selector requirement of the children a run with `now` holds that a run with `before`
/// did not (of the bucket label `label`); `None` when there are none.
pub(crate) fn gained(label: &str, before: &Ranges, now: &Ranges) -> Option<String> {
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

/// Whether a child whose bucket label holds `value` is in `now`'s share: whether the new
/// watch's selector (`<label> in (…)`, which compares the text) selects it — a bucket in
/// decimal as the apply engine writes it, not `03` or `+3` for bucket 3.
pub(crate) fn in_share(now: &Ranges, value: Option<&str>) -> bool {
    now.is_all()
        || value
            .and_then(|v| v.parse::<usize>().ok().filter(|b| b.to_string() == v))
            .is_some_and(|b| now.holds(b))
}

/// What comes after a page of a list.
enum Next {
    /// The next page (`token` `None`: the first) of the whole share or of the gained objects.
    List { whole: bool, token: Option<String> },
    /// `InitDone`, the store then complete to the resourceVersion.
    Listed(String),
}

/// Where the watch is.
enum Phase<K> {
    /// Starting over: a streaming list (`sendInitialEvents`) of the whole share, or a paged
    /// list when the API server refuses those.
    Start,
    /// Receiving a streaming list's objects until its `initial-events-end` bookmark.
    Initial(BoxStream<'static, kube::Result<WatchEvent<K>>>),
    /// Listing the whole share (`whole`) or the gained objects at `rv`, page by page.
    List { whole: bool, token: Option<String> },
    /// Handing out a page (the kept objects first, then each listed page).
    Page { items: VecDeque<K>, next: Next },
    /// Watching the whole share from `rv`.
    Watch {
        rv: String,
        events: Option<BoxStream<'static, kube::Result<WatchEvent<K>>>>,
    },
}

/// Where a watch goes on from: the store an earlier run left, complete to `rv`.
pub(crate) struct From<K> {
    /// What that store held of the share, for a store built again from its events (a
    /// primary's reflector); empty for a store kept as it is.
    pub(crate) kept: Vec<K>,
    /// The selector requirement of the objects the store lacks ([`gained`]).
    pub(crate) gained: Option<String>,
    pub(crate) rv: u64,
}

/// The watch of `config`'s objects that a run which may go on in the next one uses: as
/// kube-runtime's watcher (a streaming list, or a paged one where refused, then a watch; a 410
/// Gone, or a 404 or 403 that says the resource is not served or allowed, starts over with
/// `Init` and a list of the whole share), except that it knows the resourceVersion its store
/// is complete to and says so in `leave` (at each `InitDone` and bookmark; the events between
/// say theirs through the watch that handles them). With `from`, it starts with `InitApply`
/// for each kept object and each object of the gained selector (added to `config`'s) as it was
/// at `from.rv`, `InitDone`, then every change after `from.rv`; when the API server no longer
/// has that version it starts over.
pub(crate) fn resuming<K, S>(
    api: Api<K>,
    config: watcher::Config,
    from: Option<From<K>>,
    leave: Option<Arc<Resume<S>>>,
) -> impl futures::Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    S: Send + Sync + 'static,
{
    let base = config.label_selector.clone().unwrap_or_default();
    let (start, gained_selector, from_rv) = match from {
        Some(from) => {
            let rv = from.rv.to_string();
            let next = match from.gained {
                Some(_) => Next::List {
                    whole: false,
                    token: None,
                },
                None => Next::Listed(rv.clone()),
            };
            let selector = from.gained.map(|g| match base.is_empty() {
                true => g,
                false => format!("{base},{g}"),
            });
            let start = Phase::Page {
                items: from.kept.into(),
                next,
            };
            (start, selector, Some(rv))
        }
        None => (Phase::Start, None, None),
    };
    let streaming = config.initial_list_strategy == watcher::InitialListStrategy::StreamingList;
    let state = (start, streaming);
    futures::stream::unfold(state, move |(mut phase, mut streaming)| {
        let (api, config, gained_selector, from_rv) = (
            api.clone(),
            config.clone(),
            gained_selector.clone(),
            from_rv.clone(),
        );
        let leave = leave.clone();
        async move {
            let complete_to = |rv: Option<&str>| {
                if let Some(leave) = &leave {
                    leave.complete_to(rv.and_then(|rv| rv.parse().ok()));
                }
            };
            let watch_params = || {
                let mut params = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
                if let Some(labels) = &config.label_selector {
                    params = params.labels(labels);
                }
                if let Some(fields) = &config.field_selector {
                    params = params.fields(fields);
                }
                params
            };
            let gone = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 410);
            loop {
                phase = match phase {
                    Phase::Start if streaming => {
                        match api.watch(&watch_params().initial_events(), "0").await {
                            Ok(events) => {
                                complete_to(None);
                                let next = Phase::Initial(events.boxed());
                                return Some((Ok(Event::Init), (next, streaming)));
                            }
                            Err(e) => {
                                let e = watcher::Error::WatchStartFailed(e);
                                if streaming_refused(&config, &e) {
                                    tracing::info!(error = %e, kind = std::any::type_name::<K>(),
                                        "streaming lists refused; listing by pages");
                                    streaming = false;
                                }
                                return Some((Err(e), (Phase::Start, streaming)));
                            }
                        }
                    }
                    Phase::Start => {
                        complete_to(None);
                        let next = Phase::List {
                            whole: true,
                            token: None,
                        };
                        return Some((Ok(Event::Init), (next, streaming)));
                    }
                    Phase::Initial(mut events) => match events.try_next().await {
                        Ok(Some(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                            return Some((
                                Ok(Event::InitApply(obj)),
                                (Phase::Initial(events), streaming),
                            ));
                        }
                        Ok(Some(WatchEvent::Bookmark(mark))) => {
                            if mark.metadata.annotations.contains_key(INITIAL_EVENTS_END) {
                                let rv = mark.metadata.resource_version;
                                // Every object of the list was handled before this was asked.
                                complete_to(Some(&rv));
                                let next = Phase::Watch {
                                    rv,
                                    events: Some(events),
                                };
                                return Some((Ok(Event::InitDone), (next, streaming)));
                            }
                            Phase::Initial(events)
                        }
                        Ok(Some(WatchEvent::Deleted(_))) => Phase::Initial(events),
                        Ok(Some(WatchEvent::Error(status))) => {
                            let next = match status.code {
                                410 => Phase::Start,
                                _ => Phase::Initial(events),
                            };
                            let e = watcher::Error::WatchError(status);
                            return Some((Err(e), (next, streaming)));
                        }
                        Ok(None) => Phase::Start,
                        Err(e) => {
                            let e = watcher::Error::WatchFailed(e);
                            return Some((Err(e), (Phase::Start, streaming)));
                        }
                    },
                    Phase::List { whole, token } => {
                        let labels = match whole {
                            true => config.label_selector.clone(),
                            false => gained_selector.clone(),
                        };
                        let mut params = ListParams::default()
                            .labels(labels.as_deref().unwrap_or_default())
                            .limit(config.page_size.unwrap_or(500));
                        if let Some(fields) = &config.field_selector {
                            params = params.fields(fields);
                        }
                        params = match (&token, &from_rv, whole) {
                            (Some(token), _, _) => params.continue_token(token),
                            (None, Some(rv), false) => params.at(rv).matching(VersionMatch::Exact),
                            (None, _, _) => params,
                        };
                        match api.list(&params).await {
                            Ok(list) => {
                                let rv = match (whole, &from_rv) {
                                    (false, Some(rv)) => Some(rv.clone()),
                                    _ => list.metadata.resource_version.filter(|v| !v.is_empty()),
                                };
                                let token = list.metadata.continue_.filter(|t| !t.is_empty());
                                let next = match (token, rv) {
                                    (Some(token), _) => Next::List {
                                        whole,
                                        token: Some(token),
                                    },
                                    (None, Some(rv)) => Next::Listed(rv),
                                    (None, None) => {
                                        return Some((
                                            Err(watcher::Error::NoResourceVersion),
                                            (Phase::Start, streaming),
                                        ));
                                    }
                                };
                                Phase::Page {
                                    items: list.items.into(),
                                    next,
                                }
                            }
                            Err(e) if !whole => {
                                // The version gone (410), or any other failure: start over.
                                tracing::info!(kind = std::any::type_name::<K>(), error = %e,
                                    "listing the gained objects failed; listing the whole share");
                                Phase::Start
                            }
                            Err(e) => {
                                let e = watcher::Error::InitialListFailed(e);
                                return Some((Err(e), (Phase::Start, streaming)));
                            }
                        }
                    }
                    Phase::Page { mut items, next } => match (items.pop_front(), next) {
                        (Some(obj), next) => {
                            let page = Phase::Page { items, next };
                            return Some((Ok(Event::InitApply(obj)), (page, streaming)));
                        }
                        (None, Next::List { whole, token }) => Phase::List { whole, token },
                        (None, Next::Listed(rv)) => {
                            complete_to(Some(&rv));
                            let watch = Phase::Watch { rv, events: None };
                            return Some((Ok(Event::InitDone), (watch, streaming)));
                        }
                    },
                    Phase::Watch { rv, events: None } => {
                        match api.watch(&watch_params(), &rv).await {
                            Ok(events) => Phase::Watch {
                                rv,
                                events: Some(events.boxed()),
                            },
                            Err(e) if gone(&e) => {
                                tracing::info!(kind = std::any::type_name::<K>(), error = %e,
                                "the watch's version is gone; listing the whole share");
                                Phase::Start
                            }
                            Err(e) => {
                                let e = watcher::Error::WatchStartFailed(e);
                                // Not served or not allowed any more: start over with a list.
                                let next = match not_established(&e) {
                                    true => Phase::Start,
                                    false => Phase::Watch { rv, events: None },
                                };
                                return Some((Err(e), (next, streaming)));
                            }
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
                                    // Every event before it was handled before this was asked.
                                    complete_to(Some(&rv));
                                    phase = Phase::Watch {
                                        rv,
                                        events: Some(events),
                                    };
                                    continue;
                                }
                                WatchEvent::Error(status) => {
                                    let next = match status.code {
                                        410 => Phase::Start,
                                        _ => Phase::Watch { rv, events: None },
                                    };
                                    let e = watcher::Error::WatchError(status);
                                    return Some((Err(e), (next, streaming)));
                                }
                            };
                            let next = Phase::Watch {
                                rv,
                                events: Some(events),
                            };
                            return Some((Ok(out), (next, streaming)));
                        }
                        // The request's time is up: on from the last version seen.
                        Ok(None) => Phase::Watch { rv, events: None },
                        Err(e) => {
                            let e = watcher::Error::WatchFailed(e);
                            return Some((Err(e), (Phase::Watch { rv, events: None }, streaming)));
                        }
                    },
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
        let label = crate::labels::Labels::operator().shard_bucket();
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
            assert_eq!(buckets(gained(label, &before, &now)), expected);
        }
        let (before, now) = (three.ranges_of("a"), two.ranges_of("a"));
        assert!(now.buckets().any(|b| !before.holds(b)), "a gains buckets");
        // The same share gains none; from one member (every bucket) nothing is gained.
        assert_eq!(gained(label, &now, &now), None);
        assert_eq!(gained(label, &Ranges::all(), &now), None);
        // To every bucket: all the earlier selector left out, unlabelled children too.
        assert!(
            gained(label, &before, &Ranges::all())
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
        // Only the text the selector matches: a tenant owner's `0250` is not bucket 250.
        assert!(!in_share(&now, Some(&format!("0{mine}"))));
        assert!(!in_share(&now, Some(&format!("+{mine}"))));
        assert!(!in_share(&now, Some(&format!(" {mine}"))));
        assert!(in_share(&Ranges::all(), None));
    }
}
