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
    /// Under injected API faults it converges, within 1.2× the fault-free request count.
    Faults,
    /// Every field of every child changed by another field manager is restored, and that
    /// manager's own fields are left alone.
    Tamper,
}

impl Check {
    /// Every check, in the order [`Kit::run_all`](super::Kit::run_all) runs them.
    pub const ALL: [Check; 5] = [
        Check::Repeat,
        Check::Race,
        Check::Crash,
        Check::Faults,
        Check::Tamper,
    ];
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Check::Repeat => "repeat",
            Check::Race => "race",
            Check::Crash => "crash",
            Check::Faults => "faults",
            Check::Tamper => "tamper",
        })
    }
}

/// The outcome of one check.
#[derive(Clone, Debug)]
pub struct CheckReport {
    /// Which check.
    pub check: Check,
    /// Whether the guarantee held.
    pub passed: bool,
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
        self.get(check).is_some_and(|c| !c.passed)
    }

    /// # Panics
    /// When any check failed; the message is the whole report with the evidence.
    pub fn assert_idempotent(&self) {
        assert!(self.failed().is_empty(), "not idempotent:\n{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            let verdict = if c.passed { "passed" } else { "FAILED" };
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
