//! A set of child kinds, by `apiVersion` and `kind`: those whose watches keep `status`.

use kube::Resource;
use kube::core::ApiResource;

/// Child kinds, by `apiVersion` and `kind`: those whose status a reconciler reads
/// ([`Reconciler::reads_status`](crate::reconciler::Reconciler::reads_status)).
///
/// ```
/// # use idem_runtime::reconciler::ChildKinds;
/// # use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
/// let kinds = ChildKinds::of::<StatefulSet>().and::<Deployment>();
/// assert!(kinds.contains::<StatefulSet>());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChildKinds(Vec<ApiResource>);

impl ChildKinds {
    /// No kind.
    pub fn none() -> Self {
        Self::default()
    }

    /// Kind `C`.
    pub fn of<C: Resource<DynamicType = ()>>() -> Self {
        Self::none().and::<C>()
    }

    /// These kinds and kind `C`.
    #[must_use]
    pub fn and<C: Resource<DynamicType = ()>>(mut self) -> Self {
        let resource = ApiResource::erase::<C>(&());
        if !self.has(&resource) {
            self.0.push(resource);
        }
        self
    }

    /// Whether kind `C` is one of these.
    pub fn contains<C: Resource<DynamicType = ()>>(&self) -> bool {
        self.has(&ApiResource::erase::<C>(&()))
    }

    /// Whether the kind of `resource` is one of these.
    pub(crate) fn has(&self, resource: &ApiResource) -> bool {
        self.0
            .iter()
            .any(|r| r.api_version == resource.api_version && r.kind == resource.kind)
    }

    /// Whether `(api_version, kind)` is one of these.
    pub(crate) fn has_kind(&self, api_version: &str, kind: &str) -> bool {
        self.0
            .iter()
            .any(|r| r.api_version == api_version && r.kind == kind)
    }

    /// The kinds.
    pub fn iter(&self) -> impl Iterator<Item = &ApiResource> {
        self.0.iter()
    }

    /// Whether there is no kind.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
