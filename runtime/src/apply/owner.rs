//! The owner of a set of children, and the set of children it desires.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use kube::core::{ApiResource, ClusterResourceScope, NamespaceResourceScope};
use serde::Serialize;
use serde_json::{Value, json};

use super::{ApplyError, Labels, MANAGED_BY_LABEL};
use crate::compare::fingerprint;
use crate::key::{ObjectKey, TenantKey};
use crate::resource::IdempotentResource;

/// Whether a kind's objects live in a namespace; implemented for k8s-openapi's scopes.
pub trait ChildScope {
    /// `true` for namespaced kinds.
    const NAMESPACED: bool;

    /// The `Api` of objects of `K` in `namespace` (ignored for cluster-scoped kinds; the
    /// empty namespace when `None` for namespaced ones).
    fn api<K>(client: kube::Client, namespace: Option<&str>) -> kube::Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>;
}

impl ChildScope for NamespaceResourceScope {
    const NAMESPACED: bool = true;

    fn api<K>(client: kube::Client, namespace: Option<&str>) -> kube::Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>,
    {
        kube::Api::namespaced(client, namespace.unwrap_or_default())
    }
}

impl ChildScope for ClusterResourceScope {
    const NAMESPACED: bool = false;

    fn api<K>(client: kube::Client, _: Option<&str>) -> kube::Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>,
    {
        kube::Api::all(client)
    }
}

/// The object that owns children: the target of their controller ownerReference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    api_version: String,
    kind: String,
    name: String,
    uid: String,
    namespace: Option<String>,
    tenant: Option<TenantKey>,
    field_manager: String,
    /// The names of the labels and the annotation stamped on the children (the owner kind's).
    label_names: Labels,
    /// The children the owner's reconciles created, by uid (see [`super::record`]).
    created: Option<std::sync::Arc<BTreeMap<String, ObjectKey>>>,
    /// The owner's kind as the dynamic API knows it (to read the owner itself).
    resource: ApiResource,
}

impl Owner {
    /// The owner `obj`, writing under `field_manager` and labelling children with `tenant`,
    /// under its kind's label prefix ([`Labels::of`]).
    ///
    /// # Errors
    /// [`ApplyError::OwnerNotStored`] when `obj` lacks `metadata.name` or `metadata.uid`.
    pub fn new<K: IdempotentResource>(
        obj: &K,
        field_manager: &str,
        tenant: Option<TenantKey>,
    ) -> Result<Self, ApplyError> {
        Self::labelled(obj, field_manager, tenant, Labels::of::<K>())
    }

    /// The owner `obj` of a kind that is no [`IdempotentResource`] (a built-in kind, a kind of
    /// another controller), stamping the label names `label_names` on its children.
    ///
    /// # Errors
    /// [`ApplyError::OwnerNotStored`] when `obj` lacks `metadata.name` or `metadata.uid`.
    pub fn labelled<K: Resource<DynamicType = ()>>(
        obj: &K,
        field_manager: &str,
        tenant: Option<TenantKey>,
        label_names: Labels,
    ) -> Result<Self, ApplyError> {
        let meta = obj.meta();
        let (Some(name), Some(uid)) = (meta.name.clone(), meta.uid.clone()) else {
            return Err(ApplyError::OwnerNotStored {
                kind: K::kind(&()).into_owned(),
            });
        };
        Ok(Self {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            name,
            uid,
            namespace: meta.namespace.clone(),
            tenant,
            field_manager: field_manager.to_owned(),
            label_names,
            created: None,
            resource: ApiResource::erase::<K>(&()),
        })
    }

