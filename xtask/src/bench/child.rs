//! One benchmarked controller as a child process: started, read (its per-reconcile lines),
//! measured (`VmRSS`) and killed.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use idem_bench::{RECONCILE_PREFIX, SYNCED_LINE};
use idem_tests::process::dying_with_parent;

/// Which controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Side {
    /// `bench-idem`: idem's runtime.
    Idem,
    /// `bench-peer`: a plain kube-runtime `Controller`.
    Kube,
    /// `bench-cr`: a controller-runtime manager (the Go module `bench/controller-runtime/`).
    ControllerRuntime,
}

impl Side {
    /// Every controller, in the order they run.
    pub const ALL: [Side; 3] = [Side::Idem, Side::Kube, Side::ControllerRuntime];

    /// The short name: the run label, the name prefix of its objects and its log's name.
    pub fn name(self) -> &'static str {
        match self {
            Side::Idem => "idem",
            Side::Kube => "kube",
            Side::ControllerRuntime => "cr",
        }
    }

    /// The name in tables and plots.
    pub fn title(self) -> &'static str {
        match self {
            Side::Idem => "idem",
            Side::Kube => "kube-runtime",
            Side::ControllerRuntime => "controller-runtime",
        }
    }

    /// The Rust binary's name in package `idem-bench` (`None` for the Go peer).
    pub fn cargo_bin(self) -> Option<&'static str> {
        match self {
            Side::Idem => Some("bench-idem"),
            Side::Kube => Some("bench-peer"),
            Side::ControllerRuntime => None,
        }
    }
}

/// One reconcile the controller reported.
#[derive(Clone, Debug)]
pub struct Reconcile {
    /// When it started, as this process's clock says.
    pub at: Instant,
    /// The BaseTenant's name.
    pub name: String,
    /// Its `spec.tenant`.
    pub tenant: String,
}

/// What the controller has reported so far.
#[derive(Debug, Default)]
pub struct Reports {
    /// Every reconcile, in order.
    pub reconciles: Vec<Reconcile>,
    /// Whether its caches synced.
    pub synced: bool,
}

/// A running controller; dropping it kills it.
pub struct Controller {
    child: Child,
    /// What it reported.
    pub reports: Arc<Mutex<Reports>>,
    log: PathBuf,
}

impl Controller {
    /// Starts `binary` for run `run` with `workers`, `resync_secs` (0: none) and `extra`
    /// arguments; stderr goes to `log`.
    ///
    /// # Errors
    /// When the log or the process cannot be created.
    pub fn spawn(
        binary: &Path,
        kubeconfig: &Path,
        run: &str,
        workers: usize,
        resync_secs: u64,
        extra: &[String],
        log: &Path,
    ) -> anyhow::Result<Self> {
        let err = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("creating {}", log.display()))?;
        let mut child = dying_with_parent(binary, "KILL")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--run", run])
            .arg(format!("--workers={workers}"))
            .arg(format!("--resync-secs={resync_secs}"))
            .args(extra)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stdout = child.stdout.take().context("controller stdout")?;
        let reports = Arc::new(Mutex::new(Reports::default()));
        let sink = Arc::clone(&reports);
        std::thread::spawn(move || {
            // Reconcile lines carry wall-clock ms; map them onto Instants once.
            let (base_instant, base_wall) = (Instant::now(), wall_ms());
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut r = sink.lock().expect("reports lock");
                if line == SYNCED_LINE {
                    r.synced = true;
                } else if let Some(rest) = line.strip_prefix(RECONCILE_PREFIX) {
                    let mut parts = rest.split(' ');
                    let (Some(ms), Some(name), Some(tenant)) =
                        (parts.next(), parts.next(), parts.next())
                    else {
                        continue;
                    };
                    let ms: i128 = ms.parse().unwrap_or(base_wall);
                    let offset = ms - base_wall;
                    let at = if offset >= 0 {
                        base_instant + Duration::from_millis(offset as u64)
                    } else {
                        base_instant
                    };
                    r.reconciles.push(Reconcile {
                        at,
                        name: name.to_owned(),
                        tenant: tenant.to_owned(),
                    });
                }
            }
        });
        Ok(Self {
            child,
            reports,
            log: log.to_path_buf(),
        })
    }

    /// Waits until the controller says its caches synced.
    ///
    /// # Errors
    /// When it exits first or takes longer than `timeout`.
    pub fn wait_synced(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.reports.lock().expect("reports lock").synced {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "controller exited with {status}; see {}",
                    self.log.display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "controller did not sync within {timeout:?}; see {}",
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Reconciles reported since `since`.
    pub fn reconciles_since(&self, since: Instant) -> Vec<Reconcile> {
        let r = self.reports.lock().expect("reports lock");
        r.reconciles
            .iter()
            .filter(|x| x.at >= since)
            .cloned()
            .collect()
    }

    /// How many reconciles were reported so far.
    pub fn reconcile_count(&self) -> usize {
        self.reports.lock().expect("reports lock").reconciles.len()
    }

    /// The controller's resident set size in bytes (`VmRSS` of `/proc/<pid>/status`).
    ///
    /// # Errors
    /// When the process is gone or the file has no `VmRSS`.
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        self.status_bytes("VmRSS")
    }

    /// The anonymous part of [`Self::rss_bytes`] (`RssAnon`: heap, stacks, the allocator's
    /// arenas), without the pages of the binary and its libraries (`RssFile`).
    ///
    /// # Errors
    /// When the process is gone or the file has no `RssAnon`.
    pub fn rss_anon_bytes(&self) -> anyhow::Result<u64> {
        self.status_bytes("RssAnon")
    }

    /// The most RSS the process has had (`VmHWM`).
    ///
    /// # Errors
    /// When the process is gone or the file has no `VmHWM`.
    pub fn rss_peak_bytes(&self) -> anyhow::Result<u64> {
        self.status_bytes("VmHWM")
    }

    /// A `kB` field of `/proc/<pid>/status`, in bytes.
    fn status_bytes(&self, field: &str) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        kb_field(&status, field)
            .map(|kb| kb * 1024)
            .with_context(|| format!("no {field}"))
    }

    /// The CPU time the controller has used so far, user and system (`utime` + `stime` of
    /// `/proc/<pid>/stat`, in clock ticks of 100 Hz, the Linux value of `_SC_CLK_TCK`).
    ///
    /// # Errors
    /// When the process is gone or the file does not parse.
    pub fn cpu(&self) -> anyhow::Result<Duration> {
        cpu_of_pid(self.child.id())
    }

    /// Whether the process is still running.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "controller exited with {status}; see {}",
                self.log.display()
            );
        }
        Ok(())
    }

    /// Kills the controller (SIGKILL, as a crash) and reaps it.
    pub fn kill(mut self) {
        kill_tree(&mut self.child);
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        kill_tree(&mut self.child);
    }
}

