//! Convergence under API faults: a fresh instance is reconciled for three passes by a client
//! that injects 409 Conflict on every 10th write, 429 Too Many Requests with `Retry-After` on
//! its first write (not on a watch of the session's caches, which would spare the reconcile),
//! 500 on every 15th request, 20 ms of latency, and cuts and expires (410 Gone) the session's
//! watches ([`crate::faults`]); then the faults stop and it converges. It must reach the clean
//! end state within a request budget: the larger of
//! [`Options::fault_budget`](super::Options::fault_budget) (1.2×) the requests of the
//! fault-free convergence and those requests plus one per fault injected (each 409, 429 and
//! 500 may cost its retry, each cut or expired watch one write made again from a cache that
//! had not yet seen it: costs a small reconcile could not otherwise afford), both counted by the API server for the kit's user
//! (every verb; the injected answers never reach it), less the requests that refill the
//! session's watch caches after the cut (watches and `resourceVersion=0` lists: the cost of
//! the fault itself, not of the reconcile, and both reported).

use std::time::Duration;

use super::harness::{Harness, Reference, describe};
use super::probe::Probe;
use super::report::CheckReport;
use super::{Error, Subject};
use crate::faults::{Faults, Schedule};

/// Every 10th write answered 409 Conflict.
const CONFLICT_EVERY: u32 = 10;
/// Every 15th request answered 500.
const SERVER_ERROR_EVERY: u32 = 15;
/// The `Retry-After` of the injected 429 (the first write gets it).
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Passes made under faults; then the faults stop and it must converge.
const FAULTY_PASSES: usize = 3;
/// Latency added to every request.
const LATENCY: Duration = Duration::from_millis(20);

/// Runs the check.
///
/// # Errors
/// [`Error::Setup`] when the cluster cannot be read or written by the kit.
pub(crate) async fn run<S: Subject>(
    h: &Harness<'_, S>,
    reference: &Reference<S>,
    r: &mut CheckReport,
) -> Result<(), Error> {
    let baseline = reference.server_requests;
    r.figure("fault-free requests", baseline);
    let instance = h.instance().await?;
    let follow = h.follow(reference, &instance).await?;
    let faults = Faults::new();
    let probe = Probe::new();
    let client = h.identity.faulty_client(probe.clone(), &faults)?;
    let session = match h.session_with(client).await? {
        Ok(s) => s,
        Err(e) => {
            r.fail(e);
            return Ok(());
        }
    };
    let before = h.identity.server_count(h.cp).await?;
    let mark = probe.all_sent().len();
    faults.conflicts(Schedule::Every(CONFLICT_EVERY));
    faults.server_errors(Schedule::Every(SERVER_ERROR_EVERY));
    faults.too_many_writes(Schedule::Next(1), RETRY_AFTER);
    faults.latency(LATENCY);
    let mut first = Vec::new();
    let (mut cut, mut expired) = (0, 0);
    for i in 0..FAULTY_PASSES {
        first.push(h.pass(&session, &probe, &instance).await?);
        // The session's watches break between passes: ended, then expired (relist).
        match i {
            0 => cut = faults.cut_watches(),
            1 => expired = faults.expire_watches(),
            _ => {}
        }
    }
    faults.clear();
    let rest = h.converge(&session, &probe, &instance).await?;
    let total = h.identity.server_count(h.cp).await? - before;
    let injected = faults.injected();
    let refills = probe.all_sent()[mark..]
        .iter()
        .filter(|s| s.is_cache_fill())
        .count() as u64;
    let requests = total.saturating_sub(refills);
    r.figure("requests under faults", total);
    r.figure("of which watch-cache refills", refills);
    let ratio = requests as f64 / baseline.max(1) as f64;
    r.figure("ratio", format!("{ratio:.2}"));
    let answered = injected.conflicts + injected.server_errors + injected.too_many_requests;
    let faulted = answered + (cut + expired) as u64;
    let budget = (h.options.fault_budget * baseline as f64).max((baseline + faulted) as f64);
    r.figure("budget", format!("{budget:.1}"));
    r.figure(
        "injected",
        format!(
            "{} × 409, {} × 429, {} × 500, {cut} watches cut, {expired} expired",
            injected.conflicts, injected.too_many_requests, injected.server_errors
        ),
    );
    drop(session);
    match rest {
        Err(why) => r.fail(format!(
            "after {FAULTY_PASSES} passes under faults ({}) it does not converge: {why}",
            first.iter().map(describe).collect::<Vec<_>>().join("; ")
        )),
        Ok(conv) => {
            r.figure("passes", conv.passes.len() + first.len());
            let mut diffs = h.anonymized(&instance).await?.diff(&reference.state);
            diffs.extend(follow.finish(h, &instance).await?);
            if !diffs.is_empty() {
                r.fail(format!(
                    "under faults it ends elsewhere than the clean convergence:\n{}",
                    diffs.join("\n")
                ));
            }
            if requests as f64 > budget {
                r.fail(format!(
                    "{requests} requests under faults (besides {refills} watch-cache refills) \
                     against {baseline} without: {ratio:.2}× exceeds the budget of \
                     {budget:.1} requests (the larger of {}× and {baseline} + one retry for \
                     each of the {faulted} faults injected)",
                    h.options.fault_budget
                ));
            }
        }
    }
    if answered == 0 {
        r.fail(
            "no fault was injected: the reconcile's requests do not go through the kit's client",
        );
    }
    h.discard(&instance).await;
    Ok(())
}