    /// The same owner with the record of the children it created (kept in its status, see
    /// [`super::record`]): the prune then deletes only children whose uid is in `record`, and
    /// reports the others that claim this owner ([`super::ApplyReport::unrecorded`]). Without a
    /// record the prune trusts the controller ownerReference, which anyone allowed to create
    /// objects of a child kind in the owner's scope can forge: give every owner whose children
    /// live where untrusted users can write a record.
    #[must_use]
    pub fn with_record<'a>(
        mut self,
        record: impl IntoIterator<Item = &'a super::CreatedChild>,
    ) -> Self {
        self.created = Some(std::sync::Arc::new(
            record
                .into_iter()
                .map(|c| (c.uid.clone(), c.key()))
                .collect(),
        ));
        self
    }

    /// Whether the prune may delete the child with `uid`: `true` when it is in the record, or
    /// when the owner has no record (ownerReference trusted, see [`Owner::with_record`]).
    pub fn may_prune(&self, uid: &str) -> bool {
        self.created.as_ref().is_none_or(|r| r.contains_key(uid))
    }

    /// Whether the owner's record holds `uid`: the object was created by the owner's
    /// reconciles, so it is the owner's whatever its labels and ownerReferences say now
    /// (`false` without a record).
    pub fn recorded(&self, uid: &str) -> bool {
        self.created.as_ref().is_some_and(|r| r.contains_key(uid))
    }

    /// The record's entries of kind `kind`, as `(uid, key)`.
    pub(crate) fn recorded_of_kind<'a>(
        &'a self,
        kind: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a ObjectKey)> + 'a {
        self.created
            .iter()
            .flat_map(|r| r.iter())
            .filter(move |(_, key)| key.kind.as_ref() == kind)
            .map(|(uid, key)| (uid.as_str(), key))
    }

    /// The namespaces the owner's record holds children in, or holds as children: where an
    /// object claiming a cluster-scoped owner may be its child (`None` without a record).
    pub(crate) fn recorded_namespaces(&self) -> Option<BTreeSet<&str>> {
        let record = self.created.as_ref()?;
        Some(
            record
                .values()
                .filter_map(|key| match &key.namespace {
                    Some(ns) => Some(ns.as_ref()),
                    None if key.kind.as_ref() == "Namespace" => Some(key.name.as_ref()),
                    None => None,
                })
                .collect(),
        )
    }

    /// Whether the owner carries a record of its created children.
    pub fn has_record(&self) -> bool {
        self.created.is_some()
    }

    /// The field manager children are applied under.
    pub fn field_manager(&self) -> &str {
        &self.field_manager
    }

    /// The owner's `metadata.uid`.
    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// Whether the owner, read from the API server now (not from a cache), is being deleted or
    /// is gone (or replaced by another object of its name). The garbage collector orphans the
    /// children of an owner deleted with `propagationPolicy: Orphan` by removing their
    /// ownerReferences; a reconcile working from a cache that has not seen the deletion yet
    /// must not put them back, or the collector deletes them with the owner after all.
    ///
    /// # Errors
    /// The API server's, other than 404 (which means gone).
    pub async fn is_being_deleted(&self, client: &kube::Client) -> Result<bool, kube::Error> {
        let api: kube::Api<kube::api::DynamicObject> = match &self.namespace {
            Some(ns) => kube::Api::namespaced_with(client.clone(), ns, &self.resource),
            None => kube::Api::all_with(client.clone(), &self.resource),
        };
        Ok(match api.get_metadata_opt(&self.name).await? {
            Some(live) => {
                live.metadata.deletion_timestamp.is_some()
                    || live.metadata.uid.as_deref() != Some(self.uid.as_str())
            }
            None => true,
        })
    }

    /// The owner's namespace, `None` when cluster-scoped.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The owner's key.
    pub fn key(&self) -> ObjectKey {
        match &self.namespace {
            Some(ns) => ObjectKey::namespaced(&self.kind, ns, &self.name),
            None => ObjectKey::cluster(&self.kind, &self.name),
        }
    }

    /// The controller ownerReference children carry.
    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    /// The names of the labels and the annotation stamped on the children: the owner kind's
    /// ([`Labels::of`]).
    pub fn label_names(&self) -> Labels {
        self.label_names
    }

    /// The labels children carry: [`MANAGED_BY_LABEL`] and, under the owner kind's prefix,
    /// the owner's uid, its shard bucket and the tenant — the tenant only when it is a label
    /// value ([`Labels::is_value`]; a tenant named by a spec field may be any string, and the
    /// API server refuses a child with an invalid label; the queue charges the owner's
    /// tenant from the owner, never from this label).
    pub fn labels(&self) -> BTreeMap<String, String> {
        let names = self.label_names;
        let mut labels = BTreeMap::new();
        labels.insert(MANAGED_BY_LABEL.to_owned(), self.field_manager.clone());
        labels.insert(names.owner_uid().to_owned(), self.uid.clone());
        let bucket = crate::shard::bucket_of(crate::shard::fnv1a64(self.uid.as_bytes()));
        labels.insert(names.shard_bucket().to_owned(), bucket.to_string());
        if let Some(t) = self
            .tenant
            .as_ref()
            .filter(|t| Labels::is_value(t.as_str()))
        {
            labels.insert(names.tenant().to_owned(), t.to_string());
        }
        labels
    }

    /// Whether `meta` carries this owner's controller ownerReference (matched by uid).
    pub fn owns(&self, meta: &ObjectMeta) -> bool {
        meta.owner_references
            .iter()
            .flatten()
            .any(|r| r.uid == self.uid && r.controller == Some(true))
    }

    /// Whether `meta` is a child of ours that lost its ownerReference: it has no controller
    /// ownerReference at all, carries the owner-uid label ([`Labels::owner_uid`]) with this owner's uid, and our field
    /// manager has an `Apply` entry on it (the server's record that we applied it). Such a
    /// child of an owner without a record is applied again (which restores the reference);
    /// it is never pruned on this evidence alone. An owner with a record does not take this
    /// evidence (anyone who may write the object can forge both): its children are found by
    /// their recorded uids.
    pub fn lost_reference(&self, meta: &ObjectMeta) -> bool {
        let controlled = meta
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.controller == Some(true));
        let labelled = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(self.label_names.owner_uid()))
            .is_some_and(|v| *v == self.uid);
        let applied = meta.managed_fields.iter().flatten().any(|e| {
            e.manager.as_deref() == Some(self.field_manager.as_str())
                && e.operation.as_deref() == Some("Apply")
                && e.subresource.as_deref().unwrap_or("").is_empty()
        });
        !controlled && labelled && applied
    }

    /// Who controls `meta` instead of us, for messages.
    pub(crate) fn describe_foreign(&self, meta: &ObjectMeta) -> String {
        match meta
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))
        {
            Some(r) => format!("controlled by {} {} (uid {})", r.kind, r.name, r.uid),
            None => "not controlled by any owner".to_owned(),
        }
    }
}

