//! A child as a watch delivers it, without decoding its content: its metadata parsed, the
//! rest kept as the one JSON text it came as.
//!
//! Why: a typed object (or a `serde_json::Value`) of a large child is a tree of many small
//! allocations (a RoleBinding with thousands of subjects, a ConfigMap with many keys), and an
//! allocator keeps much of what such a tree used after it is freed. The child watches decode
//! each event into this instead, and parse the content only for the children the caches keep
//! whole (idem's own, see [`crate::apply::ChildCaches`]).

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::{ApiResource, DynamicResourceScope};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// An object of any kind: its metadata, and the whole object as JSON text. Its kind is the
/// [`ApiResource`] of its [`kube::Api`], so every child kind shares one watch's code.
#[derive(Clone)]
pub(crate) struct Raw {
    meta: ObjectMeta,
    text: Box<RawValue>,
}

impl Raw {
    /// The whole object as the API server sent it (JSON).
    pub(crate) fn text(&self) -> &str {
        self.text.get()
    }
}

impl std::fmt::Debug for Raw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Raw")
            .field("namespace", &self.meta.namespace)
            .field("name", &self.meta.name)
            .field("bytes", &self.text.get().len())
            .finish()
    }
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// The metadata alone; every other field is skipped without being decoded.
        #[derive(Deserialize)]
        struct MetaOnly {
            #[serde(default)]
            metadata: ObjectMeta,
        }
        let text = Box::<RawValue>::deserialize(d)?;
        let meta = serde_json::from_str::<MetaOnly>(text.get())
            .map_err(serde::de::Error::custom)?
            .metadata;
        Ok(Self { meta, text })
    }
}

impl Resource for Raw {
    type DynamicType = ApiResource;
    /// Either: the [`kube::Api`] of a `Raw` is built from the caller's `Api<C>`.
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.kind)
    }

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.group)
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.version)
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.api_version)
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.plural)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

/// The same collection as `api`, decoding objects as [`Raw`], and its kind.
pub(crate) fn raw_api<C: Resource<DynamicType = ()>>(
    api: kube::Api<C>,
) -> (kube::Api<Raw>, ApiResource) {
    let resource = ApiResource::erase::<C>(&());
    let namespace = api.namespace().map(str::to_owned);
    let client = api.into_client();
    let raw = match namespace {
        Some(ns) => kube::Api::namespaced_with(client, &ns, &resource),
        None => kube::Api::all_with(client, &resource),
    };
    (raw, resource)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::rbac::v1::RoleBinding;
    use kube::core::ObjectList;
    use kube::core::WatchEvent;

    use super::*;

    #[test]
    fn a_watch_event_and_a_list_decode_to_metadata_and_text() {
        let obj = r#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":"b","namespace":"ns","uid":"u1","resourceVersion":"7"},"subjects":[{"kind":"User","name":"alice"}],"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"view"}}"#;
        let line = format!(r#"{{"type":"ADDED","object":{obj}}}"#);
        let WatchEvent::Added(raw) =
            serde_json::from_str::<WatchEvent<Raw>>(&line).expect("decodes")
        else {
            panic!("an ADDED event");
        };
        assert_eq!(raw.meta().uid.as_deref(), Some("u1"));
        assert_eq!(raw.text(), obj);
        let list = format!(r#"{{"metadata":{{"resourceVersion":"9"}},"items":[{obj}]}}"#);
        let list: ObjectList<Raw> = serde_json::from_str(&list).expect("decodes");
        assert_eq!(list.items[0].meta().name.as_deref(), Some("b"));
        assert_eq!(
            Raw::url_path(&ApiResource::erase::<RoleBinding>(&()), Some("ns")),
            RoleBinding::url_path(&(), Some("ns"))
        );
    }
}
