//! Flags of `idem-operator run` that no other test sets, on the operator process against the
//! real control plane: with no `--kubeconfig` it finds its cluster as kubectl does (a
//! `KUBECONFIG` listing several files is read as their merge, not as one file's path), and
//! `--log-format json` writes every log line as a JSON object.

mod common;

use common::process::OperatorProcess;
use common::{TIMEOUT, install_crds};
use idem_tests::{create_namespace, shared};
use serde_json::Value;

#[tokio::test]
async fn a_kubeconfig_variable_listing_several_files_is_merged() {
    let client = shared().client();
    install_crds(&client).await;
    let ns = create_namespace(&client, "kubeconfig").await.unwrap();
    let path = shared().kubeconfig_path().display().to_string();
    // The same file twice: kubectl merges the list (the first file's entries win).
    let list = format!("{path}:{path}");
    let mut operator =
        OperatorProcess::spawn_with(std::path::Path::new(&list), &ns, "idem-operator-kc", |a| a);
    wait_ready(&mut operator, &format!("KUBECONFIG={list}")).await;
}

#[tokio::test]
async fn log_format_json_writes_every_line_as_a_json_object() {
    let client = shared().client();
    install_crds(&client).await;
    let ns = create_namespace(&client, "logjson").await.unwrap();
    let mut operator = OperatorProcess::spawn_with(
        shared().kubeconfig_path(),
        &ns,
        "idem-operator-json",
        |mut args| {
            args.push("--log-format=json".into());
            args
        },
    );
    wait_ready(&mut operator, "--log-format=json").await;
    let log = std::fs::read_to_string(&operator.log).unwrap();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no log line");
    for line in lines {
        let value: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(value["fields"]["message"].is_string(), "{line}");
    }
}

/// Waits until `operator` is Ready; fails with its log when it exits first.
async fn wait_ready(operator: &mut OperatorProcess, started_with: &str) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !operator.ready().await {
        if let Some(status) = operator.exited() {
            panic!(
                "the operator exited ({status}), started with {started_with}:\n{}",
                operator.log_tail()
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not Ready within {TIMEOUT:?}:\n{}",
            operator.log_tail()
        );
        tokio::time::sleep(common::POLL).await;
    }
}