/// One desired child: its API resource, scope, key and JSON body (see [`DesiredChildren::add`]).
#[derive(Clone, Debug)]
pub struct DesiredChild {
    pub(crate) resource: ApiResource,
    pub(crate) namespaced: bool,
    pub(crate) key: ObjectKey,
    pub(crate) body: Value,
    /// Whether an apply rejected as 422 Invalid deletes and creates the child again.
    pub(crate) recreate: bool,
    /// Whether a lost ownerReference means "released" (see [`DesiredChildren::release_orphans`])
    /// rather than tampering to repair.
    pub(crate) release_orphan: bool,
    /// Created once and never changed afterwards (see [`DesiredChildren::create_once`]).
    pub(crate) once: Option<CreateOnce>,
}

/// The children an owner desires, plus the kinds whose undesired children get pruned.
#[derive(Clone, Debug, Default)]
pub struct DesiredChildren {
    pub(crate) children: Vec<DesiredChild>,
    pub(crate) kinds: Vec<(ApiResource, bool)>,
    /// Kinds whose children are recreated when an apply is rejected as 422 Invalid.
    pub(crate) recreate: Vec<ApiResource>,
    /// Kinds whose children are released, not repaired, when their ownerReference is removed.
    pub(crate) release_orphans: Vec<ApiResource>,
    /// Namespaces whose undesired children are released, not pruned.
    pub(crate) release_in: std::collections::BTreeSet<String>,
    /// Kinds whose undesired children are released, not pruned.
    pub(crate) release_undesired: Vec<ApiResource>,
    /// Kinds whose deleted create-once children are created anew
    /// ([`DesiredChildren::regenerate_deleted`]).
    pub(crate) regenerate: Vec<ApiResource>,
}

/// Moves a Secret body's `stringData` into its `data`, each value base64-encoded, replacing
/// a `data` key of the same name (the API server's own rule for a write carrying both).
fn fold_string_data(secret: &mut serde_json::Map<String, Value>) {
    use base64::Engine as _;
    let Some(Value::Object(strings)) = secret.remove("stringData") else {
        return;
    };
    if strings.is_empty() {
        return;
    }
    let data = secret
        .entry("data")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if !data.is_object() {
        *data = Value::Object(serde_json::Map::new());
    }
    if let Some(data) = data.as_object_mut() {
        for (key, value) in strings {
            let text = match value {
                Value::String(s) => s,
                other => other.to_string(),
            };
            let encoded = base64::engine::general_purpose::STANDARD.encode(text);
            data.insert(key, Value::String(encoded));
        }
    }
}

