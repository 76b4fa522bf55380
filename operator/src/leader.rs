//! The operator's leader-election configuration: which Lease it competes for, with
//! client-go's default timings. The algorithm and the write fence are idem-runtime's
//! ([`idem_runtime::leader`]); sharding ([`crate::shard::membership`]) uses the same timings.

use std::time::Duration;

use idem_runtime::leader::{self, LeaderElection};

/// The Lease's name.
pub const LEASE_NAME: &str = "idem-operator";
/// How long a Lease is valid without renewal ([`leader::DEFAULT_LEASE_DURATION`], client-go's
/// `LeaseDuration` default).
pub const LEASE_DURATION: Duration = leader::DEFAULT_LEASE_DURATION;
/// [`LEASE_DURATION`] in whole seconds, as written to `leaseDurationSeconds`.
pub const LEASE_SECONDS: u64 = LEASE_DURATION.as_secs();
/// How often a replica reads (and the holder renews) its Lease
/// ([`leader::DEFAULT_RETRY_PERIOD`], client-go's `RetryPeriod` default).
pub const RETRY_PERIOD: Duration = leader::DEFAULT_RETRY_PERIOD;
/// What the fence subtracts from the lease duration ([`leader::DEFAULT_CLOCK_SKEW`]).
pub const CLOCK_SKEW: Duration = leader::DEFAULT_CLOCK_SKEW;

/// The operator's election: Lease [`LEASE_NAME`] in `namespace`, held as `identity`, with
/// client-go's default timings.
pub fn election(namespace: &str, identity: &str) -> LeaderElection {
    LeaderElection::new(LEASE_NAME, namespace, identity)
}
