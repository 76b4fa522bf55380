//! A ready-made [`Subject`] for a reconciler run by idem-runtime's [`Driver`]: the session
//! caches the child kinds the reconciler declares ([`Reconciler::children`]) and each pass is
//! one [`Driver::reconcile_once`]; the compared children are those kinds, selected by the
//! primary's uid (the owner-uid label under the primary kind's label prefix, or an
//! ownerReference), see [`declared_children`].

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::apply::{ChildScope, Labels};
use idem_runtime::reconciler::{ChildWatches, Driver, Reconciler};
use idem_runtime::resource::{IdempotentResource, TenantRef};
use kube::{Client, Resource};
use serde_json::Value;

use super::{BoxError, Children, Subject};

/// How long a session's child watches may take to list.
const LISTED_WITHIN: Duration = Duration::from_secs(60);

/// The primary kind of a [`DriverSubject`].
pub type Primary<S> = <<S as DriverSubject>::Reconciler as Reconciler>::Resource;

/// What a kit test of a [`Driver`]-based reconciler says; the rest (session, reconcile,
/// children) follows from the reconciler's declaration. Run it with [`Driven`] (or
/// [`Kit::driven`](super::Kit::driven)).
pub trait DriverSubject: Send + Sync {
    /// The reconciler under test.
    type Reconciler: Reconciler;

    /// The reconciler of one session (one controller process) on `client`.
    fn reconciler(&self, client: &Client) -> Self::Reconciler;

    /// As [`Subject::primary`].
    fn primary(&self, name: &str) -> Primary<Self>;

    /// As [`Subject::flipped`]; default `None`.
    fn flipped(&self, _primary: &Primary<Self>) -> Option<Primary<Self>> {
        None
    }

