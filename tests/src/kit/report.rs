//! What a kit run found: per check, passed or failed, with the evidence and the figures.

use std::fmt;
use std::time::Duration;

/// One of the guarantees the kit checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Check {
    /// After convergence one more reconcile makes no request and changes nothing.
    Repeat,
    /// Reconciles started at once end where serial ones do.
    Race,
    /// A reconcile aborted after any of its requests, then resumed, ends where a clean one does.
    Crash,
    /// Under injected API faults it converges, within 1.2× the fault-free request count or
    /// that count plus one per fault injected, whichever is larger.
    Faults,
    /// Every field of every child changed by another field manager is restored, and that
    /// manager's own fields are left alone.
    Tamper,
    /// With its watch events (and the primary objects it is handed) arriving late while the
    /// spec flips to [`Subject::flipped`](super::Subject::flipped) and back, it ends where the
    /// same flips made serially do: nothing leaked, nothing lost, the same status.
    Stale,
}

impl Check {
    /// Every check, in the order [`Kit::run_all`](super::Kit::run_all) runs them.
    pub const ALL: [Check; 6] = [
        Check::Repeat,
        Check::Race,
        Check::Crash,
        Check::Faults,
        Check::Tamper,
        Check::Stale,
    ];
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Check::Repeat => "repeat",
            Check::Race => "race",
            Check::Crash => "crash",
            Check::Faults => "faults",
            Check::Tamper => "tamper",
            Check::Stale => "stale",
        })
    }
}

/// The outcome of one check.
#[derive(Clone, Debug)]
pub struct CheckReport {
    /// Which check.
    pub check: Check,
    /// Whether the guarantee held (`false` too when it did not run: see `ran`).
    pub passed: bool,
    /// Whether the check ran: not when there was no clean convergence to start from
    /// ([`Report::cause`]).
    pub ran: bool,
    /// Why it failed (empty when it passed): the requests, the differences, the step.
    pub evidence: Vec<String>,
    /// Measurements, e.g. `("requests", "12")`, `("instances", "9")`.
    pub figures: Vec<(String, String)>,
    /// Wall-clock time the check took.
    pub elapsed: Duration,
}

impl CheckReport {
    pub(crate) fn new(check: Check) -> Self {
        Self {
            check,
            passed: true,
            ran: true,
            evidence: Vec::new(),
            figures: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    /// Records a failure with its evidence.
    pub(crate) fn fail(&mut self, evidence: impl Into<String>) {
        self.passed = false;
        self.evidence.push(evidence.into());
    }

    /// Records a figure.
    pub(crate) fn figure(&mut self, name: &str, value: impl fmt::Display) {
        self.figures.push((name.to_owned(), value.to_string()));
    }

    /// The figure called `name`, if recorded.
    pub fn figure_value(&self, name: &str) -> Option<&str> {
        self.figures
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Everything one kit run found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// One entry per check run, in run order.
    pub checks: Vec<CheckReport>,
    /// Why no check ran, when the clean convergence every check starts from failed (each
    /// check is then reported once as not run, without repeating it).
    pub cause: Option<String>,
    /// Wall-clock time of the whole run (set-up and clean-up included).
    pub elapsed: Duration,
}

impl Report {
    /// The checks that failed.
    pub fn failed(&self) -> Vec<&CheckReport> {
        self.checks.iter().filter(|c| !c.passed).collect()
    }

    /// The report of `check`, if it ran.
    pub fn get(&self, check: Check) -> Option<&CheckReport> {
        self.checks.iter().find(|c| c.check == check)
    }

    /// Whether `check` ran and failed.
    pub fn caught(&self, check: Check) -> bool {
        self.get(check).is_some_and(|c| c.ran && !c.passed)
    }

    /// # Panics
    /// When any check failed; the message is the whole report with the evidence.
    pub fn assert_idempotent(&self) {
        assert!(
            self.failed().is_empty() && self.cause.is_none(),
            "not idempotent:\n{self}"
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(cause) = &self.cause {
            for (i, line) in cause.lines().enumerate() {
                let lead = if i == 0 {
                    "no clean convergence to start from, so no check ran: "
                } else {
                    "  "
                };
                writeln!(f, "{lead}{line}")?;
            }
        }
        for c in &self.checks {
            let verdict = match (c.ran, c.passed) {
                (false, _) => "NOT RUN",
                (true, true) => "passed",
                (true, false) => "FAILED",
            };
            write!(
                f,
                "{:<7} {verdict} in {:.1} s",
                c.check,
                c.elapsed.as_secs_f64()
            )?;
            for (name, value) in &c.figures {
                write!(f, "; {name} {value}")?;
            }
            writeln!(f)?;
            for e in &c.evidence {
                for (i, line) in e.lines().enumerate() {
                    let lead = if i == 0 { "  - " } else { "    " };
                    writeln!(f, "{lead}{line}")?;
                }
            }
        }
        write!(f, "total {:.1} s", self.elapsed.as_secs_f64())
    }
}

/// At most `max` characters of `s`, cut at a character boundary and marked with `…` when cut.
pub(crate) fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((end, _)) => format!("{}…", &s[..end]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_cuts_at_a_character_boundary_and_says_so() {
        assert_eq!(clip("AlreadyExists", 20), "AlreadyExists");
        assert_eq!(clip("AlreadyExists", 6), "Alread…");
        assert_eq!(clip("€€€", 2), "€€…");
    }

    #[test]
    fn a_failed_reference_is_reported_once_and_no_check_as_run() {
        let mut c = CheckReport::new(Check::Repeat);
        c.ran = false;
        c.passed = false;
        let report = Report {
            checks: vec![c],
            cause: Some("POST failed".into()),
            elapsed: Duration::ZERO,
        };
        let text = report.to_string();
        assert_eq!(text.matches("POST failed").count(), 1, "{text}");
        assert!(text.contains("\nrepeat  NOT RUN in"), "{text}");
        assert!(!report.caught(Check::Repeat));
        assert_eq!(report.failed().len(), 1);
    }
}
