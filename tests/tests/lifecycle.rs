//! Starting and stopping whole control planes: kubectl works against them, and no process
//! outlives a dropped control plane or `down`.

use std::time::{Duration, Instant};

use idem_tests::process::pid_alive;
use idem_tests::{ControlPlane, Lifetime, Options};

fn wait_gone(pids: &[(String, u32)]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive: Vec<String> = pids
            .iter()
            .filter(|(_, pid)| pid_alive(*pid))
            .map(|(name, pid)| format!("{name} ({pid})"))
            .collect();
        if alive.is_empty() || Instant::now() > deadline {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn kubectl_works_and_dropping_stops_every_process() {
    let root = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(Options {
        run_root: root.path().to_path_buf(),
        ..Options::default()
    })
    .unwrap();
    let pids = cp.pids().to_vec();
    let names: Vec<&str> = pids.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok"
        ]
    );
    assert!(pids.iter().all(|(_, pid)| pid_alive(*pid)));

    let out = cp
        .kubectl()
        .args(["get", "ns", "-o", "name"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let namespaces = String::from_utf8_lossy(&out.stdout);
    assert!(
        namespaces.lines().any(|l| l == "namespace/default"),
        "{namespaces}"
    );

    let out = cp
        .kubectl()
        .args(["version", "-o", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let version: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(version["serverVersion"]["gitVersion"], "v1.37.2");
    assert_eq!(version["clientVersion"]["gitVersion"], "v1.37.2");

    let run_dir = cp.run_dir().to_path_buf();
    assert!(run_dir.join("kubeconfig").is_file());
    drop(cp);
    assert_eq!(wait_gone(&pids), Vec::<String>::new(), "outlived drop");
    assert!(!run_dir.exists(), "run directory left behind");
}

#[test]
fn a_detached_control_plane_survives_its_handle_and_down_stops_it() {
    let root = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(Options {
        lifetime: Lifetime::Detached,
        run_root: root.path().to_path_buf(),
        ..Options::default()
    })
    .unwrap();
    let pids = cp.pids().to_vec();
    drop(cp);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        pids.iter().all(|(_, pid)| pid_alive(*pid)),
        "detached processes died with the handle"
    );

    // A second detached start is refused while the first runs.
    let again = ControlPlane::start_with(Options {
        lifetime: Lifetime::Detached,
        run_root: root.path().to_path_buf(),
        ..Options::default()
    });
    assert!(
        matches!(again, Err(idem_tests::Error::AlreadyRunning(_))),
        "{again:?}"
    );

    let stopped = idem_tests::down(root.path()).unwrap();
    assert_eq!(stopped.len(), 5);
    assert_eq!(wait_gone(&pids), Vec::<String>::new(), "outlived down");
    assert!(matches!(
        idem_tests::down(root.path()),
        Err(idem_tests::Error::NoState(_))
    ));
}
