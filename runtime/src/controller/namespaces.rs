//! The tenants of namespaces for kinds whose derive says `tenant = namespace_label("...")`: a
//! metadata-only watch of Namespaces that keeps, of each, only the value of that label.
//!
//! [`Controller::for_derived`](super::Controller::for_derived) runs one for such a kind by
//! itself: the queue's tenant of an object and the tenant its children are labelled with are
//! read here, so a converged reconcile makes no request for them. A namespace whose tenant
//! changes (it gains, loses or changes the label, its trust changes, or it is deleted) queues
//! the controller's objects in it at once, past their backoff ([`Reason::NamespaceChanged`]):
//! an object that failed for want of a tenant is not left to its backoff or resync (an owner
//! check's verdict, [`OwnerFn`], is made at each read: a change of what it reads queues
//! nothing). Memory: per labelled namespace its name, the label's value and, with an owner
//! check, the uid its controller ownerReference names (the watch receives only metadata, and
//! keeps nothing else of it).
//!
//! [`Reason::NamespaceChanged`]: super::Reason::NamespaceChanged

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;

use super::relist::{not_established, relisting};
use super::watch::WatchTask;
use crate::backoff::watch_backoff;
use crate::key::TenantKey;
use crate::resource::TenantError;

/// Whether a namespace, by its metadata, may name a tenant at all (e.g. only namespaces
/// created by a tenant's own controller); see [`super::Controller::namespace_tenants_with`].
pub type TrustFn = Arc<dyn Fn(&ObjectMeta) -> bool + Send + Sync>;

/// Whether `uid`, the uid a namespace's controller ownerReference names, is tenant `tenant`'s
/// object, asked each time the namespace's tenant is read; see
/// [`super::Controller::namespace_tenant_owner`].
pub type OwnerFn = Arc<dyn Fn(&TenantKey, &str) -> bool + Send + Sync>;

/// What the cache keeps of a namespace that names a tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Named {
    tenant: TenantKey,
    /// The uid its controller ownerReference names (kept only when an [`OwnerFn`] reads it).
    controller: Option<Box<str>>,
}

/// The tenant of each watched namespace that carries the label (and that the controller
/// trusts): a cheap handle on the cache a controller fills.
#[derive(Clone)]
pub struct NamespaceTenants {
    label: &'static str,
    tenants: Arc<RwLock<HashMap<String, Named>>>,
    trust: Option<TrustFn>,
    owner: Option<OwnerFn>,
    synced: watch::Receiver<bool>,
    tx: Arc<watch::Sender<bool>>,
}

impl std::fmt::Debug for NamespaceTenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceTenants")
            .field("label", &self.label)
            .field("namespaces", &self.len())
            .field("synced", &self.is_synced())
            .finish()
    }
}

impl NamespaceTenants {
    /// An empty cache of the tenants named by label `label`, filled once a controller watches
    /// for it.
    pub(crate) fn new(label: &'static str) -> Self {
        let (tx, synced) = watch::channel(false);
        Self {
            label,
            tenants: Arc::default(),
            trust: None,
            owner: None,
            synced,
            tx: Arc::new(tx),
        }
    }

    /// Only namespaces whose metadata `trust` accepts name a tenant.
    pub(crate) fn trusting(mut self, trust: TrustFn) -> Self {
        self.trust = Some(trust);
        self
    }

    /// A namespace names tenant `t` only while `owner` accepts (for `t`) the uid its controller
    /// ownerReference names, judged at each read.
    pub(crate) fn owned_by(mut self, owner: OwnerFn) -> Self {
        self.owner = Some(owner);
        self
    }

