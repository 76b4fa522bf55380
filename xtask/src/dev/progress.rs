//! One progress step of `cargo xtask dev`: an indicatif spinner on a terminal, plain lines
//! otherwise (CI logs), and a `✓ what (seconds)` line when it is done.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// A step in progress; dropping it without [`Step::done`] clears the spinner (the error that
/// ended the step is reported by the caller).
pub struct Step {
    bar: ProgressBar,
    what: String,
    started: Instant,
    finished: bool,
}

impl Step {
    /// Starts a step described by `what` (e.g. `starting the local control plane`).
    pub fn start(what: impl Into<String>) -> Self {
        let what = what.into();
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner:.cyan} [{elapsed}] {wide_msg}")
                .expect("a valid indicatif template"),
        );
        bar.set_message(what.clone());
        if bar.is_hidden() {
            eprintln!("… {what}");
        } else {
            bar.enable_steady_tick(Duration::from_millis(100));
        }
        Self {
            bar,
            what,
            started: Instant::now(),
            finished: false,
        }
    }

    /// The spinner, to show sub-progress with `set_message`.
    pub fn bar(&self) -> &ProgressBar {
        &self.bar
    }

    /// Replaces the spinner's message (not printed when there is no terminal).
    pub fn set_message(&self, msg: impl Into<String>) {
        self.bar.set_message(msg.into());
    }

    /// Ends the step with `✓ what (1.2s)` and an optional detail after it.
    pub fn done(mut self, detail: &str) {
        self.finished = true;
        self.bar.finish_and_clear();
        let secs = self.started.elapsed().as_secs_f64();
        if detail.is_empty() {
            eprintln!("✓ {} ({secs:.1}s)", self.what);
        } else {
            eprintln!("✓ {} ({secs:.1}s): {detail}", self.what);
        }
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        if !self.finished {
            self.bar.finish_and_clear();
            eprintln!("✗ {}", self.what);
        }
    }
}