impl DesiredChildren {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a desired child; its kind also becomes a pruned kind. A namespaced child without a
    /// namespace is put in the owner's namespace when applied. A Secret's `stringData` is
    /// folded into its `data` (base64, over a key of the same name), as the API server does
    /// on every write: `stringData` is never stored, so an apply owning only it would own
    /// nothing the object holds, and a change of `data` by anyone else would go unseen.
    ///
    /// # Errors
    /// [`ApplyError::Serialize`] when the child does not serialise to a JSON object,
    /// [`ApplyError::MissingName`] when it has no name.
    pub fn add<K>(&mut self, child: &K) -> Result<&mut Self, ApplyError>
    where
        K: Resource<DynamicType = ()> + Serialize,
        K::Scope: ChildScope,
    {
        let kind = K::kind(&()).into_owned();
        let mut body = serde_json::to_value(child).map_err(|e| ApplyError::Serialize {
            kind: kind.clone(),
            reason: e.to_string(),
        })?;
        let Some(obj) = body.as_object_mut() else {
            return Err(ApplyError::Serialize {
                kind,
                reason: "not a JSON object".to_owned(),
            });
        };
        obj.insert("apiVersion".into(), json!(K::api_version(&())));
        obj.insert("kind".into(), json!(kind));
        if K::api_version(&()) == "v1" && kind == "Secret" {
            fold_string_data(obj);
        }
        // Fields the server owns never belong in an apply body.
        obj.remove("status");
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            for f in [
                "resourceVersion",
                "uid",
                "managedFields",
                "creationTimestamp",
                "generation",
                "selfLink",
                "deletionTimestamp",
            ] {
                meta.remove(f);
            }
        }
        let meta = child.meta();
        let name = meta
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApplyError::MissingName { kind: kind.clone() })?;
        let namespaced = <K::Scope as ChildScope>::NAMESPACED;
        let key = ObjectKey {
            kind: kind.as_str().into(),
            namespace: meta.namespace.as_deref().map(Into::into),
            name: name.as_str().into(),
        };
        self.register_kind::<K>();
        let resource = ApiResource::erase::<K>(&());
        let recreate = self.recreate.contains(&resource);
        let release_orphan = self.release_orphans.contains(&resource);
        self.children.push(DesiredChild {
            resource,
            namespaced,
            key,
            body,
            recreate,
            release_orphan,
            once: None,
        });
        Ok(self)
    }

    /// Opts kind `K` in to recreation: when the server-side apply of one of its children is
    /// rejected as 422 Invalid (typically an immutable field, such as a Job's template or a
    /// Service's `clusterIP`, changed), the child is deleted (with a `uid` precondition,
    /// foreground) and created again, reported as [`ChildOutcome::Recreated`]; not when the 422
    /// is an admission webhook's or ValidatingAdmissionPolicy's denial. Without this, such
    /// an apply is an error and the child is left as it is. Applies to children of `K` added
    /// before and after this call.
    ///
    /// [`ChildOutcome::Recreated`]: super::ChildOutcome::Recreated
    pub fn allow_recreate<K>(&mut self) -> &mut Self
    where
        K: Resource<DynamicType = ()>,
    {
        let ar = ApiResource::erase::<K>(&());
        for c in &mut self.children {
            if c.resource == ar {
                c.recreate = true;
            }
        }
        if !self.recreate.contains(&ar) {
            self.recreate.push(ar);
        }
        self
    }

    /// Opts kind `K` out of restoring a removed ownerReference: by default a child of ours
    /// whose controller ownerReference someone removed (it still carries our owner-uid label
    /// and our `Apply` entry, see [`Owner::lost_reference`]) is applied again, which restores
    /// the reference — a tenant owner cannot switch off repair that way (nor by removing the
    /// label too: a child in the owner's record is the owner's, see [`Owner::recorded`]). For
    /// `K`, removing the reference instead releases the child, as `kubectl delete
    /// --cascade=orphan` does: it is reported [`ChildOutcome::NotOwned`] (and, while it is in
    /// the owner's record, in [`ApplyReport::released`](super::ApplyReport::released), which
    /// drops it from the record), and never adopted again or pruned. Meant for kinds
    /// only administrators can edit and that hold user data (a tenant's Namespaces). Applies to
    /// children of `K` added before and after this call.
    ///
    /// [`ChildOutcome::NotOwned`]: super::ChildOutcome::NotOwned
    pub fn release_orphans<K>(&mut self) -> &mut Self
    where
        K: Resource<DynamicType = ()>,
    {
        let ar = ApiResource::erase::<K>(&());
        for c in &mut self.children {
            if c.resource == ar {
                c.release_orphan = true;
            }
        }
        if !self.release_orphans.contains(&ar) {
            self.release_orphans.push(ar);
        }
        self
    }

    /// Releases instead of pruning: an undesired child of the owner in namespace `namespace`
    /// (found by the prune: claiming the owner, or in its record) gets the owner's
    /// ownerReferences and owner-uid label removed ([`super::release`]) and leaves the
    /// record, instead of being deleted; it is reported in
    /// [`ApplyReport::released`](super::ApplyReport::released). For the contents of a
    /// namespace the owner no longer controls (an administrator released it, see
    /// [`DesiredChildren::release_orphans`]): they stay with the namespace.
    pub fn release_in(&mut self, namespace: &str) -> &mut Self {
        self.release_in.insert(namespace.to_owned());
        self
    }

    /// Releases instead of pruning every undesired child of kind `K`, wherever it is: its
    /// owner's ownerReferences and owner-uid label are removed ([`super::release`]) and it
    /// leaves the record, reported in [`ApplyReport::released`](super::ApplyReport::released).
    /// For kinds that hold user data whose deletion the owner's spec should not decide alone
    /// (a Tenant's namespaces under `deletionPolicy: Retain`: one taken out of the spec is
    /// kept, with everything in it). Still pruned with [`DesiredChildren::prune_kind`]'s rules
    /// otherwise: only what the record holds is touched.
    pub fn release_undesired<K>(&mut self) -> &mut Self
    where
        K: Resource<DynamicType = ()>,
    {
        let ar = ApiResource::erase::<K>(&());
        if !self.release_undesired.contains(&ar) {
            self.release_undesired.push(ar);
        }
        self
    }

    /// Prunes undesired children of kind `K` even when no child of that kind is desired.
    pub fn prune_kind<K>(&mut self) -> &mut Self
    where
        K: Resource<DynamicType = ()>,
        K::Scope: ChildScope,
    {
        self.register_kind::<K>();
        self
    }

    /// These children with `kinds` pruned too, when one of them is not already (`None`: it
    /// prunes them all already).
    pub(crate) fn pruning(&self, kinds: &[(ApiResource, bool)]) -> Option<Self> {
        let missing = |(r, _): &&(ApiResource, bool)| !self.kinds.iter().any(|(k, _)| k == r);
        if !kinds.iter().any(|k| missing(&k)) {
            return None;
        }
        let mut all = self.clone();
        all.kinds
            .extend(kinds.iter().filter(|k| missing(k)).cloned());
        Some(all)
    }

    /// Checks that no two of the kinds have one name in different API groups.
    ///
    /// # Errors
    /// [`ApplyError::SameKindName`] naming the first two such kinds.
    pub(crate) fn same_kind_names(&self) -> Result<(), ApplyError> {
        distinct_kind_names(self.kinds.iter().map(|(r, _)| r))
    }

    fn register_kind<K>(&mut self)
    where
        K: Resource<DynamicType = ()>,
        K::Scope: ChildScope,
    {
        let ar = ApiResource::erase::<K>(&());
        if !self.kinds.iter().any(|(k, _)| k == &ar) {
            self.kinds.push((ar, <K::Scope as ChildScope>::NAMESPACED));
        }
    }

    /// The desired children, in the order they were added.
    pub fn children(&self) -> &[DesiredChild] {
        &self.children
    }

    /// Number of desired children.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether no child is desired.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }
}

