//! Crash-safe: for k = 1, 2, … up to the requests of a clean convergence, a fresh instance is
//! reconciled by a client that aborts the reconcile right after its k-th request was carried
//! out (the reconcile never sees the answer, as when the process dies); then a clean client
//! converges it. Each end state must equal the clean one: no duplicate, no orphan, no missing
//! child, the same status.

use super::harness::{Harness, Reference};
use super::probe::Probe;
use super::report::CheckReport;
use super::{Error, Subject};

/// Runs the check.
///
/// # Errors
/// [`Error::Setup`] when the cluster cannot be read or written by the kit.
pub(crate) async fn run<S: Subject>(
    h: &Harness<'_, S>,
    reference: &Reference<S>,
    r: &mut CheckReport,
) -> Result<(), Error> {
    let total = reference.convergence.requests();
    let points = h.options.crash_points.map_or(total, |n| n.min(total));
    r.figure("crash points", points);
    let mut failures = 0;
    let mut not_reached = 0;
    for k in 1..=points {
        let instance = h.instance().await?;
        let follow = h.follow(reference, &instance).await?;
        let probe = Probe::tripping_after(k);
        let session = match h.session(probe.clone()).await? {
            Ok(s) => s,
            Err(e) => {
                r.fail(e);
                break;
            }
        };
        // Passes as a controller would make them, until the probe trips (or it converged
        // in fewer requests than k this time).
        let _ = h.converge(&session, &probe, &instance).await?;
        drop(session);
        let sent = probe.sent();
        let point = match sent.get(k - 1) {
            Some(req) if probe.has_tripped() => format!("after request {k} ({req})"),
            _ => {
                not_reached += 1;
                format!(
                    "at request {k}, never reached ({} requests made)",
                    sent.len()
                )
            }
        };
        let outcome = match h.converge_fresh(&instance).await? {
            Err(why) => Some(format!("crash {point}: not converged afterwards: {why}")),
            Ok(_) => {
                let mut diffs = h.anonymized(&instance).await?.diff(&reference.state);
                diffs.extend(follow.finish(h, &instance).await?);
                (!diffs.is_empty()).then(|| {
                    format!(
                        "crash {point}: the end state differs from the clean one:\n{}",
                        diffs.join("\n")
                    )
                })
            }
        };
        h.discard(&instance).await;
        if let Some(evidence) = outcome {
            r.fail(evidence);
            failures += 1;
            if failures >= h.options.max_failures {
                r.fail(format!(
                    "stopped after {failures} failing crash points of {points}"
                ));
                break;
            }
        }
    }
    r.figure("crash points not reached", not_reached);
    Ok(())
}
