//! Convergence judged by the server's own record: is the object what one more server-side apply
//! of the desired body would leave it as?
//!
//! # The rule
//! A child is **converged** for field manager `m` exactly when a server-side apply of the
//! desired body by `m` with `force=true` would not change the stored object. The API server
//! already recorded everything needed to decide that without asking it: after an apply, the
//! object's `metadata.managedFields` holds an entry for `m` with operation `Apply` whose
//! `fieldsV1` is the set of fields `m` owns, with the schema's merge semantics already applied
//! (list keys, sets, atomic lists/maps/structs). So a child is converged when
//!
//! 1. `m` has an `Apply` entry on the main resource (not a subresource);
//! 2. that entry owns **every field of the desired body** — walking the desired JSON against the
//!    `fieldsV1` tree: `f:<name>` for a struct field or map key, `k:{…}` for an item of an
//!    associative list (keyed by the list-map keys; a key field the desired item leaves out
//!    matches the schema's default, as `protocol` of ports), `v:<value>` for an item of a set,
//!    `i:<n>` for an item by position; a node without children is a value owned **as a whole**
//!    (a scalar, or an atomic list/map/struct);
//! 3. it owns **nothing the desired body lacks** (else the apply would remove that field);
//! 4. every desired value equals the live value: scalars exactly, quantities by value only in
//!    the fields whose type is `resource.Quantity` ([`schema`](self) table, by kind and path,
//!    never by key name); a value owned as a whole equals as a whole (same keys, same list
//!    length and order), except keys or items another manager owns (a granular map or list we
//!    applied empty: theirs); an owned field that is absent from the live object counts as
//!    equal only when Go drops it on the wire (an empty map or list, a zero scalar of a
//!    non-pointer `omitempty` field), because a removal by any writer also drops the field from
//!    every manager's set;
//! 5. an associative-list item we own matches exactly one live item (a duplicate added by
//!    someone else is drift).
//!
//! # When the rule cannot decide alone
//! A child created by `POST` and not applied to since is judged by its create's record seen as
//! an apply's ([`crate::apply::as_applied`]); a zero value or empty map of the desired body that
//! neither that record nor the object holds is a field Go omitted on the wire, or a map key
//! another writer removed since, and only the server's schema tells which: the check reports
//! it as [`DriftKind::Unrecorded`], and the engine takes the server's answer as below (and
//! names it in `DriftRepaired` only where its apply put the value back).
//!
//! Rule (4) knows the server's canonical forms only where this module has them (quantities of
//! the built-in kinds), and a value owned as a whole is compared as a whole, so a default the
//! server adds inside it (`volumeMode` in a StatefulSet's `volumeClaimTemplates`, defaults of a
//! custom resource's atomic list), a canonical form of a field it does not know, or a field the
//! server moves (a Secret's `stringData` into `data`, in a body not made by
//! `DesiredChildren::add`, which folds it) reads as drift. The engine then asks the
//! server: a `dryRun=All` apply of the desired body returns the object as the apply would
//! leave it, and an apply changes nothing exactly when that equals the live object in every
//! field the apply could change (`settled`). The answer is kept per child and desired body
//! as a fingerprint (and learned for free from each create's and apply's response), so a
//! later pass decides with no request. The tables here are only a fast path: the property
//! test `runtime/tests/engine/oracle.rs` checks them against the server, and
//! `runtime/tests/engine/kinds.rs` shows the kinds they do not cover converging.
//!
//! Anything another manager changed in a field of ours moves that field to their entry (an
//! `Update` takes ownership of what it changes; a forced apply takes it over), so it fails (2)
//! and is reported with the manager's name ([`DriftKind::NotOwned`]). Fields other managers own
//! and we never set stay theirs: a forced apply would not touch them either.
//!
//! A field we own that another manager owns too at an equal value is converged even when our
//! spelling differs from the stored one (a quantity "0.5" stored as "500m", which they
//! applied): the server would read our apply as a change and take the field from them, but
//! the object's values and our own record would stay as they are, and taking it would start a
//! fight with any co-applier that judges its own record (each apply strips the other).
//!
//! The property test `runtime/tests/engine/oracle.rs` checks the rule against the real API
//! server: "`dryRun=All` forced apply would change the object's values or our own
//! `managedFields` entry" ⇔ "not converged".

mod fields;
mod fingerprint;
mod quantity;
mod restrict;
mod schema;
mod settled;
mod spec_diff;

#[cfg(not(feature = "testing"))]
pub(crate) use fields::check;
pub(crate) use fields::check_entries;
pub(crate) use fields::entry_name;
pub use fields::{Drift, DriftKind};
/// The convergence check, public for the oracle test only (feature `testing`).
#[cfg(feature = "testing")]
pub use fields::{check, is_converged};
pub(crate) use fingerprint::keyed_fingerprint;
pub use fingerprint::{Fingerprint, fingerprint};
pub use quantity::Quantity;
pub(crate) use restrict::restrict_to_desired;
pub(crate) use settled::{differences, settled, unite_fields};
#[doc(hidden)]
pub use spec_diff::{__field_diff, __to_value};

#[cfg(test)]
mod tests;
