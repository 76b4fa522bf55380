//! The example `BaseTenant` passes idem-tests' idempotence kit on the real control plane.
#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;
use base_tenant::{BaseTenant, BaseTenants};
use idem_tests::kit::{DriverSubject, Kit};
struct Example;
impl DriverSubject for Example {
    type Reconciler = BaseTenants;
    fn reconciler(&self, _: &kube::Client) -> BaseTenants {
        BaseTenants
    }
    fn primary(&self, name: &str) -> BaseTenant {
        let spec = serde_json::json!({"owners": ["alice", "bob"], "cpu": "2", "memory": "4Gi"});
        BaseTenant::new(name, serde_json::from_value(spec).unwrap())
    }
    fn flipped(&self, t: &BaseTenant) -> Option<BaseTenant> {
        let mut t = t.clone(); // one owner more: the RoleBinding's subjects change
        t.spec.owners.push("carol".into());
        Some(t)
    }
}

#[tokio::test]
async fn the_example_resource_passes_the_idempotence_kit() {
    let cp = idem_tests::shared();
    base_tenant::install_crd(&cp.client()).await.unwrap();
    let report = Kit::driven(cp, Example).run_all().await.unwrap();
    report.assert_idempotent();
}