    /// As [`Subject::settled`]; default: its `Ready` condition is true for its current
    /// generation.
    fn settled(&self, primary: &Primary<Self>) -> bool {
        primary.status().is_some_and(|s| {
            let at = Primary::<Self>::observed_generation_of(s) == primary.meta().generation;
            at && Primary::<Self>::conditions_of(s)
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    }

    /// As [`Subject::normalize`]; default: nothing.
    fn normalize(&self, _child: &mut Value) {}

    /// As [`Subject::created_once`]; default: none.
    fn created_once(&self, _child: &Value) -> Vec<String> {
        Vec::new()
    }

    /// As [`Subject::children`]; default [`declared_children`].
    fn children(&self, primary: &Primary<Self>) -> Children {
        declared_children::<Self::Reconciler>(primary)
    }
}

/// The children of `primary` that reconciler `R` makes: objects of the kinds it declares
/// ([`Reconciler::children`]) that carry the owner-uid label of the primary's kind
/// ([`Labels::owner_uid`], under its label prefix) with the primary's uid, or that have an
/// ownerReference to that uid (a child that lost its labels still counts). Both name this
/// one object: the tenant label ([`Labels::tenant`]) does not, since every object of a kind
/// whose tenant is its namespace (`tenant = namespace`) shares it with the others in that
/// namespace. Without a uid (not yet created), objects labelled with the primary's tenant
/// when its derive's rule names it from the object alone and it is a label value
/// ([`Labels::is_value`]: no other is stamped), else none.
pub fn declared_children<R: Reconciler>(primary: &R::Resource) -> Children {
    let names = Labels::of::<R::Resource>();
    let selector = match (primary.meta().uid.as_ref(), primary.tenant()) {
        (Some(uid), _) => Some(format!("{}={uid}", names.owner_uid())),
        (None, Ok(TenantRef::Known(tenant))) if Labels::is_value(tenant.as_str()) => {
            Some(format!("{}={tenant}", names.tenant()))
        }
        (None, _) => None,
    };
    Children {
        selector,
        kinds: R::children().iter().cloned().collect(),
    }
}

/// One controller process of a [`Driver`]-based reconciler: the driver, reading children from
/// caches its own watches of the declared child kinds fill (as the controller's would).
pub struct DriverSession<R: Reconciler> {
    driver: Driver<R>,
    client: Client,
    _watches: ChildWatches,
}

impl<R: Reconciler> DriverSession<R>
where
    <R::Resource as Resource>::Scope: ChildScope,
{
    /// A driver of `reconciler` on `client`, its declared child kinds watched and listed.
    ///
    /// # Errors
    /// When a watch does not list within a minute.
    ///
    /// # Cancel safety
    /// Cancel safe: the watches end when the future is dropped.
    pub async fn new(client: Client, reconciler: R) -> Result<Self, BoxError> {
        let driver = Driver::new(client.clone(), reconciler);
        let watches = tokio::time::timeout(LISTED_WITHIN, driver.watch_children()).await??;
        Ok(Self {
            driver,
            client,
            _watches: watches,
        })
    }

    /// The driver.
    pub fn driver(&self) -> &Driver<R> {
        &self.driver
    }

    /// Reconciles `primary` once with the session's client.
    ///
    /// # Errors
    /// The pass's error.
    ///
    /// # Cancel safety
    /// As [`Driver::reconcile_once`].
    pub async fn reconcile(&self, primary: Arc<R::Resource>) -> Result<(), BoxError> {
        self.driver
            .reconcile_once(self.client.clone(), primary)
            .await?;
        Ok(())
    }
}

/// The [`Subject`] of a [`DriverSubject`].
pub struct Driven<S>(pub S);

impl<S: DriverSubject> Subject for Driven<S>
where
    <Primary<S> as Resource>::Scope: ChildScope,
{
    type Primary = Primary<S>;
    type Session = DriverSession<S::Reconciler>;

    fn primary(&self, name: &str) -> Self::Primary {
        self.0.primary(name)
    }

    fn children(&self, primary: &Self::Primary) -> Children {
        self.0.children(primary)
    }

    async fn session(&self, client: Client) -> Result<Self::Session, BoxError> {
        let reconciler = self.0.reconciler(&client);
        DriverSession::new(client, reconciler).await
    }

    async fn reconcile(
        &self,
        session: &Self::Session,
        primary: Arc<Self::Primary>,
    ) -> Result<(), BoxError> {
        session.reconcile(primary).await
    }

    fn label_names(&self) -> Labels {
        Labels::of::<Primary<S>>()
    }

    fn normalize(&self, child: &mut Value) {
        self.0.normalize(child);
    }

    fn created_once(&self, child: &Value) -> Vec<String> {
        self.0.created_once(child)
    }

    fn settled(&self, primary: &Self::Primary) -> bool {
        self.0.settled(primary)
    }

    fn flipped(&self, primary: &Self::Primary) -> Option<Self::Primary> {
        self.0.flipped(primary)
    }
}

#[cfg(test)]
mod tests {
    use idem_runtime::apply::{CreatedChild, DesiredChildren};
    use idem_runtime::reconciler::{ChildKinds, ReconcileError};
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use kube::CustomResource;
    use kube::core::ApiResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::*;

    /// A kind whose tenant is its namespace, under a label prefix of its own.
    #[derive(
        CustomResource,
        idem_runtime::IdempotentResource,
        Clone,
        Debug,
        Serialize,
        Deserialize,
        JsonSchema,
    )]
    #[kube(
        group = "driven.test.idem.dev",
        version = "v1",
        kind = "Crew",
        namespaced,
        status = "CrewStatus"
    )]
    #[idempotent(tenant = namespace, label_prefix = "crews.example.com")]
    struct CrewSpec {
        size: u32,
    }

    #[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    struct CrewStatus {
        observed_generation: Option<i64>,
        #[serde(default)]
        conditions: Vec<Condition>,
        #[serde(default)]
        created_children: Vec<CreatedChild>,
    }

    struct Crews;

    impl Reconciler for Crews {
        type Resource = Crew;

        fn children() -> ChildKinds<Crew> {
            ChildKinds::new().owns::<ConfigMap>()
        }

        fn desired(&self, _: &Crew) -> Result<DesiredChildren, ReconcileError> {
            Ok(DesiredChildren::new())
        }
    }

    fn crew(name: &str, uid: Option<&str>) -> Crew {
        let mut c = Crew::new(name, CrewSpec { size: 1 });
        c.metadata.namespace = Some("shared".into());
        c.metadata.uid = uid.map(Into::into);
        c
    }

    #[test]
    fn two_primaries_of_a_namespace_tenanted_kind_in_one_namespace_select_only_their_own() {
        let (a, b) = (crew("a", Some("uid-a")), crew("b", Some("uid-b")));
        let (of_a, of_b) = (
            declared_children::<Crews>(&a),
            declared_children::<Crews>(&b),
        );
        assert_eq!(
            of_a.selector.as_deref(),
            Some("crews.example.com/owner-uid=uid-a")
        );
        assert_eq!(
            of_b.selector.as_deref(),
            Some("crews.example.com/owner-uid=uid-b")
        );
        assert_eq!(of_a.kinds, [ApiResource::erase::<ConfigMap>(&())]);
    }

    #[test]
    fn a_primary_without_a_uid_is_selected_by_its_tenant() {
        let children = declared_children::<Crews>(&crew("a", None));
        assert_eq!(
            children.selector.as_deref(),
            Some("crews.example.com/tenant=shared")
        );
    }
}
