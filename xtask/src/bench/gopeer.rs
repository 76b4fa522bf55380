//! Building the controller-runtime peer (`bench/controller-runtime/`, a Go module) once per
//! source change into a cache shared by every checkout, as the test harness builds the
//! control plane.

use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use indicatif::ProgressBar;

/// The binary's name in the cache.
const BINARY: &str = "bench-cr";
/// What the cached binary was built from.
const STAMP_FILE: &str = ".stamp";
/// The module's files the build reads.
const SOURCES: [&str; 3] = ["go.mod", "go.sum", "main.go"];

/// The Go module of the controller-runtime peer.
fn module_dir() -> PathBuf {
    crate::generated::repo_root()
        .join("bench")
        .join("controller-runtime")
}

/// `$XDG_CACHE_HOME/idem/bench-cr/` (`$HOME/.cache` when `XDG_CACHE_HOME` is unset).
fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("idem").join(BINARY)
}

/// A fingerprint (FNV-1a, 64 bit, hex) of the module's sources and the Go that builds them.
fn stamp(go_version: &str) -> anyhow::Result<String> {
    let module = module_dir();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for name in SOURCES {
        let file = module.join(name);
        let bytes = fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        for b in bytes.iter().chain(name.as_bytes()) {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    Ok(format!("{go_version} {hash:016x}\n"))
}

fn is_current(dir: &Path, stamp: &str) -> bool {
    fs::read_to_string(dir.join(STAMP_FILE)).is_ok_and(|s| s == stamp) && dir.join(BINARY).is_file()
}

/// `$IDEM_GO` or `go`, and its version.
fn go() -> anyhow::Result<(String, String)> {
    let go = std::env::var("IDEM_GO").unwrap_or_else(|_| "go".to_owned());
    let out = Command::new(&go)
        .args(["env", "GOVERSION"])
        .env("GOTOOLCHAIN", "local")
        .output()
        .with_context(|| {
            format!("running `{go} env GOVERSION` (Go builds the controller-runtime peer)")
        })?;
    if !out.status.success() {
        bail!("`{go} env GOVERSION` failed ({})", out.status);
    }
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Ok((go, version))
}

/// Returns the controller-runtime peer's binary, building it first (`go build`, optimised as
/// Go builds by default) when the cache holds none built from the current sources. A file lock
/// next to the cache makes a second caller wait for the first one's build and reuse it.
///
/// # Errors
/// When Go is missing or the build fails (with the tail of its output).
pub fn ensure_built(bar: &ProgressBar) -> anyhow::Result<PathBuf> {
    let (go, version) = go()?;
    let dir = cache_dir();
    let stamp = stamp(&version)?;
    if is_current(&dir, &stamp) {
        return Ok(dir.join(BINARY));
    }
    let parent = dir.parent().unwrap_or(Path::new("/")).to_path_buf();
    fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let lock_path = parent.join(format!(".{BINARY}.lock"));
    let lock =
        File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    if is_current(&dir, &stamp) {
        return Ok(dir.join(BINARY));
    }
    let staging = parent.join(format!(".{BINARY}.building"));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let mut child = Command::new(&go)
        .current_dir(module_dir())
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=readonly")
        .args(["build", "-v", "-trimpath", "-buildvcs=false", "-o"])
        .arg(staging.join(BINARY))
        .arg(".")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting `{go} build`"))?;
    let mut tail: Vec<String> = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            bar.set_message(format!("building {BINARY}: {}", line.trim()));
            tail.push(line);
            if tail.len() > 40 {
                tail.remove(0);
            }
        }
    }
    let status = child.wait().context("waiting for go build")?;
    if !status.success() {
        bail!(
            "`go build` of {} failed ({status}):\n{}",
            module_dir().display(),
            tail.join("\n")
        );
    }
    fs::write(staging.join(STAMP_FILE), &stamp).context("writing the build stamp")?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&staging, &dir).with_context(|| format!("moving {BINARY} to {}", dir.display()))?;
    Ok(dir.join(BINARY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_covers_the_module_and_the_go_version() {
        let a = stamp("go1.26.8").unwrap();
        assert_ne!(a, stamp("go1.27.0").unwrap());
        assert!(a.starts_with("go1.26.8 "));
        for name in SOURCES {
            assert!(module_dir().join(name).is_file(), "{name}");
        }
    }
}
