//! Keys: which tenant a piece of work belongs to, and which object it is about.

use std::fmt;
use std::sync::Arc;

/// The tenant that owns a piece of work; the unit of fairness in the work queue.
///
/// For a cluster-scoped root such as `Tenant` it is the object's own name; for namespaced
/// resources it is usually the value of the `tenancy.idem.dev/tenant` label of their namespace.
/// Cheap to clone (a reference-counted string).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantKey(Arc<str>);

impl TenantKey {
    /// A tenant key from its name.
    pub fn new(name: impl AsRef<str>) -> Self {
        Self(Arc::from(name.as_ref()))
    }

    /// The tenant's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TenantKey({:?})", &*self.0)
    }
}

impl fmt::Display for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for TenantKey {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

impl From<String> for TenantKey {
    fn from(s: String) -> Self {
        Self::new(s)
    }
}

/// A reference to one object: its kind, namespace (`None` when cluster-scoped) and name.
///
/// This is the identity the work queue dedupes on: two events for the same object collapse into
/// one pending reconcile.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The object's kind, e.g. `Tenant`.
    pub kind: Arc<str>,
    /// The object's namespace; `None` for cluster-scoped objects.
    pub namespace: Option<Arc<str>>,
    /// The object's `metadata.name`.
    pub name: Arc<str>,
}

impl ObjectKey {
    /// A key for a namespaced object.
    pub fn namespaced(kind: &str, namespace: &str, name: &str) -> Self {
        Self {
            kind: kind.into(),
            namespace: Some(namespace.into()),
            name: name.into(),
        }
    }

    /// A key for a cluster-scoped object.
    pub fn cluster(kind: &str, name: &str) -> Self {
        Self {
            kind: kind.into(),
            namespace: None,
            name: name.into(),
        }
    }
}

/// One shared copy of each value put in the set: what is no longer held elsewhere is dropped
/// whenever the set has doubled since it was last swept, so it stays within twice the values
/// in use.
#[derive(Debug)]
struct Interned<T: ?Sized> {
    values: std::collections::HashSet<Arc<T>>,
    swept_at: usize,
}

impl<T: ?Sized> Default for Interned<T> {
    fn default() -> Self {
        Self {
            values: std::collections::HashSet::new(),
            swept_at: 0,
        }
    }
}

impl<T: ?Sized + Eq + std::hash::Hash> Interned<T> {
    /// The shared copy of `value`, made by `make` when there is none.
    fn get<Q>(&mut self, value: &Q, make: impl FnOnce(&Q) -> Arc<T>) -> Arc<T>
    where
        Q: ?Sized + Eq + std::hash::Hash,
        Arc<T>: std::borrow::Borrow<Q>,
    {
        if let Some(shared) = self.values.get(value) {
            return Arc::clone(shared);
        }
        if self.values.len() >= (2 * self.swept_at).max(64) {
            self.values.retain(|v| Arc::strong_count(v) > 1);
            self.swept_at = self.values.len();
        }
        let shared = make(value);
        self.values.insert(Arc::clone(&shared));
        shared
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.values.len()
    }
}

/// The owners a child maps to (most children have one, and an owner's children the same).
pub(crate) type Owners = Arc<[(ObjectKey, TenantKey)]>;

/// One shared copy of each string a watch puts in many keys (kinds, namespaces, owners'
/// names), and of each list of owners its children map to: the keys of an owner's children
/// point to one allocation instead of one each, and so do their owner lists.
#[derive(Debug, Default)]
pub(crate) struct SharedStrings {
    strings: Interned<str>,
    owners: Interned<[(ObjectKey, TenantKey)]>,
}

impl SharedStrings {
    /// The shared copy of `s`.
    pub(crate) fn get(&mut self, s: &str) -> Arc<str> {
        self.strings.get(s, |s| Arc::from(s))
    }

    /// `key` with its kind, namespace and (with `name`) name shared.
    pub(crate) fn key(&mut self, key: &ObjectKey, name: bool) -> ObjectKey {
        ObjectKey {
            kind: self.get(&key.kind),
            namespace: key.namespace.as_deref().map(|ns| self.get(ns)),
            name: if name {
                self.get(&key.name)
            } else {
                Arc::clone(&key.name)
            },
        }
    }

    /// `tenant`, shared.
    pub(crate) fn tenant(&mut self, tenant: &TenantKey) -> TenantKey {
        TenantKey(self.get(tenant.as_str()))
    }

    /// `owners` (whose keys and tenants are shared already), shared.
    pub(crate) fn owners(&mut self, owners: &[(ObjectKey, TenantKey)]) -> Owners {
        self.owners.get(owners, |o| Arc::from(o))
    }

    /// Strings held now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.strings.len()
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}/{}/{}", self.kind, ns, self.name),
            None => write!(f, "{}/{}", self.kind, self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_strings_share_one_copy_and_drop_the_unused() {
        let mut strings = SharedStrings::default();
        let a = strings.key(&ObjectKey::namespaced("Quota", "ns-1", "owner"), true);
        let b = strings.key(&ObjectKey::namespaced("Quota", "ns-1", "owner"), true);
        assert_eq!(a, b);
        assert!(Arc::ptr_eq(&a.kind, &b.kind) && Arc::ptr_eq(&a.name, &b.name));
        assert!(Arc::ptr_eq(
            a.namespace.as_ref().unwrap(),
            b.namespace.as_ref().unwrap()
        ));
        let own = ObjectKey::namespaced("Quota", "ns-1", "child");
        let c = strings.key(&own, false);
        assert!(
            Arc::ptr_eq(&c.name, &own.name),
            "a child's own name is not copied"
        );
        // Strings nobody holds go once the set has grown enough to sweep.
        for i in 0..1_000 {
            let _ = strings.get(&format!("gone-{i}"));
        }
        assert!(strings.len() < 200, "{} strings held", strings.len());
        assert_eq!(&*strings.get("owner"), "owner");
        assert!(
            Arc::ptr_eq(&strings.get("owner"), &a.name),
            "held ones stay shared"
        );
    }

    #[test]
    fn equal_owner_lists_share_one_copy() {
        let mut strings = SharedStrings::default();
        let mut owner = |n: &str| {
            let key = strings.key(&ObjectKey::cluster("Tenant", n), true);
            (key, strings.tenant(&TenantKey::new(n)))
        };
        let (a, b) = (owner("a"), owner("b"));
        let first = strings.owners(std::slice::from_ref(&a));
        let again = strings.owners(std::slice::from_ref(&a));
        assert!(Arc::ptr_eq(&first, &again));
        let both = strings.owners(&[a.clone(), b.clone()]);
        assert_eq!(&*both, &[a, b][..]);
        assert!(!Arc::ptr_eq(&first, &both));
    }
}
