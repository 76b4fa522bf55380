//! A set of kinds, by `apiVersion` and `kind`: those a reconciler declares, and those whose
//! watches keep `status`.

use kube::Resource;
use kube::core::ApiResource;

/// Whether `a` and `b` are the same kind.
pub(crate) fn same(a: &ApiResource, b: &ApiResource) -> bool {
    a.api_version == b.api_version && a.kind == b.kind
}

/// A set of kinds, by `apiVersion` and `kind`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KindSet(pub(crate) Vec<ApiResource>);

impl KindSet {
    /// Whether kind `C` is one of these.
    pub(crate) fn contains<C: Resource<DynamicType = ()>>(&self) -> bool {
        self.has(&ApiResource::erase::<C>(&()))
    }

    /// Whether the kind of `resource` is one of these.
    pub(crate) fn has(&self, resource: &ApiResource) -> bool {
        self.0.iter().any(|r| same(r, resource))
    }

    /// Whether `(api_version, kind)` is one of these.
    pub(crate) fn has_kind(&self, api_version: &str, kind: &str) -> bool {
        self.0
            .iter()
            .any(|r| r.api_version == api_version && r.kind == kind)
    }

    /// The kinds.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &ApiResource> {
        self.0.iter()
    }

    /// The kinds `C`, for tests.
    #[cfg(test)]
    pub(crate) fn of<C: Resource<DynamicType = ()>>() -> Self {
        Self(vec![ApiResource::erase::<C>(&())])
    }
}
