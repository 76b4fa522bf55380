//! Writing a resource's status from one reconcile: kstatus readiness plus the kind's own
//! fields, written only when it changed, with an Event when `Ready` changes.

use idem_runtime::resource::IdempotentResource;
use idem_runtime::status::{Readiness, StatusWriter};
use kube::{Api, Resource};

use crate::context::Context;
use crate::error::Error;
use crate::events;

/// Sets `readiness` (and whatever `fill` sets on the status) on `obj` through `api`, then
/// publishes an Event if the stored `Ready` condition differs.
///
/// # Errors
/// [`Error::Status`] when the write fails (see `StatusWriter::write`).
pub async fn write<K>(
    ctx: &Context,
    api: Api<K>,
    obj: &K,
    readiness: &Readiness,
    mut fill: impl FnMut(&mut K::Status),
) -> Result<(), Error>
where
    K: IdempotentResource + Resource<DynamicType = ()>,
{
    let previous = obj.status().and_then(|s| {
        K::conditions_of(s)
            .iter()
            .find(|c| c.type_ == "Ready")
            .cloned()
    });
    StatusWriter::new(api)
        .write(obj, |_, draft| {
            fill(draft.status_mut());
            draft.set_readiness(readiness);
        })
        .await?;
    events::readiness(
        &ctx.recorder,
        &obj.object_ref(&()),
        previous.as_ref(),
        readiness,
    )
    .await;
    Ok(())
}
