//! The engine's reads and writes as JSON: a desired body goes out as the value it is, and the
//! server's answer comes back as a JSON value, with no typed object built in between.
//!
//! The engine judges children as JSON ([`crate::compare`]) and its caches keep JSON, so a
//! `DynamicObject` between the two (parsed from the body, serialized, the answer parsed into it
//! and serialized back) only cost time and allocations on every write of a fill. Requests are
//! built by kube's own request builder on the `Api`'s URL and sent through the same client, so
//! they pass the same layers (fences, selectors, request slots, retry) and fail with the same
//! errors (`kube::Error::Api` with the server's `Status`).

use std::fmt::Debug;

use kube::Client;
use kube::api::{Api, DynamicObject, GetParams, Patch, PatchParams, PostParams};
use kube::core::Request;
use serde::Serialize;
use serde_json::Value;

/// The object `name`, `None` when the server answers 404 Not Found.
pub(super) async fn get(
    client: &Client,
    api: &Api<DynamicObject>,
    name: &str,
) -> Result<Option<Value>, kube::Error> {
    let mut req = Request::new(api.resource_url())
        .get(name, &GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert("get");
    match client.request::<Value>(req).await {
        Ok(obj) => Ok(Some(obj)),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// `POST`s `body`; the created object.
pub(super) async fn create(
    client: &Client,
    api: &Api<DynamicObject>,
    pp: &PostParams,
    body: &Value,
) -> Result<Value, kube::Error> {
    let bytes = serde_json::to_vec(body).map_err(kube::Error::SerdeError)?;
    let mut req = Request::new(api.resource_url())
        .create(pp, bytes)
        .map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert("create");
    client.request(req).await
}

/// `PATCH`es the object `name` with `patch`; the object the patch left.
pub(super) async fn patch<P: Serialize + Debug>(
    client: &Client,
    api: &Api<DynamicObject>,
    name: &str,
    pp: &PatchParams,
    patch: &Patch<P>,
) -> Result<Value, kube::Error> {
    let mut req = Request::new(api.resource_url())
        .patch(name, pp, patch)
        .map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert("patch");
    client.request(req).await
}
