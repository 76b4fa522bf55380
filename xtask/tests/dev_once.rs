//! `cargo xtask dev --once` against a fresh local control plane: exits 0, every example is
//! Ready in the printed table, and no process it started outlives it.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The whole run may include building the operator and, on a machine that never built them,
/// the control-plane binaries (~10 min on 2 cores); `dev` itself gives the examples 5 min.
const DEADLINE: Duration = Duration::from_secs(30 * 60);

/// Kills the `dev` process if the test panics or times out before it exits.
struct Guard(Child);

impl Guard {
    /// SIGTERM (`dev` tears down operator and control plane), then SIGKILL after 60 s.
    fn terminate(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(200));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            self.terminate();
        }
    }
}

/// Reads a pipe line by line into a string, echoing each line to the test's stderr (shown
/// when the test fails, or with `--nocapture`).
fn collect(pipe: impl std::io::Read + Send + 'static, tag: &'static str) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            eprintln!("[dev {tag}] {line}");
            all.push_str(&line);
            all.push('\n');
        }
        all
    })
}

/// Every live process whose command line contains `needle` (pid and command line).
fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push((pid, cmdline));
        }
    }
    found
}

/// The table row whose first column is `name`.
fn row<'a>(table: &'a str, name: &str) -> Option<&'a str> {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
}

#[test]
fn dev_once_exits_zero_with_every_example_ready() {
    let mut cmd = if Path::new("/usr/bin/setpriv").is_file() {
        // Dies with this test (and then takes its operator and control plane with it).
        let mut c = Command::new("/usr/bin/setpriv");
        c.args(["--pdeathsig", "KILL", "--", env!("CARGO_BIN_EXE_xtask")]);
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_xtask"))
    };
    cmd.args(["dev", "--once"])
        // The local control plane, whatever the developer's shell points at.
        .env_remove("KUBECONFIG")
        .env("CARGO", env!("CARGO"))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd.spawn().expect("starting cargo xtask dev --once");
    let pid = child.id();
    let mut guard = Guard(child);
    let stdout = collect(guard.0.stdout.take().unwrap(), "stdout");
    let stderr = collect(guard.0.stderr.take().unwrap(), "stderr");

    let started = Instant::now();
    let status = loop {
        if let Some(status) = guard.0.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > DEADLINE {
            guard.terminate();
            panic!("`dev --once` did not finish within {DEADLINE:?}");
        }
        thread::sleep(Duration::from_millis(250));
    };
    let out = stdout.join().unwrap();
    let err = stderr.join().unwrap();

    // Nothing it started outlives it: not the operator (its files are under
    // $TMPDIR/idem-dev/<pid>/) and no control-plane process (run dir <root>/<pid>-<n>/).
    let dev_dir = std::env::temp_dir().join("idem-dev").join(pid.to_string());
    let cp_dir = idem_tests::state::root().join(format!("{pid}-"));
    for needle in [dev_dir.display().to_string(), cp_dir.display().to_string()] {
        let left = processes_mentioning(&needle);
        assert!(left.is_empty(), "processes outlived `dev --once`: {left:?}");
    }

    assert!(status.success(), "`dev --once` failed ({status}):\n{err}");
    for name in ["acme", "globex", "initech", "web"] {
        let line = row(&out, name)
            .unwrap_or_else(|| panic!("no table row for {name} in:\n{out}\nstderr:\n{err}"));
        assert!(
            line.contains("Ready=True"),
            "{name} is not Ready: {line}\n{out}"
        );
    }
    assert!(err.contains("all 4 examples Ready"), "{err}");
    let web = row(&out, "web").unwrap();
    assert!(web.contains("2/2"), "web should have 2/2 replicas: {web}");
    // The operator ran as its ServiceAccount with `deploy/`'s RBAC and nothing it asked was
    // refused: among others, it looked for a shard ring's Leases where `deploy/` lets it.
    let log = std::fs::read_to_string(dev_dir.join("operator.log")).unwrap_or_default();
    assert!(
        log.contains("INFO"),
        "no operator log in {}",
        dev_dir.display()
    );
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("forbidden")).collect();
    assert!(refused.is_empty(), "the operator was refused: {refused:#?}");
}
