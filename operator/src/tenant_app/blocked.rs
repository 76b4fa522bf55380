//! Children blocked by a foreign object: when a TenantApp's child name is taken by an object
//! it does not own (`ChildNotOwned`), that one object is watched (a watch with a
//! `metadata.name` field selector in its namespace) and the app is reconciled again as soon as
//! the object is deleted, so the app recovers without polling.
//!
//! The owned-children watches cannot see this: they select `app.kubernetes.io/managed-by`,
//! which a foreign object does not carry. Each blocked object costs one watch while it
//! blocks; past [`MAX_BLOCKED_WATCHES`] the app falls back to a slow requeue instead.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use idem_runtime::ObjectKey;
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_fn};
use tokio::sync::mpsc;

/// Most foreign objects watched at once; beyond, a blocked app is requeued periodically.
pub const MAX_BLOCKED_WATCHES: usize = 100;

/// The registry of watched blocking objects and the trigger channel of the TenantApp
/// controller (the receiving end goes to `Controller::reconcile_on`).
pub struct Blocked {
    watching: Arc<Mutex<HashSet<ObjectKey>>>,
    trigger: mpsc::UnboundedSender<ObjectKey>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<ObjectKey>>>,
}

impl Default for Blocked {
    fn default() -> Self {
        let (trigger, receiver) = mpsc::unbounded_channel();
        Self {
            watching: Arc::new(Mutex::new(HashSet::new())),
            trigger,
            receiver: Mutex::new(Some(receiver)),
        }
    }
}

impl Blocked {
    /// The stream of owner keys to reconcile again; `None` after the first call.
    pub fn triggers(&self) -> Option<impl futures::Stream<Item = ObjectKey> + Send + 'static> {
        let rx = self.receiver.lock().ok()?.take()?;
        Some(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|key| (key, rx))
        }))
    }

    /// Watches `child` (an object of `resource` whose name `owner`'s child wants) until it is
    /// gone, then triggers a reconcile of `owner`. Returns `false` when it cannot be watched
    /// (too many watches already): the caller should poll instead.
    pub fn watch(
        &self,
        client: &kube::Client,
        resource: ApiResource,
        child: ObjectKey,
        owner: ObjectKey,
    ) -> bool {
        {
            let Ok(mut watching) = self.watching.lock() else {
                return false;
            };
            if watching.contains(&child) {
                return true;
            }
            if watching.len() >= MAX_BLOCKED_WATCHES {
                return false;
            }
            watching.insert(child.clone());
        }
        let api = match &child.namespace {
            Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource),
            None => Api::<DynamicObject>::all_with(client.clone(), &resource),
        };
        let trigger = self.trigger.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={}", child.name));
        let watching = Arc::clone(&self.watching);
        tokio::spawn(async move {
            let stream = watch_fn(api, config).default_backoff();
            futures::pin_mut!(stream);
            let mut present = false;
            while let Some(event) = stream.next().await {
                let gone = match event {
                    Ok(Event::Init) => {
                        present = false;
                        false
                    }
                    Ok(Event::InitApply(_) | Event::Apply(_)) => {
                        present = true;
                        false
                    }
                    Ok(Event::InitDone) => !present,
                    Ok(Event::Delete(_)) => true,
                    Err(e) => {
                        tracing::debug!(error = %e, object = %child, "blocked child watch error");
                        false
                    }
                };
                if gone {
                    break;
                }
            }
            if let Ok(mut watching) = watching.lock() {
                watching.remove(&child);
            }
            let _ = trigger.send(owner);
        });
        true
    }
}
