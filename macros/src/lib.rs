//! `#[derive(IdempotentResource)]`: the derive that turns a kube `CustomResource` spec into an
//! idem tenant resource (desired-state comparison, tenant key, status bookkeeping).
