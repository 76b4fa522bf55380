//! Waiting for a condition on the server's state, by polling it, never by sleeping a fixed time.

use std::future::Future;
use std::time::Duration;

/// Longest wait for a condition: generous, because the machines that run the tests are
/// small and busy (two cores, other builds beside them).
pub const WAIT: Duration = Duration::from_secs(180);

/// Polls `check` every 250 ms until it returns `Ok`, and returns that value.
///
/// # Panics
/// After [`WAIT`], with `what` and the last `Err`'s text (the state it saw).
pub async fn eventually<T, Fut: Future<Output = Result<T, String>>>(
    what: &str,
    mut check: impl FnMut() -> Fut,
) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(why) => assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; last state: {why}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
