//! Concurrency-safe: [`Options::racers`](super::Options::racers) reconciles of one fresh
//! instance, each with a session and client of its own (as replicas or workers would have),
//! started at once; then a clean client converges it. The end state must equal the serial
//! reference: same children (no duplicate, none missing), same status (no error left in it);
//! and a value created once ([`Subject::created_once`]) must be the one the winning create
//! made, never changed by another racer.

use std::sync::Arc;

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
    let racers = h.options.racers.max(2);
    r.figure("racers", racers);
    let instance = h.instance().await?;
    let follow = h.follow(reference, &instance).await?;
    let mut sessions = Vec::new();
    for _ in 0..racers {
        let probe = Probe::new();
        match h.session(probe.clone()).await? {
            Ok(s) => sessions.push((probe, s)),
            Err(e) => {
                r.fail(e);
                return Ok(());
            }
        }
    }
    let primary = Arc::new(h.read_primary(&instance).await?);
    // join_all polls every pass before any of them waits: they start together.
    let passes = futures::future::join_all(
        sessions
            .iter()
            .map(|(probe, session)| h.pass_with(session, probe, primary.clone())),
    )
    .await;
    drop(sessions);
    let errors: Vec<String> = passes
        .iter()
        .filter_map(|p| p.result.as_ref().err().cloned())
        .collect();
    r.figure("racers that failed", errors.len());
    r.figure(
        "requests of the racers",
        passes.iter().map(|p| p.sent.len()).sum::<usize>(),
    );
    match h.converge_fresh(&instance).await? {
        Err(why) => r.fail(format!(
            "after {racers} concurrent reconciles (errors: {errors:?}) it does not converge: {why}"
        )),
        Ok(_) => {
            let diffs = h.anonymized(&instance).await?.diff(&reference.state);
            if !diffs.is_empty() {
                r.fail(format!(
                    "after {racers} concurrent reconciles (errors: {errors:?}) and convergence, \
                     the end state differs from the serial one:\n{}",
                    diffs.join("\n")
                ));
            }
        }
    }
    for evidence in follow.finish(h, &instance).await? {
        r.fail(format!(
            "after {racers} concurrent reconciles (errors: {errors:?}) and convergence: {evidence}"
        ));
    }
    h.discard(&instance).await;
    Ok(())
}
