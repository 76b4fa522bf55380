//! Repeat-safe: after convergence, one more reconcile makes no request (every verb, counted by
//! the kit's client and by the API server) and changes nothing, status and
//! `lastTransitionTime` included.
//!
//! That is idem's rule, stricter than "ends where it was": a converged pass makes no request of
//! any verb, so a reconcile reads its children from watch caches (those its
//! [`Subject::session`] keeps) and writes only when the cache shows drift. A correct but
//! uncached reconcile (a blind server-side apply every pass, or a GET before each apply) fails
//! this check, and its evidence says so.

use super::harness::{Harness, Reference, describe};
use super::report::CheckReport;
use super::{Error, Subject};

/// What a failure of this check asks for.
const RULE: &str = "idem's rule: a converged pass makes no request of any verb. Read the \
     children from watch caches (the caches your `Subject::session` keeps, e.g. a kube \
     reflector `Store`), not with GET/LIST, and write (apply, patch, status) only when the \
     cache shows drift from the desired state";

/// Runs the check on the converged reference instance.
///
/// # Errors
/// [`Error::Setup`] when the cluster cannot be read.
pub(crate) async fn run<S: Subject>(
    h: &Harness<'_, S>,
    reference: &Reference<S>,
    r: &mut CheckReport,
) -> Result<(), Error> {
    let conv = &reference.convergence;
    r.figure("convergence passes", conv.passes.len());
    r.figure("convergence requests", conv.requests());
    let before = h.state(&reference.instance).await?;
    let server_before = h.identity.server_count(h.cp).await?;
    let pass = h
        .pass(&reference.session, &reference.probe, &reference.instance)
        .await?;
    let server = h.identity.server_count(h.cp).await? - server_before;
    let after = h.state(&reference.instance).await?;
    r.figure("requests", pass.sent.len());
    r.figure("requests seen by the API server", server);
    if conv.kept_writing {
        r.fail(format!(
            "no pass of the convergence was free of writes (the end state stopped changing, \
             the writes did not); its last pass: {}\n{RULE}",
            conv.passes.last().map(describe).unwrap_or_default()
        ));
    }
    if !pass.sent.is_empty() || pass.result.is_err() {
        r.fail(format!(
            "the pass after convergence was not free: {}\n{RULE}",
            describe(&pass)
        ));
    }
    if server > pass.sent.len() as u64 {
        r.fail(format!(
            "the API server carried out {server} requests of the kit's user during the pass, \
             the kit's client saw {}: requests that bypass the client count too",
            pass.sent.len()
        ));
    }
    let diffs = after.diff(&before);
    if !diffs.is_empty() {
        r.fail(format!(
            "the pass after convergence changed the end state:\n{}",
            diffs.join("\n")
        ));
    }
    Ok(())
}
