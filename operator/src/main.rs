//! `idem-operator`: runs idem's Tenant and TenantApp controllers (`run`, the default) or
//! prints their CRDs (`crds`).

fn main() -> Result<(), idem_runtime::manager::ManagerError> {
    idem_runtime::manager::Manager::from_args(idem_operator::NAME)
        .add(idem_operator::controllers::Operator)
        .run()
}
