//! One run of every set of controllers (an epoch): what each run needs, starting one, what its
//! controllers reported when it stopped, and a replica's refusal to run at all.

use std::sync::Arc;

use kube::Client;
use kube::runtime::events::Reporter;
use tokio::sync::watch;

use super::controllers::{Controllers, Shard, Start, Stopped};
use super::{ManagerError, ManagerOptions};
use crate::apply::{ChildCaches, DriftMetrics};
use crate::controller::ControllerConfig;
use crate::metrics::Metrics;

/// What every run of the controllers needs.
pub(super) struct Parts {
    pub(super) sets: Vec<Arc<dyn Controllers>>,
    pub(super) options: ManagerOptions,
    pub(super) metrics: Metrics,
    pub(super) drift: DriftMetrics,
    pub(super) reporter: Reporter,
    /// The reconciles' request slots (`--requests-in-flight`), shared by every run.
    pub(super) slots: Option<crate::inflight::RequestSlots>,
    /// Each set's child caches, kept from one sharded run to the next ([`Start::caches`]).
    pub(super) kept: std::sync::Mutex<Vec<Option<ChildCaches>>>,
}

/// One run of every set of controllers: until `stop` (graceful) or until dropped (cancelled).
pub(super) struct Epoch {
    /// Every controller's name and report once they stopped.
    pub(super) stopped: futures::future::BoxFuture<'static, Vec<Stopped>>,
    /// Tasks of the run, aborted with it.
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
    /// True while every controller's caches are synced and their watches established.
    pub(super) synced: watch::Receiver<bool>,
    /// How many primaries each set holds in this replica's shard.
    pub(super) owned: Vec<Arc<dyn Fn() -> usize + Send + Sync>>,
    /// The child caches of the run.
    pub(super) caches: Vec<ChildCaches>,
}

impl Epoch {
    /// Keeps `ready` equal to the run's synced signal, as a task of the run.
    pub(super) fn tasks_push_readiness(&mut self, ready: watch::Sender<bool>) {
        let synced = self.synced.clone();
        self.tasks.push(tokio::spawn(crate::controller::all_ready(
            vec![synced],
            ready,
        )));
    }
}

impl Parts {
    /// Starts every set of controllers on `client`; with `shard`, each reconciles only its
    /// share.
    pub(super) fn start(
        &self,
        client: &Client,
        shard: Option<&Shard>,
        stop: watch::Receiver<bool>,
    ) -> Epoch {
        let config = ControllerConfig {
            workers: self.options.workers,
            per_tenant_cap: (self.options.tenant_concurrency > 0)
                .then_some(self.options.tenant_concurrency),
            resync_period: self.options.resync_period,
            shutdown_grace: self.options.shutdown_grace,
            ..ControllerConfig::default()
        };
        let mut stopped = Vec::new();
        let mut synced = Vec::new();
        let mut epoch = Epoch {
            stopped: Box::pin(async { Vec::new() }),
            tasks: Vec::new(),
            synced: watch::channel(false).1,
            owned: Vec::new(),
            caches: Vec::new(),
        };
        let mut kept = (self.kept.lock()).unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.resize(self.sets.len(), None);
        for (set, kept) in self.sets.iter().zip(kept.iter_mut()) {
            // A sharded run goes on with the caches of the run before (its child watches keep
            // what is still theirs); any other starts afresh and keeps nothing.
            let caches = match shard {
                Some(_) => kept.get_or_insert_with(ChildCaches::new).clone(),
                None => {
                    *kept = None;
                    ChildCaches::new()
                }
            };
            let running = set.start(Start {
                client,
                config: &config,
                metrics: &self.metrics,
                drift: &self.drift,
                reporter: &self.reporter,
                shard,
                stop: stop.clone(),
                caches,
            });
            stopped.push(running.stopped);
            synced.push(running.synced);
            epoch.tasks.extend(running.tasks);
            epoch.owned.extend(running.owned);
            epoch.caches.extend(running.caches);
        }
        let (synced_tx, synced_rx) = watch::channel(false);
        epoch.tasks.push(tokio::spawn(crate::controller::all_ready(
            synced, synced_tx,
        )));
        epoch.synced = synced_rx;
        epoch.stopped = Box::pin(async move {
            futures::future::join_all(stopped)
                .await
                .into_iter()
                .flatten()
                .collect()
        });
        epoch
    }
}

/// The first controller that failed to start, else the reports logged.
pub(super) fn reported(stopped: Vec<Stopped>) -> Result<(), ManagerError> {
    for (name, report) in stopped {
        match report {
            Ok(report) => tracing::info!(
                controller = %name,
                dropped = report.dropped.len(),
                abandoned = report.abandoned.len(),
                "controller stopped"
            ),
            Err(source) => return Err(ManagerError::Controller { name, source }),
        }
    }
    Ok(())
}