impl DesiredChild {
    /// The child's key as desired (namespace `None` until placed in the owner's namespace).
    pub fn key(&self) -> &ObjectKey {
        &self.key
    }

    /// The body the engine applies for `owner`: the desired object placed in the owner's
    /// namespace, with the ownerReference, labels and fingerprint annotation stamped.
    ///
    /// # Errors
    /// [`ApplyError::InvalidScope`] when Kubernetes would not let `owner` own this child.
    pub fn stamped_body(&self, owner: &Owner) -> Result<Value, ApplyError> {
        Ok(self.stamped(owner)?.1)
    }

    /// Places the child for `owner` and stamps ownership: namespace, labels, ownerReference
    /// and the fingerprint annotation.
    ///
    /// # Errors
    /// [`ApplyError::InvalidScope`] when Kubernetes would not let `owner` own this child.
    pub(crate) fn stamped(&self, owner: &Owner) -> Result<(ObjectKey, Value), ApplyError> {
        let key = self.placed(owner)?;
        let mut body = self.body.clone();
        let meta = body
            .as_object_mut()
            .expect("checked to be an object in add()")
            .entry("metadata")
            .or_insert_with(|| json!({}));
        if !meta.is_object() {
            *meta = json!({});
        }
        if let Some(ns) = &key.namespace {
            meta["namespace"] = json!(ns.as_ref());
        }
        let labels = meta
            .as_object_mut()
            .expect("metadata is an object")
            .entry("labels")
            .or_insert_with(|| json!({}));
        if !labels.is_object() {
            *labels = json!({});
        }
        for (k, v) in owner.labels() {
            labels[k] = json!(v);
        }
        meta["ownerReferences"] = json!([owner.owner_reference()]);
        let print = fingerprint(&body).to_string();
        let meta = &mut body["metadata"];
        if !meta.get("annotations").is_some_and(Value::is_object) {
            meta["annotations"] = json!({});
        }
        meta["annotations"][owner.label_names.fingerprint()] = json!(print);
        Ok((key, body))
    }

