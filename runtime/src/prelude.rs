//! What a resource on idem needs, in one import: `use idem_runtime::prelude::*;`.
//!
//! The derive and the trait it implements ([`IdempotentResource`], one name for both), the
//! reconciler ([`Reconciler`], [`Pass`], [`Outcome`], [`Cleanup`], [`ReconcileError`], [`retain_children`], the
//! child kinds it declares, [`ChildKinds`], and what its readiness reads, [`Children`]), the
//! desired children ([`DesiredChildren`]) and what their apply did ([`ApplyReport`],
//! [`ChildOutcome`], [`CreatedChild`] for the record in its status), the readiness its status
//! says ([`Readiness`]), and what runs it ([`Manager`], [`Reconciles`], [`ManagerError`], [`Driver`],
//! [`DriverConfig`], [`Controller`], [`ControllerConfig`], [`Action`]).
//!
//! ```
//! use idem_runtime::prelude::*;
//! # use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
//! # use kube::CustomResource;
//! # use schemars::JsonSchema;
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
//! # pub struct S { pub observed_generation: Option<i64>, pub conditions: Vec<Condition>,
//! #     pub created_children: Vec<CreatedChild> }
//! #[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
//! #[kube(group = "example.com", version = "v1", kind = "Db", namespaced, status = "S")]
//! #[idempotent(tenant = namespace)]
//! pub struct DbSpec { pub size: u32 }
//!
//! struct Dbs;
//! impl Reconciler for Dbs {
//!     type Resource = Db;
//!     fn desired(&self, _db: &Db) -> Result<DesiredChildren, ReconcileError> {
//!         Ok(DesiredChildren::new())
//!     }
//! }
//! ```

pub use crate::IdempotentResource;
pub use crate::apply::{ApplyError, ApplyReport, ChildOutcome, CreatedChild, DesiredChildren};
pub use crate::controller::{Action, Controller, ControllerConfig};
pub use crate::key::{ObjectKey, TenantKey};
pub use crate::manager::{Manager, ManagerError, Reconciles};
pub use crate::reconciler::retention::retain_children;
pub use crate::reconciler::{
    ChildKinds, Children, Cleanup, Driver, DriverConfig, Outcome, Pass, ReconcileError, Reconciler,
};
pub use crate::resource::IdempotentResource;
pub use crate::status::Readiness;
