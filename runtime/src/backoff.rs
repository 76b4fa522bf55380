//! idem's one exponential backoff: per key after failed reconciles (`Backoff`, reset on
//! success, with a consecutive-failure count the reconcile can read) and between the attempts
//! of a write that met 409 Conflict ([`RetryPolicy`]), both spaced by a [`BackoffConfig`].
//!
//! The n-th wait (n ≥ 1) is `min(base × factor^(n-1), cap) × (1 + u)`, `u` uniform in
//! `[0, jitter)` (client-go's `wait.Jitter`). So a wait may exceed `cap` by less than
//! `jitter × cap`; the jitter keeps keys that failed together from retrying in lockstep.
//! Per-key defaults: base 200 ms, factor 2, cap 5 min, jitter 10% (idem's choice;
//! client-go's per-item default is 5 ms doubling to 1,000 s without jitter, kube-runtime leaves
//! it to the error policy). A success resets the key, and a reconcile-requested
//! `requeue_after` bypasses backoff entirely (the controller handles that).
//!
//! Watches wait between failed attempts too (`watch_backoff`), reset only by progress.

use std::collections::HashMap;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use kube::runtime::watcher::{self, Event};
use rand::Rng;

use crate::key::ObjectKey;

/// Errors in a [`BackoffConfig`].
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BackoffError {
    /// The base delay was zero: every retry would be immediate (a hot loop).
    #[error("backoff base must be greater than zero")]
    ZeroBase,
    /// The cap was below the base delay.
    #[error("backoff cap {cap:?} is below base {base:?}")]
    CapBelowBase {
        /// The configured base.
        base: Duration,
        /// The configured cap.
        cap: Duration,
    },
    /// The factor was below 1 (or not a finite number): delays would shrink.
    #[error("backoff factor {0} must be a finite number ≥ 1")]
    BadFactor(f64),
    /// The jitter fraction was outside `[0, 1)` (or not a finite number).
    #[error("backoff jitter {0} must be a finite number in [0, 1)")]
    BadJitter(f64),
}

/// How retries after a failed reconcile are spaced.
#[derive(Clone, Debug, PartialEq)]
pub struct BackoffConfig {
    /// Wait after the first failure. Default 200 ms.
    pub base: Duration,
    /// Multiplier per further consecutive failure (≥ 1). Default 2.
    pub factor: f64,
    /// Largest wait before jitter. Default 5 min.
    pub cap: Duration,
    /// Jitter as a fraction of the wait, added, in `[0, 1)`. Default 0.1 (up to +10%).
    pub jitter: f64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(200),
            factor: 2.0,
            cap: Duration::from_secs(300),
            jitter: 0.1,
        }
    }
}

impl BackoffConfig {
    /// Check the configuration.
    ///
    /// # Errors
    /// One [`BackoffError`] per broken rule: base > 0, cap ≥ base, factor ≥ 1, jitter in [0, 1).
    pub fn validate(&self) -> Result<(), BackoffError> {
        if self.base.is_zero() {
            return Err(BackoffError::ZeroBase);
        }
        if self.cap < self.base {
            return Err(BackoffError::CapBelowBase {
                base: self.base,
                cap: self.cap,
            });
        }
        if !self.factor.is_finite() || self.factor < 1.0 {
            return Err(BackoffError::BadFactor(self.factor));
        }
        if !self.jitter.is_finite() || !(0.0..1.0).contains(&self.jitter) {
            return Err(BackoffError::BadJitter(self.jitter));
        }
        Ok(())
    }

    /// The wait before jitter after `failures` consecutive failures (0 failures → zero).
    pub fn nominal(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let exp = i32::try_from(failures - 1).unwrap_or(i32::MAX);
        let secs = self.base.as_secs_f64() * self.factor.powi(exp);
        let cap = self.cap.as_secs_f64();
        Duration::from_secs_f64(if secs.is_finite() { secs.min(cap) } else { cap })
    }

    /// The jittered wait after `failures` consecutive failures, drawing from `rng`.
    pub fn delay(&self, failures: u32, rng: &mut impl Rng) -> Duration {
        let nominal = self.nominal(failures);
        if self.jitter == 0.0 || nominal.is_zero() {
            return nominal;
        }
        let u: f64 = rng.random_range(0.0..self.jitter);
        nominal.mul_f64(1.0 + u)
    }
}

