//! The control plane's binaries: built once from the pinned Go module in `tests/controlplane/`
//! into a cache outside the repository, keyed by Kubernetes version.

use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::error::{Error, Result};

/// The Kubernetes version the control plane is built at (`k8s.io/kubernetes` in go.mod).
pub const KUBERNETES_VERSION: &str = "v1.37.2";
/// The oldest Go that builds the module (its go.mod says `go 1.26.0`).
pub const MIN_GO: (u32, u32) = (1, 26);
/// The programs built from `tests/controlplane/cmd/`, in start order.
pub const PROGRAMS: [&str; 6] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kubectl",
];
/// kwok Stage configs copied from the kwok module (paths under its `kustomize/stage/`):
/// node initialisation and heartbeat, pods becoming Ready, completing and being deleted.
const KWOK_STAGES: [&str; 5] = [
    "node/fast/node-initialize.yaml",
    "node/heartbeat/node-heartbeat.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
];
/// File name of the concatenated kwok stages inside the binaries directory.
pub const KWOK_STAGES_FILE: &str = "kwok-stages.yaml";
const STAMP_FILE: &str = ".stamp";

/// A directory holding every control-plane program and the kwok stage configs.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// The path of one program, e.g. `path("kube-apiserver")`.
    pub fn path(&self, program: &str) -> PathBuf {
        self.dir.join(program)
    }

    /// The directory holding the programs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The kwok Stage configs (one multi-document YAML file).
    pub fn kwok_stages(&self) -> PathBuf {
        self.dir.join(KWOK_STAGES_FILE)
    }
}

/// The Go module the binaries are built from (`tests/controlplane/` of this repository).
pub fn module_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("controlplane")
}

/// Where the binaries live: `$IDEM_CONTROLPLANE_DIR` if set, else
/// `$XDG_CACHE_HOME/idem/controlplane/<version>/` (`$HOME/.cache` when `XDG_CACHE_HOME` is unset).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("IDEM_CONTROLPLANE_DIR") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("idem")
        .join("controlplane")
        .join(KUBERNETES_VERSION)
}

/// Returns the binaries, building them first when they are missing or stale.
///
/// Does nothing (a few file reads) when the cache holds binaries built from the current
/// `go.mod`, `go.sum` and mains. Otherwise takes an exclusive file lock next to the cache (so
/// two test binaries never build at once; the second waits, then finds the work done), checks
/// Go, runs `go build` with the version stamped in, and copies kwok's stage configs. A cold
/// build downloads the modules and compiles for about 10 minutes on 2 cores; progress goes to
/// stderr (a spinner on a terminal, a line every 30 s otherwise).
///
/// # Errors
/// [`Error::GoMissing`] / [`Error::GoTooOld`] when Go is unusable, [`Error::GoBuild`] when the
/// build fails, [`Error::Io`] for file-system failures.
pub fn ensure_built() -> Result<Binaries> {
    let dir = cache_dir();
    let stamp = source_stamp()?;
    if is_current(&dir, &stamp) {
        return Ok(Binaries { dir });
    }
    let parent = dir.parent().unwrap_or(Path::new("/")).to_path_buf();
    fs::create_dir_all(&parent).map_err(Error::io(format!("creating {}", parent.display())))?;
    let lock_path = parent.join(format!(".{KUBERNETES_VERSION}.lock"));
    let lock =
        File::create(&lock_path).map_err(Error::io(format!("creating {}", lock_path.display())))?;
    lock.lock()
        .map_err(Error::io(format!("locking {}", lock_path.display())))?;
    // Someone else may have built while we waited for the lock.
    if is_current(&dir, &stamp) {
        return Ok(Binaries { dir });
    }
    let go = check_go()?;
    let staging = parent.join(format!(".{KUBERNETES_VERSION}.building"));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).map_err(Error::io(format!("creating {}", staging.display())))?;
    go_build(&go, &staging)?;
    copy_kwok_stages(&go, &staging)?;
    fs::write(staging.join(STAMP_FILE), &stamp).map_err(Error::io("writing the build stamp"))?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&staging, &dir)
        .map_err(Error::io(format!("moving binaries to {}", dir.display())))?;
    Ok(Binaries { dir })
}

fn is_current(dir: &Path, stamp: &str) -> bool {
    fs::read_to_string(dir.join(STAMP_FILE)).is_ok_and(|s| s == stamp)
        && PROGRAMS.iter().all(|p| dir.join(p).is_file())
        && dir.join(KWOK_STAGES_FILE).is_file()
}

