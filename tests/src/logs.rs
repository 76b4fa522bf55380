//! What a test's code logs, captured: a tracing subscriber that writes its lines to a buffer
//! the test reads.

use std::sync::{Arc, Mutex, PoisonError};

/// The lines a [`subscriber`] wrote, shared with it.
#[derive(Clone, Debug, Default)]
pub struct Lines(Arc<Mutex<Vec<u8>>>);

impl Lines {
    /// Everything written so far, as text.
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        (self.0.lock().unwrap_or_else(PoisonError::into_inner)).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A subscriber of the events at `level` and above, without colours, and the lines it writes
/// (set it as the default of a thread, or as the global default of a test binary).
pub fn subscriber(
    level: tracing::Level,
) -> (impl tracing::Subscriber + Send + Sync + 'static, Lines) {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (subscriber, lines)
}