/// The waits between a watch's failed attempts: kube-runtime's `default_backoff` values
/// (0.8 s doubling to 30 s), with 10 % jitter.
pub(crate) const WATCH_BACKOFF: BackoffConfig = BackoffConfig {
    base: Duration::from_millis(800),
    factor: 2.0,
    cap: Duration::from_secs(30),
    jitter: 0.1,
};

/// `stream`, a watcher's events, waiting before it is polled again after each error
/// ([`WATCH_BACKOFF`], growing with consecutive errors), reset only by progress: an object, a
/// deletion, a complete list; never by the `Init` a watcher yields before each attempt to
/// list. kube-runtime's `default_backoff` resets on any event, so a list that keeps failing (a
/// CRD not installed, a list RBAC refuses) was sent again about every second, for good.
pub(crate) fn watch_backoff<K, S>(stream: S) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Send,
    S: Stream<Item = watcher::Result<Event<K>>> + Send,
{
    let state = (Box::pin(stream), 0u32, false);
    futures::stream::unfold(state, |(mut stream, mut failures, wait)| async move {
        if wait {
            let delay = WATCH_BACKOFF.delay(failures, &mut rand::rng());
            tokio::time::sleep(delay).await;
        }
        let item = stream.next().await?;
        let wait = match &item {
            Err(_) => {
                failures = failures.saturating_add(1);
                true
            }
            Ok(Event::Init) => false,
            Ok(_) => {
                failures = 0;
                false
            }
        };
        Some((item, (stream, failures, wait)))
    })
}

/// How often and how long to retry an optimistic-concurrency write that met 409 Conflict:
/// `attempts` in all, the n-th retry after [`BackoffConfig::delay`]`(n)`.
///
/// The default is client-go's `retry.DefaultRetry` (k8s.io/client-go/util/retry):
/// 5 attempts in all, 10 ms between attempts, factor 1.0, jitter 0.1 — so a write that keeps
/// conflicting gives up after about 40–44 ms of waiting. client-go's `DefaultBackoff`
/// (4 attempts, 10 ms, factor 5, jitter 0.1: waits of 10, 50, 250 ms) is available as
/// [`RetryPolicy::client_go_default_backoff`] for writes that contend harder.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, including the first; at least 1.
    pub attempts: u32,
    /// The waits between attempts (its `cap` bounds a wait before jitter).
    pub backoff: BackoffConfig,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::client_go_default_retry()
    }
}

impl RetryPolicy {
    /// client-go `retry.DefaultRetry`: 5 attempts, 10 ms, factor 1.0, jitter 0.1.
    pub fn client_go_default_retry() -> Self {
        Self {
            attempts: 5,
            backoff: BackoffConfig {
                base: Duration::from_millis(10),
                factor: 1.0,
                cap: Duration::from_secs(10),
                jitter: 0.1,
            },
        }
    }

    /// client-go `retry.DefaultBackoff`: 4 attempts, 10 ms, factor 5.0, jitter 0.1.
    pub fn client_go_default_backoff() -> Self {
        Self {
            attempts: 4,
            backoff: BackoffConfig {
                base: Duration::from_millis(10),
                factor: 5.0,
                cap: Duration::from_secs(10),
                jitter: 0.1,
            },
        }
    }

    /// The wait before attempt `attempt` (0-based; attempt 0 has no wait), jitter included.
    pub fn wait_before(&self, attempt: u32) -> Duration {
        self.backoff.delay(attempt, &mut rand::rng())
    }

    /// Attempts in all, never less than one.
    pub fn attempts(&self) -> u32 {
        self.attempts.max(1)
    }

