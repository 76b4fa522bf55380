//! The bounded retry used on 409 Conflict: client-go's `retry.DefaultRetry` shape.

use std::time::Duration;

use rand::Rng;

/// How often and how long to retry an optimistic-concurrency write that met 409 Conflict.
///
/// The default is client-go's `retry.DefaultRetry` (k8s.io/client-go/util/retry):
/// 5 attempts in all, 10 ms between attempts, factor 1.0, jitter 0.1 — so a write that keeps
/// conflicting gives up after about 40–44 ms of waiting. client-go's `DefaultBackoff`
/// (4 attempts, 10 ms, factor 5, jitter 0.1: waits of 10, 50, 250 ms) is available as
/// [`RetryPolicy::client_go_default_backoff`] for writes that contend harder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, including the first; at least 1.
    pub attempts: u32,
    /// Wait before the second attempt.
    pub initial: Duration,
    /// Each later wait is the previous one times this factor (≥ 1.0).
    pub factor: f64,
    /// Each wait is lengthened by a random fraction in `[0, jitter)` of itself.
    pub jitter: f64,
    /// No single wait exceeds this.
    pub max_wait: Duration,
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
            initial: Duration::from_millis(10),
            factor: 1.0,
            jitter: 0.1,
            max_wait: Duration::from_secs(10),
        }
    }

    /// client-go `retry.DefaultBackoff`: 4 attempts, 10 ms, factor 5.0, jitter 0.1.
    pub fn client_go_default_backoff() -> Self {
        Self {
            attempts: 4,
            initial: Duration::from_millis(10),
            factor: 5.0,
            jitter: 0.1,
            max_wait: Duration::from_secs(10),
        }
    }

    /// The wait before attempt `attempt` (0-based; attempt 0 has no wait), jitter included.
    pub fn wait_before(&self, attempt: u32) -> Duration {
        if attempt == 0 {
            return Duration::ZERO;
        }
        let factor = self.factor.max(1.0);
        let exponent = i32::try_from(attempt - 1).unwrap_or(i32::MAX);
        let base = self.initial.as_secs_f64() * factor.powi(exponent);
        let jitter = if self.jitter > 0.0 {
            rand::rng().random_range(0.0..self.jitter)
        } else {
            0.0
        };
        let secs = (base * (1.0 + jitter)).min(self.max_wait.as_secs_f64());
        Duration::try_from_secs_f64(secs).unwrap_or(self.max_wait)
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let p = RetryPolicy {
            attempts: 0,
            factor: 1e9,
            ..RetryPolicy::default()
        };
        assert_eq!(p.attempts(), 1);
        assert_eq!(p.wait_before(40), p.max_wait);
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
