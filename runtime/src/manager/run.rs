//! The manager's modes: start-up (client, metrics, probes, Leases), a single or leader-elected
//! replica's run, and shutdown; the sharded mode's loop is [`super::sharded`], one run of the
//! controllers [`super::epoch`].

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::Reporter;
use kube::{Client, ResourceExt};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use super::epoch::{Epoch, Parts, reported};
use super::sharded::Sharded;
use super::{Manager, ManagerError, client};
use crate::apply::DriftMetrics;
use crate::leader::{Fence, LeaderElection};
use crate::metrics::Metrics;
use crate::shard::guard::{self, Ring};
use crate::shard::membership::{Membership, MembershipMetrics};
use crate::shard::selector::Selectors;

/// Applies `crds` and waits until each is established.
async fn install(
    client: &Client,
    name: &str,
    crds: &[CustomResourceDefinition],
) -> Result<(), ManagerError> {
    use kube::runtime::{conditions, wait::await_condition};
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in crds {
        let crd_name = crd.name_any();
        api.patch(
            &crd_name,
            &PatchParams::apply(name).force(),
            &Patch::Apply(crd),
        )
        .await?;
        let established = await_condition(api.clone(), &crd_name, conditions::is_crd_established());
        match tokio::time::timeout(Duration::from_secs(60), established).await {
            Ok(Ok(_)) => tracing::info!(crd = %crd_name, "CRD applied and established"),
            Ok(Err(e)) => {
                return Err(ManagerError::Crd {
                    name: crd_name,
                    message: e.to_string(),
                });
            }
            Err(_) => {
                return Err(ManagerError::Crd {
                    name: crd_name,
                    message: "not established within 60s".into(),
                });
            }
        }
    }
    Ok(())
}

/// Logs an error naming each CRD that is not installed: without it the watches only log the
/// API server's `404 page not found` (retried with backoff; they work once it is applied).
async fn report_missing(client: &Client, crds: &[CustomResourceDefinition]) {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in crds {
        let name = crd.name_any();
        match api.get_opt(&name).await {
            Ok(Some(_)) => {}
            Ok(None) => tracing::error!(
                crd = %name,
                "the CustomResourceDefinition {name} is not installed; install it (e.g. from `crds`; the watches retry until it exists)"
            ),
            Err(e) => {
                tracing::debug!(crd = %name, error = %e, "cannot check the CustomResourceDefinition")
            }
        }
    }
}

