//! The manager: runs any number of controllers in one process — client, `/metrics`,
//! `/healthz`, `/readyz`, one of three modes (single, leader-elected, sharded over a ring of
//! member Leases), write fences, and graceful shutdown on SIGTERM or Ctrl-C.
//!
//! A binary's `main` (`runtime/examples/base_tenant.rs` is a complete one):
//!
//! ```ignore
//! fn main() -> Result<(), idem_runtime::manager::ManagerError> {
//!     Manager::from_args("base-tenant") // `run` with its flags (the default), or `crds`
//!         .add(Reconciles::new(BaseTenants)) // any number of kinds, or sets of controllers
//!         .run()
//! }
//! ```
//!
//! - [`cli`]: the command line ([`Cli`]); [`options`]: what `run`'s flags set.
//! - [`controllers`]: [`Controllers`], the type-erased set of controllers a manager runs, and
//!   [`Reconciles`], one reconciler's kind.
//! - [`client`]: the retrying, fenced client, on [`transport`]: every request on one HTTP/2
//!   connection.
//! - `run`: the modes (behind [`Manager::run_until`]); `sharded`: the sharded mode's loop
//!   over rings.
//!
//! Names derive from the manager's name: the leader Lease is `<name>`, the shard ring's
//! member Leases are `<name>-shard-<identity>` labelled
//! [`MEMBER_LABEL`](crate::shard::membership::MEMBER_LABEL)`=<name>`, Events are reported by
//! `<name>`.

pub mod cli;
pub mod client;
pub mod controllers;
mod epoch;
mod error;
pub mod options;
mod proxy;
pub mod rbac;
mod run;
mod sharded;
pub mod transport;

use std::sync::Arc;

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

pub use self::cli::{Cli, Command, RbacArgs, RunArgs};
pub use self::controllers::{Controllers, Reconciles, Running, Shard, Start, Stopped};
pub use self::error::ManagerError;
pub use self::options::{ManagerOptions, RequestsInFlight};
pub use crate::http::shutdown_signal;

/// A process's controllers and how they run; see the [module docs](self).
pub struct Manager {
    name: String,
    options: ManagerOptions,
    command: Option<Command>,
    sets: Vec<Arc<dyn Controllers>>,
    install_crds: bool,
}

impl Manager {
    /// A manager named `name` (its Leases, ring and Events reporter) running with `options`.
    pub fn new(name: impl Into<String>, options: ManagerOptions) -> Self {
        Self {
            name: name.into(),
            options,
            command: None,
            sets: Vec::new(),
            install_crds: false,
        }
    }

    /// A manager named `name` as the process's command line says ([`Cli`]): `run` with its
    /// flags (the default) or `crds`. Exits the process on invalid arguments or `--help`.
    pub fn from_args(name: impl Into<String>) -> Self {
        let name = name.into();
        let command = Cli::parse_for(&name);
        let options = match &command {
            Command::Run(args) => args.options(),
            Command::Crds | Command::Rbac(_) => ManagerOptions::default(),
        };
        Self {
            command: Some(command),
            ..Self::new(name, options)
        }
    }

    /// Also runs `controllers`.
    #[must_use]
    #[allow(clippy::should_implement_trait)] // a builder step, not `+`
    pub fn add(mut self, controllers: impl Controllers) -> Self {
        self.sets.push(Arc::new(controllers));
        self
    }

    /// Server-side applies the kinds' CRDs at start and waits until they are established
    /// (without it, a missing CRD is only logged and its watches retry until it exists).
    #[must_use]
    pub fn installing_crds(mut self) -> Self {
        self.install_crds = true;
        self
    }

    /// The manager's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How it runs.
    pub fn options(&self) -> &ManagerOptions {
        &self.options
    }

    /// The CRDs of every kind, structurally checked.
    ///
    /// # Errors
    /// [`ManagerError::Schema`] naming a field without a structural schema.
    pub fn crds(&self) -> Result<Vec<CustomResourceDefinition>, ManagerError> {
        let mut crds = Vec::new();
        for set in &self.sets {
            crds.extend(set.crds()?);
        }
        Ok(crds)
    }

    /// The RBAC objects of the manager's ServiceAccount (named after the manager) in
    /// `namespace`, where its Leases are: the namespace (unless `default`), the
    /// ServiceAccount, a ClusterRole with the rules of every set of controllers
    /// ([`Controllers::rules`]) and the manager's own (Events; CRDs when it installs them), a
    /// Role for its Leases, and their bindings (see [`rbac`]); then the admission policies of
    /// every set ([`Controllers::admission`]: the cleanup guard of each kind with a finalizer).
    ///
    /// # Errors
    /// When it installs the CRDs ([`Manager::installing_crds`]) and they cannot be generated
    /// (as [`Manager::crds`]): the rules to write them would be missing.
    pub fn rbac(&self, namespace: &str) -> Result<Vec<serde_json::Value>, ManagerError> {
        let mut objects = rbac::objects(&self.name, namespace, self.rules()?);
        objects.extend(self.sets.iter().flat_map(|set| set.admission()));
        Ok(objects)
    }

