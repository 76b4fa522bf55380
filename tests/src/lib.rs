//! idem's local Kubernetes control plane, built from pinned Go modules, and the harness the
//! integration tests run against.
