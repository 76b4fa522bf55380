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

    /// Two of these kinds with one name in different API groups, if any.
    pub(crate) fn same_name(&self) -> Option<(&ApiResource, &ApiResource)> {
        self.0.iter().enumerate().find_map(|(i, a)| {
            self.0[i + 1..]
                .iter()
                .find(|b| b.kind == a.kind && b.group != a.group)
                .map(|b| (a, b))
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_kinds_of_one_name_in_different_groups_are_found() {
        use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent};
        use k8s_openapi::api::events::v1::Event;
        let core = ApiResource::erase::<CoreEvent>(&());
        let events = ApiResource::erase::<Event>(&());
        let cm = ApiResource::erase::<ConfigMap>(&());
        assert!(
            KindSet(vec![core.clone(), cm.clone()])
                .same_name()
                .is_none()
        );
        let set = KindSet(vec![core, cm, events]);
        let (a, b) = set.same_name().expect("found");
        assert_eq!(
            (a.api_version.as_str(), b.api_version.as_str()),
            ("v1", "events.k8s.io/v1")
        );
    }
}
