//! kube-runtime's `watcher`, started over with a list after an error that says its resource
//! is not served or not allowed any more, and told apart from the errors it recovers from.

use std::fmt::Debug;

use futures::StreamExt;
use kube::runtime::watcher as watch_fn;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// Whether a watch error says the watch is not established: the list failed (the watcher
/// lists again), or the resource is not served (404: its CustomResourceDefinition is gone)
/// or not allowed (403) — then [`relisting`] starts over with a list.
pub(crate) fn not_established(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::InitialListFailed(_))
        || status_code(e).is_some_and(|code| code == 404 || code == 403)
}

/// The HTTP status of the API server's answer a watch error carries, when it carries one.
fn status_code(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.code),
        watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    }
}

/// Whether `e` says the resource is not served (404: its CustomResourceDefinition is not
/// installed or was deleted).
pub(crate) fn not_found(e: &watcher::Error) -> bool {
    status_code(e) == Some(404)
}

/// Whether `e` is an API server refusing a streaming list (`sendInitialEvents`): one without
/// the `WatchList` feature (off by default before Kubernetes 1.34, except in 1.32) rejects the
/// parameter as invalid.
pub(crate) fn streaming_refused(config: &watcher::Config, e: &watcher::Error) -> bool {
    config.initial_list_strategy == watcher::InitialListStrategy::StreamingList
        && matches!(e, watcher::Error::WatchStartFailed(kube::Error::Api(s))
            if s.code == 400 || s.code == 422)
}

/// kube-runtime's `watcher`, started over (with a list) after an error that says the resource
/// is not served or not allowed any more. The watcher itself would keep resuming its watch
/// from the last resourceVersion: once the resource is back, that may succeed without a list,
/// and nothing would tell that the watch is established again. With the list, `InitDone` does.
/// A config asking for streaming lists falls back to paged lists (its `page_size`) for good
/// when the API server refuses them ([`streaming_refused`]).
/// Give it [`watch_backoff`]: every error then waits before the next attempt.
pub(crate) fn relisting<C>(
    api: Api<C>,
    config: watcher::Config,
) -> impl futures::Stream<Item = watcher::Result<Event<C>>> + Send
where
    C: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    type Inner<C> = futures::stream::BoxStream<'static, watcher::Result<Event<C>>>;
    futures::stream::unfold((None::<Inner<C>>, config), move |(inner, mut config)| {
        let api = api.clone();
        async move {
            let mut inner = inner.unwrap_or_else(|| watch_fn(api, config.clone()).boxed());
            let item = inner.next().await?;
            if let Err(e) = &item
                && streaming_refused(&config, e)
            {
                tracing::info!(error = %e, kind = std::any::type_name::<C>(),
                    "streaming lists refused; listing by pages");
                config.initial_list_strategy = watcher::InitialListStrategy::ListWatch;
                return Some((item, (None, config)));
            }
            // After a failed list the watcher lists again by itself.
            let start_over = matches!(&item, Err(e)
                if !matches!(e, watcher::Error::InitialListFailed(_)) && not_established(e));
            Some((item, ((!start_over).then_some(inner), config)))
        }
    })
}
