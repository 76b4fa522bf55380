//! A ready-made [`Subject`] for a reconciler run by idem-runtime's [`Driver`]: the session
//! caches the child kinds the reconciler declares ([`Reconciler::children`]) and each pass is
//! one [`Driver::reconcile_once`]; the compared children are those kinds, selected by the
//! primary's tenant label (under the primary kind's label prefix).

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
/// ([`Reconciler::children`]) labelled with the primary's tenant ([`Labels::tenant`] of its
/// kind) when its derive's rule names it from the object alone and it is a label value
/// ([`Labels::is_value`]), else with the primary's uid
/// ([`Labels::owner_uid`]), or owned by it.
pub fn declared_children<R: Reconciler>(primary: &R::Resource) -> Children {
    let names = Labels::of::<R::Resource>();
    let selector = match primary.tenant() {
        // A tenant that is no label value is not stamped on the children (`Labels::tenant`).
        Ok(TenantRef::Known(tenant)) if Labels::is_value(tenant.as_str()) => {
            Some(format!("{}={tenant}", names.tenant()))
        }
        _ => (primary.meta().uid.as_ref()).map(|uid| format!("{}={uid}", names.owner_uid())),
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