    /// Sleeps before attempt `attempt` (no sleep for attempt 0).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future only skips the sleep.
    pub async fn sleep_before(&self, attempt: u32) {
        let wait = self.wait_before(attempt);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Consecutive-failure counts per key, and the retry delays they imply.
#[derive(Debug)]
pub(crate) struct Backoff {
    config: BackoffConfig,
    failures: HashMap<ObjectKey, u32>,
}

impl Backoff {
    /// Backoff state with a validated `config`.
    ///
    /// # Errors
    /// See [`BackoffConfig::validate`].
    pub fn new(config: BackoffConfig) -> Result<Self, BackoffError> {
        config.validate()?;
        Ok(Self {
            config,
            failures: HashMap::new(),
        })
    }

    /// Record a failure of `key`: returns the new consecutive-failure count and the jittered
    /// wait before the retry.
    pub fn failure(&mut self, key: &ObjectKey) -> (u32, Duration) {
        let count = self.failures.entry(key.clone()).or_insert(0);
        *count = count.saturating_add(1);
        let n = *count;
        (n, self.config.delay(n, &mut rand::rng()))
    }

    /// Record a success of `key`: its count goes back to 0.
    pub fn success(&mut self, key: &ObjectKey) {
        self.failures.remove(key);
    }

    /// Consecutive failures of `key` so far (0 if its last reconcile succeeded).
    pub fn failures(&self, key: &ObjectKey) -> u32 {
        self.failures.get(key).copied().unwrap_or(0)
    }

    /// Forget `key` (it was deleted).
    pub fn forget(&mut self, key: &ObjectKey) {
        self.failures.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn key() -> ObjectKey {
        ObjectKey::namespaced("App", "ns", "a")
    }

    /// When each item of `items` comes out of [`watch_backoff`], in virtual seconds since
    /// the start.
    async fn times(items: Vec<watcher::Result<Event<()>>>) -> Vec<f64> {
        let start = tokio::time::Instant::now();
        let stream = watch_backoff(futures::stream::iter(items));
        stream
            .map(|_| (tokio::time::Instant::now() - start).as_secs_f64())
            .collect()
            .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_waits_longer_after_each_failed_list_until_it_makes_progress() {
        let (init, fail) = (
            || Ok(Event::Init),
            || Err(watcher::Error::NoResourceVersion),
        );
        // A list that fails three times (the watcher yields `Init` before each attempt), then
        // succeeds; then a watch error.
        let items = vec![
            init(),
            fail(),
            init(),
            fail(),
            init(),
            fail(),
            init(),
            Ok(Event::InitApply(())),
            Ok(Event::InitDone),
            fail(),
            Ok(Event::Apply(())),
        ];
        let t = times(items).await;
        let gap = |i: usize| t[i] - t[i - 1];
        // Tokio's timer rounds a sleep up to its next millisecond: a jitter just under 10 %
        // comes out at 10 % (3.2 s + 9.99 % slept 3.520 s in one run).
        const TICK: f64 = 0.001;
        // Waits of 0.8, 1.6, 3.2 s (+ up to 10 %) after the failures, not reset by `Init`.
        for (i, nominal) in [(2, 0.8), (4, 1.6), (6, 3.2)] {
            assert!(
                (nominal..nominal * 1.1 + TICK).contains(&gap(i)),
                "wait {} s before item {i}, {nominal} s nominal: {t:?}",
                gap(i)
            );
        }
        // Progress (the objects of a complete list) resets it: 0.8 s again.
        assert!((0.8..0.88 + TICK).contains(&gap(10)), "{t:?}");
        // No wait where nothing failed.
        assert_eq!([gap(1), gap(3), gap(7), gap(8), gap(9)], [0.0; 5], "{t:?}");
    }

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let c = BackoffConfig::default();
        c.validate().unwrap();
        assert_eq!(c.base, Duration::from_millis(200));
        assert_eq!(c.cap, Duration::from_secs(300));
        assert_eq!(c.factor, 2.0);
        assert_eq!(c.jitter, 0.1);
    }

    #[test]
    fn nominal_doubles_then_caps() {
        let c = BackoffConfig::default();
        assert_eq!(c.nominal(0), Duration::ZERO);
        assert_eq!(c.nominal(1), Duration::from_millis(200));
        assert_eq!(c.nominal(2), Duration::from_millis(400));
        assert_eq!(c.nominal(5), Duration::from_millis(3200));
        assert_eq!(c.nominal(12), Duration::from_secs(300)); // 409.6 s capped
        assert_eq!(c.nominal(u32::MAX), Duration::from_secs(300)); // no overflow
    }

    #[test]
    fn jitter_stays_within_ten_percent_and_varies() {
        let c = BackoffConfig::default();
        let mut rng = StdRng::seed_from_u64(7);
        let delays: Vec<Duration> = (0..200).map(|_| c.delay(3, &mut rng)).collect();
        for d in &delays {
            assert!(
                *d >= Duration::from_millis(720) && *d <= Duration::from_millis(880),
                "{d:?}"
            );
        }
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "jitter should spread delays");
    }

    #[test]
    fn count_grows_and_success_resets() {
        let mut b = Backoff::new(BackoffConfig {
            jitter: 0.0,
            ..BackoffConfig::default()
        })
        .unwrap();
        assert_eq!(b.failures(&key()), 0);
        assert_eq!(b.failure(&key()), (1, Duration::from_millis(200)));
        assert_eq!(b.failure(&key()), (2, Duration::from_millis(400)));
        assert_eq!(b.failures(&key()), 2);
        b.success(&key());
        assert_eq!(b.failures(&key()), 0);
        assert_eq!(b.failure(&key()), (1, Duration::from_millis(200)));
    }

    #[test]
    fn failures_keep_counting_at_the_cap() {
        let mut b = Backoff::new(BackoffConfig {
            jitter: 0.0,
            ..BackoffConfig::default()
        })
        .unwrap();
        let mut last = (0, Duration::ZERO);
        for _ in 0..20 {
            last = b.failure(&key());
        }
        assert_eq!(last, (20, Duration::from_secs(300)));
    }

    #[test]
    fn invalid_configs_are_typed_errors() {
        let d = BackoffConfig::default();
        let cap_low = BackoffConfig {
            cap: Duration::from_millis(100),
            ..d.clone()
        };
        assert!(matches!(
            Backoff::new(cap_low).unwrap_err(),
            BackoffError::CapBelowBase { .. }
        ));
        let f = BackoffConfig {
            factor: 0.5,
            ..d.clone()
        };
        assert_eq!(f.validate(), Err(BackoffError::BadFactor(0.5)));
        let nan = BackoffConfig {
            factor: f64::NAN,
            ..d.clone()
        };
        assert!(matches!(nan.validate(), Err(BackoffError::BadFactor(_))));
        let z = BackoffConfig {
            base: Duration::ZERO,
            ..d.clone()
        };
        assert_eq!(z.validate(), Err(BackoffError::ZeroBase));
        let j = BackoffConfig { jitter: 1.5, ..d };
        assert_eq!(j.validate(), Err(BackoffError::BadJitter(1.5)));
    }

    #[test]
    fn default_retry_waits_are_bounded() {
        let p = RetryPolicy::default();
        assert_eq!(p.attempts(), 5);
        assert_eq!(p.wait_before(0), Duration::ZERO);
        for attempt in 1..5 {
            let w = p.wait_before(attempt);
            assert!(
                w >= Duration::from_millis(10) && w < Duration::from_millis(11),
                "{w:?}"
            );
        }
    }

    #[test]
    fn default_backoff_grows_by_five() {
        let p = RetryPolicy::client_go_default_backoff();
        let w3 = p.wait_before(3);
        assert!(
            w3 >= Duration::from_millis(250) && w3 < Duration::from_millis(275),
            "{w3:?}"
        );
    }

    #[test]
    fn zero_attempts_still_tries_once_and_waits_are_capped() {
        let d = RetryPolicy::default();
        let p = RetryPolicy {
            attempts: 0,
            backoff: BackoffConfig {
                factor: 1e9,
                ..d.backoff.clone()
            },
        };
        assert_eq!(p.attempts(), 1);
        let cap = p.backoff.cap;
        let w = p.wait_before(40);
        assert!(w >= cap && w < cap.mul_f64(1.1), "{w:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_uses_tokio_time() {
        let start = tokio::time::Instant::now();
        RetryPolicy::default().sleep_before(1).await;
        let slept = start.elapsed();
        // 10 ms + up to 10 % jitter, plus tokio's 1 ms timer granularity.
        assert!(
            slept >= Duration::from_millis(10) && slept <= Duration::from_millis(12),
            "{slept:?}"
        );
    }
}