    /// The label that names a namespace's tenant.
    pub fn label(&self) -> &'static str {
        self.label
    }

    /// The tenant namespace `namespace` belongs to: its label's value, when the namespace is
    /// known, carries the label, is trusted and (with an owner check) its controller
    /// ownerReference names that tenant's object; `None` otherwise.
    pub fn get(&self, namespace: &str) -> Option<TenantKey> {
        let tenants = self.tenants.read().ok()?;
        let named = tenants.get(namespace)?;
        self.owned(named).then(|| named.tenant.clone())
    }

    /// Every known namespace with its tenant (as [`NamespaceTenants::get`] says).
    pub fn all(&self) -> Vec<(String, TenantKey)> {
        self.tenants
            .read()
            .map(|t| {
                (t.iter())
                    .filter(|(_, named)| self.owned(named))
                    .map(|(n, named)| (n.clone(), named.tenant.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The tenant a namespace with metadata `meta` names, judged as the cache judges it (the
    /// label, the trust and the owner check), for a namespace read from the API server.
    pub fn judge(&self, meta: &ObjectMeta) -> Option<TenantKey> {
        (self.tenant_of(meta))
            .filter(|named| self.owned(named))
            .map(|named| named.tenant)
    }

    /// Whether `named` passes the owner check, if there is one.
    fn owned(&self, named: &Named) -> bool {
        self.owner.as_ref().is_none_or(|owner| {
            (named.controller.as_deref()).is_some_and(|uid| owner(&named.tenant, uid))
        })
    }

    /// Namespaces known, labelled and trusted (before the owner check, which is made at reads).
    pub fn len(&self) -> usize {
        self.tenants.read().map(|t| t.len()).unwrap_or(0)
    }

    /// Whether no namespace is known to belong to a tenant.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the watch has listed the namespaces and is established.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Records `namespace` as tenant `tenant`'s (for unit tests).
    #[cfg(test)]
    pub(crate) fn insert_for_test(&self, namespace: &str, tenant: &str) {
        if let Ok(mut tenants) = self.tenants.write() {
            let named = Named {
                tenant: TenantKey::new(tenant),
                controller: None,
            };
            tenants.insert(namespace.to_owned(), named);
        }
    }

    /// The tenant of namespace `meta` by its label, if it has it and is trusted (with, when
    /// there is an owner check, the uid its controller ownerReference names).
    fn tenant_of(&self, meta: &ObjectMeta) -> Option<Named> {
        let value = meta.labels.as_ref()?.get(self.label)?;
        if value.is_empty() || self.trust.as_ref().is_some_and(|trust| !trust(meta)) {
            return None;
        }
        let controller = self.owner.as_ref().and_then(|_| {
            let refs = meta.owner_references.iter().flatten();
            let controller = refs.into_iter().find(|r| r.controller == Some(true))?;
            Some(controller.uid.as_str().into())
        });
        Some(Named {
            tenant: TenantKey::new(value),
            controller,
        })
    }

    /// The tenant of `namespace`: from the cache, or (a namespace the cache does not know as a
    /// tenant's: not synced yet, just created, or not labelled) read with one GET through
    /// `client`.
    ///
    /// # Errors
    /// [`TenantError::Api`] when the read fails, [`TenantError::MissingLabel`] when the
    /// namespace lacks the label, [`TenantError::Untrusted`] when it has it but is not trusted
    /// to name a tenant or fails the owner check.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn resolve(
        &self,
        client: &Client,
        namespace: &str,
    ) -> Result<TenantKey, TenantError> {
        if let Some(tenant) = self.get(namespace) {
            return Ok(tenant);
        }
        let ns = Api::<Namespace>::all(client.clone())
            .get_metadata(namespace)
            .await
            .map_err(|source| TenantError::Api {
                namespace: namespace.to_owned(),
                source: Box::new(source),
            })?;
        let labelled = (ns.metadata.labels.as_ref())
            .and_then(|l| l.get(self.label))
            .is_some_and(|v| !v.is_empty());
        let namespace = namespace.to_owned();
        let label = self.label;
        self.judge(&ns.metadata).ok_or(if labelled {
            TenantError::Untrusted { namespace, label }
        } else {
            TenantError::MissingLabel { namespace, label }
        })
    }

    /// The watch that fills the cache: every namespace `config` selects, metadata only.
    /// `changed` is called with the name of each namespace whose tenant changed (gained,
    /// lost or another) once the first list is done: a change of the namespace's label, of
    /// its trust, its deletion, or a difference a relist finds.
    pub(crate) fn watch(
        &self,
        client: Client,
        config: watcher::Config,
        changed: impl Fn(&str) + Send + 'static,
    ) -> WatchTask {
        let this = self.clone();
        let synced = self.synced.clone();
        let run = async move {
            // Metadata-only requests (`PartialObjectMetadata`), started over as the other
            // watches are ([`relisting`]: a streaming list refused is listed by pages).
            let api = Api::<PartialObjectMeta<Namespace>>::all(client);
            let stream = watch_backoff(relisting(api, config));
            futures::pin_mut!(stream);
            // A relist's namespaces, swapped in at its end (one missing from it is gone).
            let mut listing: Option<HashMap<String, Named>> = None;
            // The first list tells nothing new: every object is queued by its own first list.
            let mut listed_once = false;
            while let Some(event) = stream.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(e) => {
                        tracing::warn!(error = %e, "namespace watch error");
                        if not_established(&e) {
                            this.tx.send_replace(false);
                        }
                        continue;
                    }
                };
                match event {
                    Event::Init => listing = Some(HashMap::new()),
                    Event::InitApply(ns) => {
                        if let (Some(list), Some(name), Some(tenant)) = (
                            listing.as_mut(),
                            ns.metadata.name.clone(),
                            this.tenant_of(&ns.metadata),
                        ) {
                            list.insert(name, tenant);
                        }
                    }
                    Event::InitDone => {
                        let mut moved = Vec::new();
                        if let (Some(list), Ok(mut tenants)) =
                            (listing.take(), this.tenants.write())
                        {
                            if listed_once {
                                moved = differing(&tenants, &list);
                            }
                            *tenants = list;
                        }
                        listed_once = true;
                        this.tx.send_replace(true);
                        moved.iter().for_each(|name| changed(name));
                    }
                    Event::Apply(ns) => {
                        let Some(name) = ns.metadata.name.clone() else {
                            continue;
                        };
                        let tenant = this.tenant_of(&ns.metadata);
                        let before = match this.tenants.write() {
                            Ok(mut tenants) => match tenant.clone() {
                                Some(tenant) => tenants.insert(name.clone(), tenant),
                                None => tenants.remove(&name),
                            },
                            Err(_) => continue,
                        };
                        if before != tenant {
                            changed(&name);
                        }
                    }
                    Event::Delete(ns) => {
                        let Some(name) = ns.metadata.name.as_deref() else {
                            continue;
                        };
                        let before = this.tenants.write().ok().and_then(|mut t| t.remove(name));
                        if before.is_some() {
                            changed(name);
                        }
                    }
                }
            }
        };
        WatchTask {
            run: Box::pin(run),
            synced,
        }
    }
}

/// The namespaces whose tenant differs between `old` and `new` (in one and not the other, or
/// another tenant), sorted.
fn differing<T: PartialEq>(old: &HashMap<String, T>, new: &HashMap<String, T>) -> Vec<String> {
    let mut out: Vec<String> = old
        .iter()
        .filter(|(name, tenant)| new.get(*name) != Some(*tenant))
        .map(|(name, _)| name.clone())
        .chain(new.keys().filter(|name| !old.contains_key(*name)).cloned())
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn meta(labels: &[(&str, &str)], owned: bool) -> ObjectMeta {
        ObjectMeta {
            name: Some("ns".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            annotations: owned.then(|| BTreeMap::from([("owned".into(), "yes".into())])),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_relist_finds_the_namespaces_whose_tenant_changed() {
        let map = |pairs: &[(&str, &str)]| -> HashMap<String, TenantKey> {
            pairs
                .iter()
                .map(|(n, t)| ((*n).to_owned(), TenantKey::new(t)))
                .collect()
        };
        let old = map(&[("same", "red"), ("moved", "red"), ("lost", "red")]);
        let new = map(&[("same", "red"), ("moved", "blue"), ("gained", "blue")]);
        assert_eq!(differing(&old, &new), ["gained", "lost", "moved"]);
        assert!(differing(&old, &old).is_empty());
    }

    #[test]
    fn with_an_owner_check_a_namespace_names_its_tenant_only_while_its_controller_is_the_tenants() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let is_owner = |t: &TenantKey, uid: &str| t.as_str() == "red" && uid == "u-red";
        let tenants = NamespaceTenants::new("team").owned_by(Arc::new(is_owner));
        let namespace = |uid: &str, controller: bool| ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                uid: uid.into(),
                controller: Some(controller),
                ..OwnerReference::default()
            }]),
            ..meta(&[("team", "red")], false)
        };
        let cases = [
            ("genuine", namespace("u-red", true)),
            ("forged", namespace("u-forged", true)),
            ("not-controller", namespace("u-red", false)),
            ("no-reference", meta(&[("team", "red")], false)),
        ];
        for (name, meta) in cases {
            let named = tenants.tenant_of(&meta).expect("labelled");
            tenants.tenants.write().unwrap().insert(name.into(), named);
        }
        let red = TenantKey::new("red");
        assert_eq!(tenants.get("genuine"), Some(red.clone()));
        for name in ["forged", "not-controller", "no-reference"] {
            assert_eq!(tenants.get(name), None, "{name}");
        }
        assert_eq!(tenants.all(), [("genuine".to_owned(), red)]);
        // Without an owner check no uid is kept, and the label names the tenant.
        let plain = NamespaceTenants::new("team").tenant_of(&namespace("u-forged", true));
        assert_eq!(plain.and_then(|n| n.controller), None);
    }

    #[test]
    fn the_tenant_is_the_labels_value_of_a_trusted_namespace() {
        let plain = NamespaceTenants::new("team");
        let tenant =
            |of: &NamespaceTenants, meta: &ObjectMeta| of.tenant_of(meta).map(|n| n.tenant);
        assert_eq!(
            tenant(&plain, &meta(&[("team", "red")], false)),
            Some(TenantKey::new("red"))
        );
        assert_eq!(tenant(&plain, &meta(&[("team", "")], false)), None);
        assert_eq!(tenant(&plain, &meta(&[("other", "red")], false)), None);
        let strict = NamespaceTenants::new("team")
            .trusting(Arc::new(|m: &ObjectMeta| m.annotations.is_some()));
        assert_eq!(tenant(&strict, &meta(&[("team", "red")], false)), None);
        assert_eq!(
            tenant(&strict, &meta(&[("team", "red")], true)),
            Some(TenantKey::new("red"))
        );
    }
}
