//! What the Tenant controller watches: Tenants, and the children of the kinds [`Tenants`]
//! declares labelled `app.kubernetes.io/managed-by`; when sharded, only the children labelled
//! with a shard bucket this replica owns.

use idem_runtime::apply::{MANAGED_BY_LABEL, SHARD_BUCKET_LABEL};
use idem_runtime::controller::{Controller, ControllerConfig};
use idem_runtime::shard::Ranges;
use kube::Client;
use kube::runtime::watcher;

use super::reconcile::Tenants;
use crate::resources::{FIELD_MANAGER, Tenant};

/// Objects per page when an API server without streaming lists makes a child watch list by
/// pages: children are read one page at a time (a page of objects near etcd's 1.5 MB limit is
/// ~15 MB), never a whole kind at once.
pub const CHILD_LIST_PAGE: u32 = 10;

/// A child watch selecting `labels`: its lists stream (`sendInitialEvents`, Kubernetes' watch
/// lists, on by default since 1.34), so each object is decoded and judged on its own as it
/// arrives rather than as part of a whole list; by pages of [`CHILD_LIST_PAGE`] where the API
/// server refuses that.
fn child_watch(labels: &str) -> watcher::Config {
    watcher::Config::default()
        .labels(labels)
        .streaming_lists()
        .page_size(CHILD_LIST_PAGE)
}

/// The watch config of every child kind: only what the operator manages.
pub fn children_config() -> watcher::Config {
    child_watch(&format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}"))
}

/// The watch config of a controller's child kinds on a replica that owns `shard` (`None`: not
/// sharded): [`children_config`] narrowed to the children whose `bucket_label` holds one of its
/// buckets (`<bucket_label> in (…)`): for a Tenant's children [`SHARD_BUCKET_LABEL`], which the
/// apply engine puts on every child with the bucket of its owner's uid — the Tenant's, by which
/// the Tenant itself is sharded; for a TenantApp's, [`crate::shard::NAMESPACE_BUCKET_LABEL`],
/// the bucket of their namespace, by which the TenantApp is sharded. The API server filters by
/// label with or without its sharded-list gate. A child whose label was removed or forged
/// leaves this watch (its owner is enqueued by the DELETE event and the apply puts the label
/// back); it can appear in another replica's watch, which never reconciles the owner (the
/// worker's shard check is on the owner itself).
pub fn sharded_children_config(shard: Option<&Ranges>, bucket_label: &str) -> watcher::Config {
    let base = format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}");
    let labels = match shard.and_then(|r| r.label_selector(bucket_label)) {
        Some(buckets) => format!("{base},{buckets}"),
        None => base,
    };
    child_watch(&labels)
}

/// A Tenant's weight in the operator's fair queues: `spec.weight`, clamped to 1–100 (the
/// range the CRD admits).
pub fn weight(tenant: &Tenant) -> u32 {
    tenant.spec.weight.clamp(1, 100).unsigned_abs()
}

/// The Tenant controller, not yet running: each Tenant is its own tenant in the fair queue (its
/// derive's `tenant = name`), with `spec.weight` as its weight; with `shard`, its child watches
/// select only the children of this replica's buckets ([`sharded_children_config`] of
/// [`SHARD_BUCKET_LABEL`]).
pub fn controller(
    client: &Client,
    config: ControllerConfig,
    shard: Option<&Ranges>,
) -> Controller<Tenant> {
    Controller::for_reconciler_with::<Tenants>(
        client,
        watcher::Config::default(),
        sharded_children_config(shard, SHARD_BUCKET_LABEL),
    )
    .weight_of(weight)
    .with_config(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_runtime::shard::Ring;

    #[test]
    fn sharded_child_watches_select_the_owned_buckets_by_label() {
        let plain = format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}");
        assert_eq!(
            sharded_children_config(None, SHARD_BUCKET_LABEL)
                .label_selector
                .as_deref(),
            Some(plain.as_str())
        );
        // One replica owns everything: no bucket requirement.
        let alone = Ring::new(["a"]).ranges_of("a");
        assert_eq!(
            sharded_children_config(Some(&alone), SHARD_BUCKET_LABEL)
                .label_selector
                .as_deref(),
            Some(plain.as_str())
        );
        let ring = Ring::new(["a", "b", "c"]);
        let mine = ring.ranges_of("b");
        let config = sharded_children_config(Some(&mine), SHARD_BUCKET_LABEL);
        let selector = config.label_selector.unwrap();
        let rest = selector
            .strip_prefix(&format!("{plain},{SHARD_BUCKET_LABEL} in ("))
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{selector}"));
        let buckets: Vec<usize> = rest.split(',').map(|b| b.parse().unwrap()).collect();
        assert_eq!(buckets, mine.buckets().collect::<Vec<_>>());
    }
}