/// See [`Manager::run_until`].
pub(super) async fn run(
    manager: Manager,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ManagerError> {
    if manager.options.shards && manager.options.leader_elect {
        return Err(ManagerError::Options(
            "shards (--shards auto) and leader_elect (--leader-elect) exclude each other: a \
             ring shares the objects among its members, leader election gives them all to \
             one replica",
        ));
    }
    let crds = manager.crds()?;
    let Manager {
        name,
        options,
        sets,
        install_crds,
        ..
    } = manager;
    let kube_config = client::config(options.kubeconfig.as_deref()).await?;
    let selectors = Arc::new(Selectors::new(
        sets.iter().flat_map(|s| s.sharded()).collect(),
    ));
    // Its requests are counted with the controllers' (`idem_rest_client_requests_total`).
    let lease_client = kube::client::ClientBuilder::try_from(kube_config.clone())?
        .with_layer(&crate::shard::selector::SelectorLayer(Arc::clone(
            &selectors,
        )))
        .build();
    if install_crds {
        install(&lease_client, &name, &crds).await?;
    } else {
        report_missing(&lease_client, &crds).await;
    }
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let drift = DriftMetrics::new(&mut registry);
    let leader_status = Gauge::default();
    let identity = options.identity();
    let namespace = options.lease_namespace(&kube_config.default_namespace);
    let mut leadership = if options.leader_elect {
        tracing::info!(%identity, %namespace, "waiting to become leader");
        let mut election =
            LeaderElection::new(name.as_str(), namespace.as_str(), identity.as_str());
        election.status = leader_status.clone();
        Some(election.start(lease_client.clone())?)
    } else {
        None
    };
    let membership_metrics = MembershipMetrics::default();
    // The membership builds its Lease client on its own thread and runtime, so reconciles
    // on this runtime cannot delay a renewal.
    let membership_client = kube::client::ClientBuilder::try_from(kube_config.clone())?;
    let membership = options.shards.then(|| {
        tracing::info!(%identity, %namespace, "joining the shard ring");
        Membership::start_with(
            move || membership_client.build(),
            &name,
            &namespace,
            &identity,
            membership_metrics.clone(),
        )
    });
    let fence = match (&leadership, &membership) {
        (Some(lease), _) => lease.fence(),
        (None, Some(member)) => member.fence(),
        (None, None) => Fence::open(),
    };
    if leadership.is_none() {
        leader_status.set(1);
    }
    let owned = Gauge::default();
    let cached_children = Gauge::default();
    let cached_stubs = Gauge::default();
    let server_side: Gauge = Gauge::default();
    if membership.is_some() {
        match crate::shard::probe_server_side(&lease_client, &namespace).await {
            Ok(on) => {
                tracing::info!(server_side = on, "shardSelector support of the API server");
                (selectors.server_side).store(on, std::sync::atomic::Ordering::Relaxed);
                server_side.set(i64::from(on));
            }
            Err(e) => {
                tracing::warn!(error = %e, "probing shardSelector support failed; filtering on this side")
            }
        }
        registry.register(
            "idem_shard_members",
            "Live members of the shard ring as this replica last saw it",
            membership_metrics.members.clone(),
        );
        registry.register(
            "idem_shard_handovers",
            "Times this replica stopped working on a ring because its membership changed",
            membership_metrics.handovers.clone(),
        );
        registry.register(
            "idem_shard_working",
            "1 while this replica works on an acknowledged ring, 0 while it waits for one",
            membership_metrics.working.clone(),
        );
        registry.register(
            "idem_shard_server_side",
            "1 when the API server filters this replica's lists and watches by shardSelector",
            server_side,
        );
        registry.register(
            "idem_shard_owned_tenants",
            "Primaries (e.g. Tenants) in this replica's shard",
            owned.clone(),
        );
        registry.register(
            "idem_shard_child_cache_objects",
            "Objects in this replica's child caches (the children of its share of the owners)",
            cached_children.clone(),
        );
        registry.register(
            "idem_shard_child_cache_stubs",
            "Of the objects in this replica's child caches, those kept as stubs: not idem's \
             children (whatever they claim), or idem's holding more than 16 KiB that idem does \
             not own",
            cached_stubs.clone(),
        );
    }
    registry.register(
        "idem_watch_events_received",
        "Watch events this replica received (all watches of its controllers)",
        selectors.events_received.clone(),
    );
    registry.register(
        "idem_rest_client_requests",
        "Requests this replica sent to the API server (controllers, CRD install, leader \
         election; not the shard ring's), by method (GET, WATCH, POST, PUT, PATCH, DELETE) and HTTP status code",
        selectors.requests.clone(),
    );
    registry.register(
        "idem_received_bytes",
        "Bytes of GET responses (lists, watches, reads) this replica received",
        selectors.bytes_received.clone(),
    );
    registry.register(
        "leader_election_master_status",
        "1 while this replica is the leader (always 1 without leader election)",
        leader_status,
    );
    registry.register(
        "idem_fenced_writes",
        "Writes refused because this replica's leader lease was not valid",
        fence.refused.clone(),
    );
    let slots = options.requests_in_flight.slots();
    if let Some(slots) = &slots {
        slots.register(&mut registry);
    }
    let registry = Arc::new(registry);
    let parts = Parts {
        slots,
        kept: std::sync::Mutex::default(),
        sets,
        reporter: Reporter {
            controller: name.clone(),
            instance: Some(identity.clone()),
        },
        options,
        metrics,
        drift,
    };
    let (ready_tx, ready_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let servers = crate::http::start(
        parts.options.metrics_addr,
        parts.options.health_addr,
        Arc::clone(&registry),
        ready_rx,
        stop_rx.clone(),
    )
    .await
    .map_err(|source| ManagerError::Io {
        what: "binding the metrics/health addresses (--metrics-addr, --health-addr)",
        source,
    })?;
    tracing::info!(
        metrics = %parts.options.metrics_addr,
        health = %parts.options.health_addr,
        "serving /metrics on the metrics address, /healthz and /readyz on the health address"
    );
    let stop_servers =
        |stop_tx: watch::Sender<bool>,
         servers: Vec<(std::net::SocketAddr, tokio::task::JoinHandle<()>)>| async move {
            let _ = stop_tx.send(true);
            for (_, task) in servers {
                let _ = task.await;
            }
        };
    let mut shutdown = std::pin::pin!(shutdown);

    if let Some(membership) = membership {
        let sharded = Sharded {
            config: &kube_config,
            fence: &fence,
            ready: &ready_tx,
            identity: &identity,
            parts: &parts,
            selectors: &selectors,
            owned: &owned,
            cached_children: &cached_children,
            cached_stubs: &cached_stubs,
        };
        let result = sharded.run(&membership, &mut shutdown).await;
        membership.leave().await;
        stop_servers(stop_tx, servers).await;
        return result;
    }

    let client = client::fenced(
        kube_config.clone(),
        Arc::clone(&fence),
        Fence::open(),
        Arc::clone(&selectors),
        parts.slots.as_ref(),
    )?;
    // Not a member of the shard ring: not beside a live one (it would reconcile everything
    // a second time).
    let mut guard = guard::start(lease_client.clone(), &namespace, &name);
    // At start, beside a live ring: nothing reconciled until the ring is gone (e.g. the
    // replicas of a Deployment switched away from `--shards` being replaced). Ready meanwhile,
    // as a standby is: the rolling update that replaces the ring's replicas waits for this
    // one to be ready, and the ring goes only once they are replaced.
    let clear = async {
        let mut said = false;
        loop {
            let ring = guard.borrow_and_update().clone();
            match ring {
                Ring::None => return,
                Ring::Live(why) if !said => {
                    said = true;
                    let _ = ready_tx.send(true);
                    tracing::error!(problem = %why, "refusing to run while the shard ring is live: this replica reconciles nothing until it is gone (ready meanwhile, as a standby, so that a rolling update goes on)");
                }
                _ => {}
            }
            if guard.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = clear => {
            // Ready again once its caches are (or as a standby, below).
            let _ = ready_tx.send(false);
        }
        () = &mut shutdown => {
            if let Some(lease) = leadership.take() {
                lease.release().await;
            }
            let _ = stop_tx.send(true);
            return Ok(());
        }
    }
    // Once working, a ring that comes alive makes it exit.
    let ring_live = async move {
        let ring = guard.wait_for(|r| matches!(r, Ring::Live(_))).await;
        match ring.map(|r| r.clone()) {
            Ok(Ring::Live(why)) => why,
            _ => std::future::pending().await,
        }
    };
    let mut ring_live = std::pin::pin!(ring_live);

    if let Some(lease) = leadership.as_mut() {
        // A standby is ready: readiness does not depend on leadership.
        let _ = ready_tx.send(true);
        tokio::select! {
            acquired = lease.acquired() => {
                acquired?;
                tracing::info!(%identity, "became leader");
            }
            why = &mut ring_live => {
                // As a leader does (below): the process exits, and its restart waits, not
                // ready, while the ring is live, and competes again once it is gone.
                tracing::error!(problem = %why, "refusing to run on: exiting");
                let _ = ready_tx.send(false);
                if let Some(lease) = leadership.take() {
                    lease.release().await;
                }
                stop_servers(stop_tx, servers).await;
                return Err(ManagerError::RingLive(why));
            }
            () = &mut shutdown => {
                if let Some(lease) = leadership.take() {
                    lease.release().await;
                }
                let _ = stop_tx.send(true);
                return Ok(());
            }
        }
    }

    let epoch = parts.start(&client, None, stop_rx.clone());
    let mut synced = epoch.synced.clone();
    let readiness = tokio::spawn({
        let ready_tx = ready_tx.clone();
        async move {
            let _ = synced.wait_for(|s| *s).await;
            tracing::info!("all caches synced");
            // Not ready again while a watch is not established (e.g. a CRD deleted).
            crate::controller::all_ready(vec![synced], ready_tx).await;
        }
    });
    let lost = async {
        match &leadership {
            Some(lease) => lease.lost().await,
            None => std::future::pending().await,
        }
    };
    let Epoch {
        stopped: mut controllers,
        tasks,
        ..
    } = epoch;
    let abort = |tasks: &[tokio::task::JoinHandle<()>]| {
        tasks.iter().for_each(tokio::task::JoinHandle::abort)
    };
    let stopped = tokio::select! {
        reports = &mut controllers => reports,
        () = &mut shutdown => {
            tracing::info!("shutdown requested: finishing in-flight reconciles");
            let _ = stop_tx.send(true);
            controllers.await
        }
        why = &mut ring_live => {
            // Cancelled at once, as on lost leadership, and the process exits: its restart
            // (the kubelet's) waits, ready as a standby, while the ring is live and works once
            // it is gone, where staying up refused would answer /healthz and never work again.
            tracing::error!(problem = %why, "refusing to run on: cancelling every reconcile and exiting");
            let _ = ready_tx.send(false);
            drop(controllers);
            abort(&tasks);
            readiness.abort();
            if let Some(lease) = leadership.take() {
                lease.release().await;
            }
            stop_servers(stop_tx, servers).await;
            return Err(ManagerError::RingLive(why));
        }
        () = lost => {
            // The fence already refuses writes; dropping the controllers aborts their
            // workers (in-flight reconciles included) and watches now, with no grace period.
            tracing::error!("lost leadership: cancelling every reconcile and exiting");
            drop(controllers);
            abort(&tasks);
            stop_servers(stop_tx, servers).await;
            return Err(ManagerError::LostLeadership);
        }
    };
    readiness.abort();
    let _ = stop_tx.send(true);
    abort(&tasks);
    let result = reported(stopped);
    if let Some(lease) = leadership {
        lease.release().await;
    }
    for (_, task) in servers {
        let _ = task.await;
    }
    result
}