    /// The child's key once placed for `owner` (a namespaced child without a namespace goes in
    /// its owner's): what [`DesiredChild::stamped`] names, without making the body.
    ///
    /// # Errors
    /// [`ApplyError::InvalidScope`] when Kubernetes would not let `owner` own this child.
    pub(crate) fn placed(&self, owner: &Owner) -> Result<ObjectKey, ApplyError> {
        let mut key = self.key.clone();
        // An empty namespace is no namespace, as the API server reads it.
        if key.namespace.as_deref() == Some("") {
            key.namespace = None;
        }
        let invalid = |key: &ObjectKey, reason| ApplyError::InvalidScope {
            child: key.clone(),
            owner: owner.key(),
            reason,
        };
        match (self.namespaced, owner.namespace(), key.namespace.as_deref()) {
            (true, Some(ns), None) => key.namespace = Some(ns.into()),
            (true, Some(ns), Some(child_ns)) if ns != child_ns => {
                return Err(invalid(
                    &key,
                    "a namespaced owner only owns children in its own namespace",
                ));
            }
            (true, None, None) => {
                return Err(invalid(&key, "a namespaced child needs metadata.namespace"));
            }
            (false, Some(_), _) => {
                return Err(invalid(
                    &key,
                    "a namespaced owner cannot own cluster-scoped objects",
                ));
            }
            (false, None, Some(_)) => {
                return Err(invalid(
                    &key,
                    "a cluster-scoped child has no metadata.namespace",
                ));
            }
            _ => {}
        }
        Ok(key)
    }
}

/// Makes the body of a create-once child (see [`DesiredChildren::create_once`]).
pub(super) type Make = dyn Fn() -> Result<Value, ApplyError> + Send + Sync;

/// How a create-once child is made, and whether a deleted one is made again.
#[derive(Clone)]
pub(crate) struct CreateOnce {
    pub(super) make: std::sync::Arc<Make>,
    /// A deleted child is created anew (see [`DesiredChildren::regenerate_deleted`]).
    pub(crate) regenerate: bool,
}

impl std::fmt::Debug for CreateOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateOnce")
            .field("regenerate", &self.regenerate)
            .finish_non_exhaustive()
    }
}

impl CreateOnce {
    /// The body to create: `make`'s object at the child's key, without idem's fingerprint
    /// annotation (a create-once child is never applied, so never judged by it).
    pub(crate) fn body(&self, key: &ObjectKey) -> Result<Value, ApplyError> {
        let mut body = (self.make)()?;
        let meta = &mut body["metadata"];
        if !meta.is_object() {
            *meta = json!({});
        }
        meta["name"] = json!(key.name.as_ref());
        if let Some(ns) = &key.namespace {
            meta["namespace"] = json!(ns.as_ref());
        }
        Ok(body)
    }
}

/// Checks that no two of `kinds` have one name in different API groups: children are recorded
/// and keyed by kind name, so one kind's prune would read the other's records.
///
/// # Errors
/// [`ApplyError::SameKindName`] naming the first two such kinds.
pub(crate) fn distinct_kind_names<'a>(
    kinds: impl Iterator<Item = &'a ApiResource> + Clone,
) -> Result<(), ApplyError> {
    let mut rest = kinds;
    while let Some(a) = rest.next() {
        if let Some(b) = rest
            .clone()
            .find(|b| b.kind == a.kind && b.group != a.group)
        {
            return Err(ApplyError::SameKindName {
                kind: a.kind.clone(),
                first: a.api_version.clone(),
                second: b.api_version.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
