//! One control-plane process: spawned with its output in a log file, stopped with SIGTERM and
//! then SIGKILL, and never outliving the harness that started it.

use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::{Error, Result};

/// How long a process gets between SIGTERM and SIGKILL. The API server was seen ignoring
/// SIGTERM for more than 15 s, so this is short and SIGKILL does the rest.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// How a process is tied to its starter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Killed by the kernel (SIGKILL, via `setpriv --pdeathsig`) when the process that spawned
    /// it exits, so no process outlives a test binary, even one that panics or is killed.
    Attached,
    /// Keeps running after the starter exits; stopped later by pid (`cargo xtask controlplane down`).
    Detached,
}

/// A running control-plane process.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `program` with `args`, stdout and stderr appended to `log`, in a process group
    /// of its own (so a Ctrl-C in the terminal reaches the harness, which stops things in order).
    ///
    /// # Errors
    /// [`Error::Io`] when the log cannot be created or the program cannot be started.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
        lifetime: Lifetime,
    ) -> Result<Self> {
        let out = File::create(log).map_err(Error::io(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(Error::io("duplicating a log handle"))?;
        let mut cmd = match lifetime {
            Lifetime::Attached => dying_with_parent(program, "KILL"),
            Lifetime::Detached => Command::new(program),
        };
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = cmd
            .spawn()
            .map_err(Error::io(format!("starting {}", program.display())))?;
        if lifetime == Lifetime::Attached {
            wait_for_exec(child.id(), program);
        }
        Ok(Self {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        })
    }

    /// The component's name, e.g. `kube-apiserver`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// An [`Error::NotReady`] for this process with the tail of its log.
    pub fn not_ready(&self, reason: impl Into<String>) -> Error {
        Error::NotReady {
            component: self.name.clone(),
            reason: reason.into(),
            log: self.log.clone(),
            tail: tail(&self.log, 30),
        }
    }

    /// Stops the process: SIGTERM, up to `grace` to exit, then SIGKILL; always reaps it.
    pub fn stop(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

const SETPRIV: &str = "/usr/bin/setpriv";

/// A [`Command`] for `program` that the kernel sends `signal` (`"KILL"`, `"TERM"`, …) when the
/// process that spawned it exits, even by SIGKILL: `setpriv --pdeathsig` (util-linux). A plain
/// command where util-linux is missing. The kernel ties the signal to the spawning *thread*: a
/// child shared by several tests must be spawned from a thread that outlives them (not from a
/// test's own thread, which ends with the test).
pub fn dying_with_parent(program: &Path, signal: &str) -> Command {
    if Path::new(SETPRIV).is_file() {
        let mut c = Command::new(SETPRIV);
        c.args(["--pdeathsig", signal, "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Waits (up to 2 s) until the child runs `program` itself: `setpriv` sets the parent-death
/// signal just before it execs `program`, and a harness that exited before that moment would
/// leave an orphan. The kernel keeps the first 15 bytes of the name in `/proc/<pid>/comm`.
fn wait_for_exec(pid: u32, program: &Path) {
    let name = program.file_name().unwrap_or_default().to_string_lossy();
    let expected: String = name.chars().take(15).collect();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        match fs::read_to_string(format!("/proc/{pid}/comm")) {
            Ok(comm) if comm.trim_end() != expected => sleep(Duration::from_millis(1)),
            _ => return,
        }
    }
}

/// Stops a process that is not our child (a detached control plane): SIGTERM, up to `grace`,
/// then SIGKILL. Returns once the pid is gone.
pub fn stop_pid(pid: u32, grace: Duration) {
    let pid = Pid::from_raw(pid as i32);
    if kill(pid, Signal::SIGTERM).is_err() {
        return;
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !alive(pid) {
            return;
        }
        sleep(Duration::from_millis(50));
    }
    let _ = kill(pid, Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        sleep(Duration::from_millis(20));
    }
}

/// Whether a pid names a live (not zombie) process.
fn alive(pid: Pid) -> bool {
    if kill(pid, None).is_err() {
        return false;
    }
    // A zombie still answers signal 0; its state in /proc says Z.
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|s| s.split_whitespace().next());
    state != Some("Z")
}

/// Whether the process with this pid is running (used to find stale run directories).
pub fn pid_alive(pid: u32) -> bool {
    alive(Pid::from_raw(pid as i32))
}

/// The last `n` lines of a log file (empty if unreadable).
pub fn tail(log: &Path, n: usize) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_kills_a_process_that_ignores_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Process::spawn(
            "stubborn",
            Path::new("/bin/sh"),
            &[
                "-c".into(),
                "trap '' TERM; echo started; exec sleep 60".into(),
            ],
            &dir.path().join("log"),
            Lifetime::Attached,
        )
        .unwrap();
        let pid = p.pid();
        // Stopped only once the shell ignores SIGTERM (it says so after its trap).
        let deadline = Instant::now() + Duration::from_secs(30);
        while tail(p.log(), 1) != "started" {
            assert!(Instant::now() < deadline, "the shell never started");
            sleep(Duration::from_millis(20));
        }
        let started = Instant::now();
        p.stop(Duration::from_millis(300));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!pid_alive(pid), "pid {pid} survived stop()");
        assert_eq!(tail(p.log(), 1), "started");
    }

    /// Run as a child test binary by the test below: spawns an attached `sleep`, prints its
    /// pid and returns without stopping it (the handle is leaked, so no Drop runs).
    #[test]
    #[ignore = "helper, run by attached_children_die_with_the_harness_process"]
    fn spawn_and_leak() {
        if std::env::var_os("IDEM_SPAWN_AND_LEAK").is_none() {
            return;
        }
        let dir = std::env::temp_dir();
        let p = Process::spawn(
            "orphan",
            Path::new("/bin/sleep"),
            &["60".into()],
            &dir.join(format!("idem-orphan-{}.log", std::process::id())),
            Lifetime::Attached,
        )
        .unwrap();
        println!("PID={}", p.pid());
        std::mem::forget(p);
    }

    #[test]
    fn attached_children_die_with_the_harness_process() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "process::tests::spawn_and_leak",
                "--ignored",
                "--nocapture",
            ])
            .env("IDEM_SPAWN_AND_LEAK", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let pid: u32 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("PID="))
            .unwrap_or_else(|| panic!("no pid in the helper's output: {stdout}"))
            .parse()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while pid_alive(pid) && Instant::now() < deadline {
            sleep(Duration::from_millis(20));
        }
        assert!(
            !pid_alive(pid),
            "pid {pid} outlived the test binary that spawned it"
        );
    }
}
