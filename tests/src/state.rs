//! Run directories of local control planes: a fresh one per attached start (stale ones of dead
//! harnesses are swept), and one fixed directory with a pid file for the detached control plane.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::process::pid_alive;

const STATE_FILE: &str = "state.json";

/// Where run directories live: `$TMPDIR/idem-controlplane/`.
pub fn root() -> PathBuf {
    std::env::temp_dir().join("idem-controlplane")
}

/// The detached control plane's run directory under `root`.
pub fn detached_dir(root: &Path) -> PathBuf {
    root.join("detached")
}

/// Creates `<root>/<pid>-<n>` for an attached control plane, first removing directories whose
/// owning process (the pid in the name) is gone.
pub(crate) fn new_attached_dir(root: &Path) -> Result<PathBuf> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    fs::create_dir_all(root).map_err(Error::io(format!("creating {}", root.display())))?;
    sweep_stale(root);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = root.join(format!("{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    Ok(dir)
}

/// Removes the run directories under `root` whose owning process (the pid in the name) is gone:
/// a test binary's shared control plane lives until the process ends, and leaves its directory.
pub(crate) fn sweep_stale(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let owner = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if owner.is_some_and(|pid| !pid_alive(pid)) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Claims the detached run directory.
///
/// # Errors
/// [`Error::AlreadyRunning`] when a detached control plane with live processes is recorded there.
pub(crate) fn claim_detached_dir(root: &Path) -> Result<PathBuf> {
    let dir = detached_dir(root);
    if let Ok(state) = State::load(&dir)
        && state.pids.iter().any(|(_, pid)| pid_alive(*pid))
    {
        return Err(Error::AlreadyRunning(state.kubeconfig));
    }
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    Ok(dir)
}

/// What `down` needs to stop a detached control plane.
#[derive(Debug, Serialize, Deserialize)]
pub struct State {
    /// Component name and pid, in start order.
    pub pids: Vec<(String, u32)>,
    /// The kubeconfig that `up` wrote.
    pub kubeconfig: PathBuf,
}

impl State {
    /// Writes `state.json` into `dir`.
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be written.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let text =
            serde_json::to_string_pretty(self).map_err(|e| Error::Kubeconfig(e.to_string()))?;
        fs::write(dir.join(STATE_FILE), text).map_err(Error::io("writing the control-plane state"))
    }

    /// Reads `state.json` from `dir`.
    ///
    /// # Errors
    /// [`Error::NoState`] when it is missing or unreadable.
    pub fn load(dir: &Path) -> Result<Self> {
        let text = fs::read_to_string(dir.join(STATE_FILE))
            .map_err(|_| Error::NoState(dir.to_path_buf()))?;
        serde_json::from_str(&text).map_err(|_| Error::NoState(dir.to_path_buf()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_directory_of_a_process_gone_is_swept_and_a_live_ones_kept() {
        let root = std::env::temp_dir().join(format!("idem-sweep-{}", std::process::id()));
        // A pid above the kernel's largest (4194304): no such process.
        let gone = root.join("4194305-0");
        let live = root.join(format!("{}-0", std::process::id()));
        let detached = detached_dir(&root);
        for dir in [&gone, &live, &detached] {
            fs::create_dir_all(dir).unwrap();
        }
        sweep_stale(&root);
        assert!(!gone.exists());
        assert!(live.exists() && detached.exists());
        fs::remove_dir_all(&root).unwrap();
    }
}
