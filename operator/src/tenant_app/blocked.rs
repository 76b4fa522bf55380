//! Children blocked by a foreign object: when a TenantApp's child name is taken by an object
//! it does not own (`ChildNotOwned`), that one object is watched (a watch with a
//! `metadata.name` field selector in its namespace) and the app is reconciled again as soon as
//! the object is deleted, so the app recovers without polling.
//!
//! The owned-children watches cannot see this: they select `app.kubernetes.io/managed-by`,
//! which a foreign object does not carry. Each blocked object costs one watch while it
//! blocks; past [`MAX_BLOCKED_WATCHES_PER_TENANT`] watches for one tenant (so that one tenant
//! cannot use up the watches of all others) or [`MAX_BLOCKED_WATCHES`] in all, the app falls
//! back to a slow requeue instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use idem_runtime::ObjectKey;
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_fn};
use tokio::sync::mpsc;

/// Most foreign objects watched at once for all tenants together (a backstop); beyond, a
/// blocked app is requeued periodically.
pub const MAX_BLOCKED_WATCHES: usize = 500;

/// Most foreign objects watched at once for one tenant; beyond, that tenant's blocked apps are
/// requeued periodically while other tenants' still get watches.
pub const MAX_BLOCKED_WATCHES_PER_TENANT: usize = 20;

/// Which blocking objects are watched, for which tenant, within both limits.
#[derive(Debug)]
struct Budget {
    per_tenant: usize,
    total: usize,
    watched: HashMap<ObjectKey, String>,
    by_tenant: HashMap<String, usize>,
}

/// The answer of [`Budget::take`].
#[derive(Debug, PartialEq, Eq)]
enum Take {
    /// Already watched.
    Watched,
    /// A new watch is allowed (and counted).
    Start,
    /// Over a limit: poll instead.
    Full,
}

impl Budget {
    fn new(per_tenant: usize, total: usize) -> Self {
        Self {
            per_tenant,
            total,
            watched: HashMap::new(),
            by_tenant: HashMap::new(),
        }
    }

    /// Counts a watch of `child` for `tenant` if both limits allow it.
    fn take(&mut self, child: &ObjectKey, tenant: &str) -> Take {
        if self.watched.contains_key(child) {
            return Take::Watched;
        }
        let used = self.by_tenant.get(tenant).copied().unwrap_or(0);
        if used >= self.per_tenant || self.watched.len() >= self.total {
            return Take::Full;
        }
        self.watched.insert(child.clone(), tenant.to_owned());
        *self.by_tenant.entry(tenant.to_owned()).or_default() += 1;
        Take::Start
    }

    /// Gives back the watch of `child`.
    fn release(&mut self, child: &ObjectKey) {
        let Some(tenant) = self.watched.remove(child) else {
            return;
        };
        if let Some(n) = self.by_tenant.get_mut(&tenant) {
            *n -= 1;
            if *n == 0 {
                self.by_tenant.remove(&tenant);
            }
        }
    }
}

/// The registry of watched blocking objects and the trigger channel of the TenantApp
/// controller (the receiving end goes to `Controller::reconcile_on`).
pub struct Blocked {
    /// Watch tasks running (`idem_blocked_object_watches`).
    pub gauge: prometheus_client::metrics::gauge::Gauge,
    watching: Arc<Mutex<Budget>>,
    trigger: mpsc::UnboundedSender<ObjectKey>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<ObjectKey>>>,
}

impl Default for Blocked {
    fn default() -> Self {
        let (trigger, receiver) = mpsc::unbounded_channel();
        Self {
            gauge: prometheus_client::metrics::gauge::Gauge::default(),
            watching: Arc::new(Mutex::new(Budget::new(
                MAX_BLOCKED_WATCHES_PER_TENANT,
                MAX_BLOCKED_WATCHES,
            ))),
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

    /// Watches `child` (an object of `resource` whose name `owner`'s child wants, `owner`
    /// being of tenant `tenant`) until it is gone, then triggers a reconcile of `owner`.
    /// Returns `false` when it cannot be watched (too many watches already for this tenant,
    /// or in all): the caller should poll instead.
    pub fn watch(
        &self,
        client: &kube::Client,
        resource: ApiResource,
        child: ObjectKey,
        owner: ObjectKey,
        tenant: &str,
    ) -> bool {
        {
            let Ok(mut watching) = self.watching.lock() else {
                return false;
            };
            match watching.take(&child, tenant) {
                Take::Watched => return true,
                Take::Full => return false,
                Take::Start => {}
            }
        }
        let api = match &child.namespace {
            Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource),
            None => Api::<DynamicObject>::all_with(client.clone(), &resource),
        };
        let trigger = self.trigger.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={}", child.name));
        let watching = Arc::clone(&self.watching);
        let gauge = self.gauge.clone();
        gauge.inc();
        tokio::spawn(async move {
            struct Live(prometheus_client::metrics::gauge::Gauge);
            impl Drop for Live {
                fn drop(&mut self) {
                    self.0.dec();
                }
            }
            let _live = Live(gauge);
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
                watching.release(&child);
            }
            let _ = trigger.send(owner);
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(name: &str) -> ObjectKey {
        ObjectKey::namespaced("ConfigMap", "ns", name)
    }

    #[test]
    fn one_tenant_cannot_use_up_the_watches_of_the_others() {
        let mut budget = Budget::new(2, 3);
        assert_eq!(budget.take(&cm("a1"), "a"), Take::Start);
        assert_eq!(budget.take(&cm("a2"), "a"), Take::Start);
        assert_eq!(budget.take(&cm("a1"), "a"), Take::Watched);
        // Tenant a is at its own limit; b still gets a watch.
        assert_eq!(budget.take(&cm("a3"), "a"), Take::Full);
        assert_eq!(budget.take(&cm("b1"), "b"), Take::Start);
        // The global backstop.
        assert_eq!(budget.take(&cm("c1"), "c"), Take::Full);
        budget.release(&cm("a1"));
        assert_eq!(budget.take(&cm("c1"), "c"), Take::Start);
        assert_eq!(
            budget.take(&cm("a3"), "a"),
            Take::Full,
            "the total is full again"
        );
        budget.release(&cm("b1"));
        assert_eq!(budget.take(&cm("a3"), "a"), Take::Start);
        budget.release(&cm("unknown"));
        assert_eq!(budget.watched.len(), 3);
    }

    #[test]
    fn the_shipped_limits_keep_a_tenant_below_the_total() {
        const { assert!(MAX_BLOCKED_WATCHES_PER_TENANT * 10 <= MAX_BLOCKED_WATCHES) };
    }
}
