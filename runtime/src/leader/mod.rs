//! Leader election on a Lease and the write fence that keeps a deposed or paused leader from
//! writing: one replica of several runs the controllers.
//!
//! - [`election`]: [`LeaderElection`] (which Lease, as whom, client-go's timings) starts a
//!   [`Leadership`]; client-go's `tryAcquireOrRenew` algorithm.
//! - [`fence`]: the [`Fence`] the election opens and closes, and the tower [`FenceLayer`] that
//!   refuses the kube client's writes while it is closed (also used for sharding,
//!   [`FenceMode::ShardMembership`]).
//!
//! The short path (what [`crate::manager::Manager`] does with `run --leader-elect`):
//!
//! ```no_run
//! # async fn run(client: kube::Client, work: impl std::future::Future<Output = ()>) -> Result<(), idem_runtime::leader::LeaderError> {
//! use idem_runtime::leader::{LeaderElection, default_identity};
//! let leader = LeaderElection::new("my-operator", "default", default_identity())
//!     .start(client.clone())?;
//! leader.acquired().await?; // a standby waits here (and is Ready: readiness does not
//!                           // depend on leadership)
//! let client = leader.fenced(&client); // give this client to the controllers
//! leader.while_leading(work).await?; // Err(Lost): the controllers were dropped at once
//! leader.release().await; // after a graceful stop: a standby takes over at once
//! # Ok(()) }
//! ```

pub mod election;
pub mod fence;

pub use election::{
    DEFAULT_CLOCK_SKEW, DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD,
    LeaderElection, LeaderError, Leadership, default_identity,
};
pub use fence::{Fence, FenceError, FenceLayer, FenceMode, FenceService, is_write};
