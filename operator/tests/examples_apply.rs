//! The README's way to try the examples works on a fresh cluster, with the real kubectl:
//! `kubectl apply --server-side -f examples/` (the tenants), wait until they are Ready, then
//! `kubectl apply --server-side -f examples/apps/` (apps need the namespaces the operator
//! makes). In a binary of its own: the examples use fixed names.

mod common;

use common::{TIMEOUT, apps, shared_operator, tenants};
use idem_tests::shared;

/// Runs the control plane's kubectl with `args` from the repository root; returns its output.
///
/// # Panics
/// When kubectl fails.
async fn kubectl(args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = shared()
            .kubectl()
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .args(&args)
            .output()
            .expect("running kubectl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "kubectl {args:?} failed: {text}");
        text
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn the_readme_commands_apply_every_example_on_a_fresh_cluster() {
    shared_operator().await;
    let client = shared().client();
    let out = kubectl(&["apply", "--server-side", "-f", "examples/"]).await;
    for tenant in ["acme", "globex", "initech"] {
        assert!(
            out.contains(&format!(
                "tenant.tenancy.idem.dev/{tenant} serverside-applied"
            )),
            "{out}"
        );
    }
    let timeout = format!("--timeout={}s", TIMEOUT.as_secs());
    kubectl(&[
        "wait",
        "--for=condition=Ready",
        "tenants",
        "--all",
        &timeout,
    ])
    .await;
    let out = kubectl(&["apply", "--server-side", "-f", "examples/apps/"]).await;
    assert!(
        out.contains("tenantapp.tenancy.idem.dev/web serverside-applied"),
        "{out}"
    );
    for tenant in ["acme", "globex", "initech"] {
        tenants::wait_ready(&client, tenant).await;
    }
    apps::wait_ready(&client, "initech-apps", "web").await;
}