/// Kills `child` and every process below it (SIGKILL), and reaps `child`: a binary given to
/// `--idem-binary` may be a wrapper (a profiler's script) that runs the controller as its own
/// child, which would outlive the wrapper's death (its parent-death signal is the wrapper's).
fn kill_tree(child: &mut Child) {
    let below = descendants(child.id());
    let _ = child.kill();
    for pid in below {
        // One that exited meanwhile: ESRCH, nothing to do.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = child.wait();
}

/// The processes below `pid` (children, their children, …), read from `/proc`.
fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            Some((p, parent_of_stat(&stat)?))
        })
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for &(p, pp) in &parents {
            if pp == parent && !out.contains(&p) {
                out.push(p);
                frontier.push(p);
            }
        }
    }
    out
}

/// The value of `field` (in kB) in a `/proc/<pid>/status` text.
fn kb_field(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The parent pid of a `/proc/<pid>/stat` line (field 4, the second after the command name).
fn parent_of_stat(stat: &str) -> Option<u32> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(1)?.parse().ok()
}

/// The CPU time (user + system) process `pid` has used so far.
///
/// # Errors
/// When `/proc/<pid>/stat` cannot be read (the process is gone) or parsed.
pub fn cpu_of_pid(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    cpu_of_stat(&stat).context("unparsable /proc/<pid>/stat")
}

/// `utime` + `stime` of a `/proc/<pid>/stat` line (fields 14 and 15, counted after the
/// command name, which is in parentheses and may hold spaces).
fn cpu_of_stat(stat: &str) -> Option<Duration> {
    /// Clock ticks per second of `/proc` times on Linux.
    const TICKS: u64 = 100;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 1000 / TICKS))
}

fn wall_ms() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as i128
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn a_wrapper_and_the_process_it_started_are_both_killed() {
        // A wrapper that starts its "controller" as a child and prints its pid.
        let mut wrapper = Command::new("sh")
            .args(["-c", "sleep 300 & echo $!; wait"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh");
        let mut line = String::new();
        BufReader::new(wrapper.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the child's pid");
        let inner: u32 = line.trim().parse().expect("a pid");
        assert!(descendants(wrapper.id()).contains(&inner));
        kill_tree(&mut wrapper);
        // Gone, or a zombie waiting for a reaper that is not us.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{inner}/stat")).unwrap_or_default();
            let state = stat
                .get(stat.rfind(')').map_or(0, |i| i + 2)..)
                .and_then(|s| s.chars().next());
            if stat.is_empty() || state == Some('Z') {
                break;
            }
            assert!(Instant::now() < deadline, "still running: {stat}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn status_fields_are_read_by_their_whole_name() {
        let status = "VmRSSx:\t1 kB\nVmRSS:\t  32484 kB\nRssAnon:\t   20680 kB\n";
        assert_eq!(kb_field(status, "VmRSS"), Some(32484));
        assert_eq!(kb_field(status, "RssAnon"), Some(20680));
        assert_eq!(kb_field(status, "RssFile"), None);
    }

    #[test]
    fn the_parent_is_the_field_after_the_state() {
        let stat = "4242 (bench (idem) x) S 17 4242 4242 0 -1 4194560";
        assert_eq!(parent_of_stat(stat), Some(17));
    }

    #[test]
    fn cpu_is_utime_plus_stime_whatever_the_command_name() {
        let stat = "4242 (bench idem) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 18 0";
        assert_eq!(cpu_of_stat(stat), Some(Duration::from_millis(3250)));
        assert_eq!(cpu_of_stat("4242 (x) S 1"), None);
    }
}
