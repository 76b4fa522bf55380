//! Stopping the control plane's controller-manager (its quota controller, garbage collector,
//! namespace controller) for a while, to open the windows it normally closes at once.

/// Sends `signal` (`STOP`, `CONT`) to the shared control plane's controller-manager.
fn signal(signal: &str) {
    let pid = idem_tests::shared()
        .pids()
        .iter()
        .find(|(n, _)| n == "kube-controller-manager")
        .expect("a controller-manager")
        .1;
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Stops the controller-manager (SIGSTOP) until the returned guard is dropped.
#[must_use = "the controller-manager resumes when the guard is dropped"]
pub fn stop() -> Resume {
    signal("STOP");
    Resume
}

/// Resumes the controller-manager when dropped, so a failing test does not leave it stopped.
pub struct Resume;

impl Drop for Resume {
    fn drop(&mut self) {
        signal("CONT");
    }
}
