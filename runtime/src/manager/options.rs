//! How a [`Manager`](super::Manager) runs: the settings `run`'s flags fill in
//! ([`Cli`](super::Cli)).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How the manager runs; see `<binary> run --help`.
#[derive(Debug, Clone)]
pub struct ManagerOptions {
    /// Kubeconfig file; `None`: `KUBECONFIG`, `~/.kube/config`, then in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// Concurrent reconciles per controller.
    pub workers: usize,
    /// Reconciles of one tenant at once, per controller; 0 (the default of the flag): no
    /// cap, a tenant may use every idle worker and weights share workers under contention.
    pub tenant_concurrency: usize,
    /// Anti-entropy resync period (zero disables).
    pub resync_period: Duration,
    /// Address of `/metrics`.
    pub metrics_addr: SocketAddr,
    /// Address of `/healthz` and `/readyz`.
    pub health_addr: SocketAddr,
    /// Hold a Lease (named after the manager) before running controllers.
    pub leader_elect: bool,
    /// Namespace of the leader-election or shard member Leases (default: the client
    /// configuration's namespace: the pod's in a cluster, the kubeconfig context's or
    /// `default` outside).
    pub leader_elect_namespace: Option<String>,
    /// Identity in the Lease (default host name + pid).
    pub identity: Option<String>,
    /// How long a graceful shutdown (a signal) waits for in-flight reconciles; lost
    /// leadership cancels them at once.
    pub shutdown_grace: Duration,
    /// Shard the primaries across the replicas that hold a member Lease of the manager's ring
    /// (`--shards auto`, see [`crate::shard`]); excludes `leader_elect` (the manager refuses
    /// to run with both, [`ManagerError::Options`](super::ManagerError::Options)).
    pub shards: bool,
    /// The reconciles' API requests in flight at once, shared fairly among tenants
    /// ([`crate::inflight::RequestSlots`]).
    pub requests_in_flight: RequestsInFlight,
}

/// How many API requests of reconciles may be in flight at once (`--requests-in-flight`),
/// each free slot going to the tenant with the fewest in flight for its fair-share weight
/// (the weight the queue dispatched its reconcile with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestsInFlight {
    /// Caps that tune themselves: each tenant's from the API server's latency and
    /// throttling, the total from throttling
    /// ([`crate::inflight::AdaptiveLimit::default`]); the default.
    #[default]
    Auto,
    /// A cap pinned at this many (at least 1).
    Fixed(usize),
    /// No cap (and no fair sharing of requests).
    Unlimited,
}

impl RequestsInFlight {
    /// `auto`, a number, or `0` for no cap.
    ///
    /// # Errors
    /// A message for anything else.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "auto" => Ok(Self::Auto),
            "0" => Ok(Self::Unlimited),
            n => n.parse().map(Self::Fixed).map_err(|_| {
                format!("`{value}` is neither `auto` nor a number of requests (0: no cap)")
            }),
        }
    }

    /// The slots this asks for; `None` for no cap.
    pub(crate) fn slots(self) -> Option<crate::inflight::RequestSlots> {
        use crate::inflight::{AdaptiveLimit, RequestSlots};
        match self {
            Self::Auto => Some(RequestSlots::adaptive(AdaptiveLimit::default())),
            Self::Fixed(n) => Some(RequestSlots::new(n)),
            Self::Unlimited => None,
        }
    }
}

impl Default for ManagerOptions {
    /// The defaults of `run`'s flags.
    fn default() -> Self {
        Self {
            kubeconfig: None,
            workers: 4,
            tenant_concurrency: 0,
            resync_period: Duration::from_secs(10 * 3600),
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            health_addr: SocketAddr::from(([127, 0, 0, 1], 8081)),
            leader_elect: false,
            leader_elect_namespace: None,
            identity: None,
            shutdown_grace: Duration::from_secs(30),
            shards: false,
            requests_in_flight: RequestsInFlight::Auto,
        }
    }
}

impl ManagerOptions {
    /// The namespace of the Leases: [`Self::leader_elect_namespace`], else the client
    /// configuration's default namespace (`config_namespace`: in a cluster, the pod's
    /// ServiceAccount's namespace, where a ring's members are; from a kubeconfig, its
    /// context's namespace or `default`).
    pub(crate) fn lease_namespace(&self, config_namespace: &str) -> String {
        (self.leader_elect_namespace.clone()).unwrap_or_else(|| config_namespace.to_owned())
    }

    /// This replica's identity.
    pub(crate) fn identity(&self) -> String {
        (self.identity.clone()).unwrap_or_else(crate::leader::default_identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_namespace_is_the_flag_else_the_client_configurations() {
        let mut options = ManagerOptions::default();
        assert_eq!(options.lease_namespace("idem-system"), "idem-system");
        options.leader_elect_namespace = Some("leases".into());
        assert_eq!(options.lease_namespace("idem-system"), "leases");
    }

    #[tokio::test]
    async fn a_manager_asked_for_shards_and_leader_election_refuses_to_run() {
        let options = ManagerOptions {
            shards: true,
            leader_elect: true,
            ..ManagerOptions::default()
        };
        let result = crate::manager::Manager::new("both", options)
            .run_until(std::future::ready(()))
            .await;
        assert!(
            matches!(result, Err(crate::manager::ManagerError::Options(_))),
            "{result:?}"
        );
    }
}
