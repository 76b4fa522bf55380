//! The apply and status engines against the real local control plane (idem-tests): write
//! counts come from the API server's own `/metrics`.

mod apply;
mod common;
mod concurrent;
mod drift;
mod kinds;
mod oracle;
mod orphan;
mod race;
mod replace;
mod shared_map;
mod stale;
mod status;
#[path = "../common/user.rs"]
mod user;

/// Field manager of the tests' own writes (the counted user's FlowSchema and binding).
const MANAGER: &str = "idem-engine-tests";
