//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager): only the holder runs
//! controllers; a standby takes over once the holder stops renewing.

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;

/// The Lease's name.
pub const LEASE_NAME: &str = "idem-operator";
/// How long a Lease is valid without renewal, in seconds (client-go's leader election default
/// `LeaseDuration` is 15 s).
pub const LEASE_SECONDS: u64 = 15;
/// How many seconds before expiry the holder renews (client-go's `RenewDeadline` is 10 s of 15).
pub const GRACE_SECONDS: u64 = 5;

/// A held (or awaited) leadership.
pub struct Leadership {
    rx: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
}

impl Leadership {
    /// Starts competing for the Lease `LEASE_NAME` in `namespace` as `identity`.
    ///
    /// # Errors
    /// When the Lease cannot be read or created.
    pub async fn start(
        client: Client,
        namespace: &str,
        identity: &str,
    ) -> Result<Self, LeaseManagerError> {
        let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(LEASE_SECONDS)
            .with_grace(GRACE_SECONDS)
            .build()
            .await?;
        let (rx, task) = manager.watch().await;
        Ok(Self { rx, task })
    }

    /// Resolves once this replica holds the Lease.
    pub async fn acquired(&mut self) {
        let _ = self.rx.wait_for(|leader| *leader).await;
    }

    /// Resolves when leadership is lost after being held.
    pub async fn lost(&self) {
        let mut rx = self.rx.clone();
        let _ = rx.wait_for(|leader| !*leader).await;
    }

    /// Releases the Lease so a standby takes over at once.
    pub async fn release(self) {
        drop(self.rx);
        match self.task.await {
            Ok(Ok(_)) => tracing::info!("released the leader Lease"),
            Ok(Err(e)) => tracing::warn!(error = %e, "could not release the leader Lease"),
            Err(e) => tracing::warn!(error = %e, "leader election task failed"),
        }
    }
}