/// A fingerprint (FNV-1a, 64 bit, hex) of everything the build reads from this repository.
fn source_stamp() -> Result<String> {
    let module = module_dir();
    let mut files = vec![module.join("go.mod"), module.join("go.sum")];
    files.extend(
        PROGRAMS
            .iter()
            .map(|p| module.join("cmd").join(p).join("main.go")),
    );
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for file in files {
        let bytes = fs::read(&file).map_err(Error::io(format!("reading {}", file.display())))?;
        // Content and file name only, not the checkout's path: every worktree with the same
        // sources shares one cache.
        let name = file
            .strip_prefix(&module)
            .unwrap_or(&file)
            .to_string_lossy()
            .to_string();
        for b in bytes.iter().chain(name.as_bytes()) {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    Ok(format!("{KUBERNETES_VERSION} {hash:016x}\n"))
}

/// Finds Go (`$IDEM_GO` or `go` on PATH) and checks its version against [`MIN_GO`].
fn check_go() -> Result<String> {
    let go = std::env::var("IDEM_GO").unwrap_or_else(|_| "go".to_string());
    let out = Command::new(&go)
        .args(["env", "GOVERSION"])
        .env("GOTOOLCHAIN", "local")
        .output()
        .map_err(|_| Error::GoMissing(go.clone()))?;
    let found = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let parsed = parse_go_version(&found);
    if !out.status.success() || parsed.is_none_or(|v| v < MIN_GO) {
        return Err(Error::GoTooOld {
            found: if found.is_empty() {
                "unknown".into()
            } else {
                found
            },
            needed: format!("{}.{}", MIN_GO.0, MIN_GO.1),
        });
    }
    Ok(go)
}

/// Parses `go1.26.8` (or `go1.26rc1`) into `(1, 26)`.
fn parse_go_version(v: &str) -> Option<(u32, u32)> {
    let rest = v.strip_prefix("go")?;
    let mut parts = rest.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// The `-ldflags` that stamp the version into component-base and client-go, so the server
/// reports v1.37.2 (unstamped it says `v0.0.0-master`, which kubectl cannot parse).
fn version_ldflags() -> String {
    let minor = KUBERNETES_VERSION.split('.').nth(1).unwrap_or("0");
    let mut flags = String::from("-s -w");
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        flags.push_str(&format!(
            " -X {pkg}.gitVersion={KUBERNETES_VERSION} -X {pkg}.gitMajor=1 -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
        ));
    }
    flags
}

fn go_build(go: &str, out_dir: &Path) -> Result<()> {
    let mut child = Command::new(go)
        .current_dir(module_dir())
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=readonly")
        .args([
            "build",
            "-v",
            "-trimpath",
            "-ldflags",
            &version_ldflags(),
            "-o",
        ])
        .arg(out_dir)
        .arg("./cmd/...")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|_| Error::GoMissing(go.to_string()))?;
    let progress = Progress::start();
    let mut tail: Vec<String> = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr)
            .lines()
            .map_while(std::io::Result::ok)
        {
            progress.line(&line);
            tail.push(line);
            if tail.len() > 40 {
                tail.remove(0);
            }
        }
    }
    let status = child.wait().map_err(Error::io("waiting for go build"))?;
    progress.finish(status.success());
    if !status.success() {
        return Err(Error::GoBuild {
            status,
            output: tail.join("\n"),
        });
    }
    Ok(())
}

fn copy_kwok_stages(go: &str, out_dir: &Path) -> Result<()> {
    let out = Command::new(go)
        .current_dir(module_dir())
        .env("GOTOOLCHAIN", "local")
        .args(["list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"])
        .output()
        .map_err(Error::io("running go list"))?;
    let kwok = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let mut all = String::new();
    for stage in KWOK_STAGES {
        let path = kwok.join("kustomize/stage").join(stage);
        let text =
            fs::read_to_string(&path).map_err(Error::io(format!("reading {}", path.display())))?;
        all.push_str("---\n");
        all.push_str(&text);
        all.push('\n');
    }
    fs::write(out_dir.join(KWOK_STAGES_FILE), all).map_err(Error::io("writing kwok stages"))
}

/// Build progress: a spinner on a terminal; elsewhere (CI logs) a heartbeat line every 30 s
/// from a thread of its own, so a long silent compile still shows signs of life.
struct Progress {
    bar: ProgressBar,
    started: Instant,
    count: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
}

impl Progress {
    fn start() -> Self {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed}] building the control plane: {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        eprintln!(
            "idem: building the local control plane ({KUBERNETES_VERSION}) into {}; the first build takes ~10 minutes",
            cache_dir().display()
        );
        let progress = Self {
            bar,
            started: Instant::now(),
            count: Arc::default(),
            done: Arc::default(),
        };
        if progress.bar.is_hidden() {
            let (count, done, started) = (
                Arc::clone(&progress.count),
                Arc::clone(&progress.done),
                progress.started,
            );
            std::thread::spawn(move || {
                let mut next = Duration::from_secs(30);
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(500));
                    if started.elapsed() >= next && !done.load(Ordering::Relaxed) {
                        next += Duration::from_secs(30);
                        eprintln!(
                            "idem: still building ({} s, {} packages compiled)",
                            started.elapsed().as_secs(),
                            count.load(Ordering::Relaxed)
                        );
                    }
                }
            });
        }
        progress
    }

    fn line(&self, line: &str) {
        // `go build -v` names each package as it compiles it; anything else is a message.
        if !line.contains(' ') {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        self.bar.set_message(format!(
            "{} packages compiled, now {line}",
            self.count.load(Ordering::Relaxed)
        ));
    }

    fn finish(&self, ok: bool) {
        self.done.store(true, Ordering::Relaxed);
        self.bar.finish_and_clear();
        eprintln!(
            "idem: control plane build {} after {} s",
            if ok { "finished" } else { "FAILED" },
            self.started.elapsed().as_secs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_versions() {
        assert_eq!(parse_go_version("go1.26.8"), Some((1, 26)));
        assert_eq!(parse_go_version("go1.27rc1"), Some((1, 27)));
        assert_eq!(parse_go_version("devel"), None);
        assert!(parse_go_version("go1.25.3").unwrap() < MIN_GO);
    }

    #[test]
    fn ldflags_stamp_both_version_packages() {
        let flags = version_ldflags();
        assert!(flags.contains("k8s.io/component-base/version.gitVersion=v1.37.2"));
        assert!(flags.contains("k8s.io/client-go/pkg/version.gitMinor=37"));
    }

    #[test]
    fn stamp_covers_every_main() {
        let stamp = source_stamp().unwrap();
        assert!(stamp.starts_with(KUBERNETES_VERSION));
        for p in PROGRAMS {
            assert!(
                module_dir().join("cmd").join(p).join("main.go").is_file(),
                "{p}"
            );
        }
    }
}
