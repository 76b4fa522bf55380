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
//! Anything another manager changed in a field of ours moves that field to their entry (an
//! `Update` takes ownership of what it changes; a forced apply takes it over), so it fails (2)
//! and is reported with the manager's name ([`DriftKind::NotOwned`]). Fields other managers own
//! and we never set stay theirs: a forced apply would not touch them either.
//!
//! Sources: server-side apply (KEP-555, "Server-Side Apply", and the Kubernetes documentation
//! "Server-Side Apply: field management, merge strategy"), the `fieldsV1` encoding of
//! sigs.k8s.io/structured-merge-diff (`fieldpath` path elements `f:`, `k:`, `v:`, `i:` and the
//! `.` marker), apimachinery's field manager (fields it strips from every entry; `Update`
//! operations take ownership of changed fields and drop removed fields from every manager).
//! The property test `runtime/tests/engine/oracle.rs` checks the rule against the real API
//! server: "`dryRun=All` forced apply would change the object" ⇔ "not converged".

mod fields;
mod fingerprint;
mod quantity;
mod restrict;
mod schema;
mod spec_diff;

pub use fields::{Drift, DriftKind, check, is_converged};
pub use fingerprint::{Fingerprint, fingerprint};
pub use quantity::Quantity;
pub(crate) use restrict::restrict_to_desired;
#[doc(hidden)]
pub use spec_diff::{__field_diff, __to_value};

#[cfg(test)]
mod tests;
