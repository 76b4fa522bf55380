//! The operator finds its cluster as kubectl does: with no `--kubeconfig`, a `KUBECONFIG` that
//! lists several files (colon-separated) is read as their merge, not as one file's path.

mod common;

use common::process::OperatorProcess;
use common::{TIMEOUT, install_crds};
use idem_tests::{create_namespace, shared};

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
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !operator.ready().await {
        if let Some(status) = operator.exited() {
            panic!(
                "the operator exited ({status}) with KUBECONFIG={list}:\n{}",
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
