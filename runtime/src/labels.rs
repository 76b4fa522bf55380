//! The labels and the annotation idem puts on every child it makes, read back by the child
//! caches, the controller's mappings and the apply engine.
//!
//! All but [`MANAGED_BY_LABEL`] live under the owner kind's label prefix
//! (`#[idempotent(label_prefix = "...")]`, default the kind's API group, see
//! [`IdempotentResource::LABEL_PREFIX`]): the children of a `BaseTenant` in group
//! `example.idem.dev` carry `example.idem.dev/owner-uid`, never a name of idem's operator. A
//! [`Labels`] is one such set of names; the consts below are the set of idem's operator's
//! kinds (group `tenancy.idem.dev`), which is `Labels::with_prefix("tenancy.idem.dev")`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::resource::IdempotentResource;

/// Label naming the field manager that manages the object (Kubernetes recommended label).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The label prefix of idem's operator's kinds (their API group).
pub const OPERATOR_PREFIX: &str = "tenancy.idem.dev";
/// [`Labels::tenant`] of idem's operator's kinds: the label naming the tenant a child belongs to.
pub const TENANT_LABEL: &str = "tenancy.idem.dev/tenant";
/// [`Labels::owner_uid`] of idem's operator's kinds: the label holding the owner's
/// `metadata.uid`; used to list an owner's children for pruning.
pub const OWNER_UID_LABEL: &str = "tenancy.idem.dev/owner-uid";
/// [`Labels::shard_bucket`] of idem's operator's kinds.
pub const SHARD_BUCKET_LABEL: &str = "tenancy.idem.dev/shard-bucket";
/// [`Labels::fingerprint`] of idem's operator's kinds.
pub const FINGERPRINT_ANNOTATION: &str = "tenancy.idem.dev/applied-fingerprint";

/// The names of the labels and the annotation idem stamps on the children of one owner kind,
/// all under one prefix. `Copy`: the names are interned once per distinct prefix (at most one
/// per kind compiled in, never per tenant input).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Labels(&'static Names);

/// The interned names of one prefix.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Names {
    prefix: &'static str,
    tenant: &'static str,
    owner_uid: &'static str,
    shard_bucket: &'static str,
    fingerprint: &'static str,
}

/// The names of idem's operator's kinds: the consts.
static OPERATOR: Names = Names {
    prefix: OPERATOR_PREFIX,
    tenant: TENANT_LABEL,
    owner_uid: OWNER_UID_LABEL,
    shard_bucket: SHARD_BUCKET_LABEL,
    fingerprint: FINGERPRINT_ANNOTATION,
};

/// Every prefix interned so far, with its names (idem's operator's always).
fn interned() -> &'static Mutex<HashMap<&'static str, &'static Names>> {
    static SETS: OnceLock<Mutex<HashMap<&'static str, &'static Names>>> = OnceLock::new();
    SETS.get_or_init(|| Mutex::new(HashMap::from([(OPERATOR_PREFIX, &OPERATOR)])))
}

impl Labels {
    /// The names of the owner kind `K`: under [`IdempotentResource::LABEL_PREFIX`].
    #[must_use]
    pub fn of<K: IdempotentResource>() -> Self {
        Self::with_prefix(K::LABEL_PREFIX)
    }

