//! `idem-operator`: the binary that runs idem's Tenant and TenantApp controllers.

fn main() {
    eprintln!("idem-operator: the controllers are not implemented yet");
    std::process::exit(2);
}
