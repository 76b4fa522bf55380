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

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}/{}/{}", self.kind, ns, self.name),
            None => write!(f, "{}/{}", self.kind, self.name),
        }
    }
}