    /// The names under `prefix` (a DNS subdomain, e.g. a CRD's group). Call it only with
    /// prefixes fixed at compile time: each distinct prefix is kept for the life of the process.
    #[must_use]
    pub fn with_prefix(prefix: &str) -> Self {
        let mut sets = interned().lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(names) = sets.get(prefix) {
            return Self(names);
        }
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        let names: &'static Names = Box::leak(Box::new(Names {
            prefix: leak(prefix.to_owned()),
            tenant: leak(format!("{prefix}/tenant")),
            owner_uid: leak(format!("{prefix}/owner-uid")),
            shard_bucket: leak(format!("{prefix}/shard-bucket")),
            fingerprint: leak(format!("{prefix}/applied-fingerprint")),
        }));
        sets.insert(names.prefix, names);
        Self(names)
    }

    /// The names of idem's operator's kinds ([`OPERATOR_PREFIX`]).
    #[must_use]
    pub fn operator() -> Self {
        Self::with_prefix(OPERATOR_PREFIX)
    }

    /// Every set interned so far: idem's operator's, and those of the kinds whose owners or
    /// controllers were made.
    pub(crate) fn known() -> Vec<Self> {
        let sets = interned().lock().unwrap_or_else(PoisonError::into_inner);
        sets.values().map(|n| Self(n)).collect()
    }

    /// The prefix.
    #[must_use]
    pub fn prefix(self) -> &'static str {
        self.0.prefix
    }

    /// `<prefix>/tenant`: the label naming the tenant a child belongs to. Stamped only when
    /// the tenant is a label value ([`Labels::is_value`]): a tenant named by a spec field may
    /// be any string ("Acme Corp"), and a child carrying it would be refused as invalid.
    #[must_use]
    pub fn tenant(self) -> &'static str {
        self.0.tenant
    }

    /// Whether `value` is a valid label value, by the API server's rule: at most 63
    /// characters, alphanumerics, `-`, `_` and `.`, beginning and ending with an alphanumeric
    /// (or empty).
    #[must_use]
    pub fn is_value(value: &str) -> bool {
        let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        value.is_empty()
            || (value.len() <= 63
                && alnum(value.chars().next())
                && alnum(value.chars().last())
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    }

    /// `<prefix>/owner-uid`: the label holding the owner's `metadata.uid`; used to list an
    /// owner's children for pruning.
    #[must_use]
    pub fn owner_uid(self) -> &'static str {
        self.0.owner_uid
    }

    /// `<prefix>/shard-bucket`: the label holding the shard bucket of the owner's
    /// `metadata.uid` (decimal `0..=255`: [`crate::shard::bucket_of`] of its FNV-1a hash), so
    /// that a sharded replica's child watches can select the children of the owners it owns
    /// by label ([`crate::shard::Ranges::label_selector`]); the children's own uids hash
    /// elsewhere. Only ever used to narrow a watch: which replica reconciles an owner is
    /// decided by the owner's own uid, so a forged value can hide a child from its owner's
    /// replica (until read-repair applies the label back) but never makes another replica act
    /// on it.
    #[must_use]
    pub fn shard_bucket(self) -> &'static str {
        self.0.shard_bucket
    }

    /// `<prefix>/applied-fingerprint`: the annotation holding the fingerprint of the desired
    /// body last applied.
    #[must_use]
    pub fn fingerprint(self) -> &'static str {
        self.0.fingerprint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_live_under_the_prefix_and_are_interned_once() {
        let a = Labels::with_prefix("teams.example.com");
        assert_eq!(a.tenant(), "teams.example.com/tenant");
        assert_eq!(a.owner_uid(), "teams.example.com/owner-uid");
        assert_eq!(a.shard_bucket(), "teams.example.com/shard-bucket");
        assert_eq!(a.fingerprint(), "teams.example.com/applied-fingerprint");
        let b = Labels::with_prefix(&String::from("teams.example.com"));
        assert!(std::ptr::eq(a.0, b.0), "one set per prefix");
        assert!(Labels::known().contains(&a));
    }

    #[test]
    fn label_values_follow_the_api_servers_rule() {
        for ok in ["", "acme", "Acme_Corp.1", "a-b", &"t".repeat(63)] {
            assert!(Labels::is_value(ok), "{ok:?}");
        }
        for bad in ["Acme Corp", "ééé", "-a", "a-", "a/b", &"t".repeat(64)] {
            assert!(!Labels::is_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_operator_set_is_the_consts() {
        let o = Labels::operator();
        assert_eq!(o.tenant(), TENANT_LABEL);
        assert_eq!(o.owner_uid(), OWNER_UID_LABEL);
        assert_eq!(o.shard_bucket(), SHARD_BUCKET_LABEL);
        assert_eq!(o.fingerprint(), FINGERPRINT_ANNOTATION);
    }
}