    /// The rules of the ClusterRole of [`Manager::rbac`].
    fn rules(&self) -> Result<Vec<PolicyRule>, ManagerError> {
        let mut rules = Vec::new();
        for set in &self.sets {
            rules.extend(set.rules());
        }
        let installing: Vec<String> = if self.install_crds {
            (self.crds()?.iter())
                .filter_map(|c| c.metadata.name.clone())
                .collect()
        } else {
            Vec::new()
        };
        rules.extend(rbac::manager_rules(&installing));
        Ok(rules)
    }

    /// Carries out the command line (`crds`: prints the CRDs as YAML; `rbac`: prints the RBAC
    /// objects of its ServiceAccount; `run`: logs as
    /// `--log-format` says and runs on a tokio runtime of its own until SIGTERM or Ctrl-C).
    /// Call it from a synchronous `main`.
    ///
    /// # Errors
    /// As [`Manager::run_until`], and when the CRDs cannot be generated.
    pub fn run(mut self) -> Result<(), ManagerError> {
        match self.command.take() {
            Some(Command::Crds) => {
                for crd in self.crds()? {
                    let yaml = serde_saphyr::to_string(&crd).map_err(|e| ManagerError::Crd {
                        name: crd.metadata.name.clone().unwrap_or_default(),
                        message: e.to_string(),
                    })?;
                    if !emit(&format!("---\n{yaml}"))? {
                        break;
                    }
                }
                return Ok(());
            }
            Some(Command::Rbac(args)) => {
                let mut text = format!("# generated by `{} rbac`\n", self.name);
                let rules = self.rules()?;
                let objects = self.rbac(&args.namespace)?;
                for note in rbac::notes(&rules, &args.namespace) {
                    text.push_str(&rbac::comment(&note));
                }
                if !emit(&text)? {
                    return Ok(());
                }
                for object in objects {
                    let yaml =
                        serde_saphyr::to_string(&object).map_err(|e| ManagerError::Rbac {
                            kind: object["kind"].as_str().unwrap_or_default().to_owned(),
                            message: e.to_string(),
                        })?;
                    if !emit(&format!("---\n{yaml}"))? {
                        break;
                    }
                }
                return Ok(());
            }
            Some(Command::Run(args)) => args.init_logging(),
            None => {}
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|source| ManagerError::Io {
                what: "building the tokio runtime",
                source,
            })?;
        runtime.block_on(self.run_until(shutdown_signal()))
    }

    /// Runs every controller until `shutdown` resolves, then shuts down gracefully (stop
    /// taking work, let in-flight reconciles finish within the shutdown grace, release the
    /// Leases); on lost leadership, cancels every reconcile at once and fails.
    ///
    /// `/readyz` does not depend on leadership: a standby is ready once it takes part in the
    /// election; while it works, a replica is ready while every controller's caches are
    /// synced and their watches established. A replica waiting for a shard ring is ready as
    /// a standby is. A replica outside the ring that finds a live ring at start waits until it
    /// is gone (ready meanwhile, as a standby, so that the rolling update replacing the ring's
    /// replicas goes on); one that finds it while it works or stands by exits with
    /// [`ManagerError::RingLive`] (see [`crate::shard::guard`]), and a shard member whose Lease
    /// another process renews exits with [`ManagerError::Refused`].
    ///
    /// # Errors
    /// [`ManagerError`] when the client or endpoints cannot be set up, a controller's
    /// configuration is invalid, or leadership is lost (so the process exits and a standby
    /// takes over).
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping it cancels every reconcile mid-flight and leaves the Leases
    /// to expire (as a killed process does).
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ManagerError> {
        run::run(self, shutdown).await
    }
}

/// Writes `text` to standard output: `Ok(false)` when its reader went away (a pipe closed
/// early, as `| head` does), after which the caller writes nothing more.
///
/// # Errors
/// [`ManagerError::Io`] when standard output fails otherwise.
fn emit(text: &str) -> Result<bool, ManagerError> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(source) => Err(ManagerError::Io {
            what: "writing to standard output",
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A set of controllers whose CRD cannot be generated.
    struct Unstructural;

    impl Controllers for Unstructural {
        fn crds(&self) -> Result<Vec<CustomResourceDefinition>, crate::schema::SchemaError> {
            Err(crate::schema::SchemaError::StatusFieldName {
                kind: "Snake".into(),
                found: "observed_generation".into(),
                wire: "observedGeneration",
            })
        }
        fn sharded(&self) -> Vec<(String, crate::shard::ShardField)> {
            Vec::new()
        }
        fn start(&self, _: Start<'_>) -> Running {
            unreachable!("not run")
        }
        fn rules(&self) -> Vec<PolicyRule> {
            Vec::new()
        }
    }

    /// Without its CRDs the ClusterRole of a manager that installs them would lack the rules
    /// to write them: `rbac` says why instead of printing it.
    #[test]
    fn rbac_of_a_manager_installing_crds_it_cannot_generate_is_their_error() {
        let manager = Manager::new("snakes", ManagerOptions::default()).add(Unstructural);
        assert!(manager.rbac("ops").is_ok(), "it installs no CRD");
        let err = (manager.installing_crds().rbac("ops"))
            .expect_err("rbac without the CRD rules")
            .to_string();
        assert!(err.contains("`observed_generation` must be"), "{err}");
    }
}
