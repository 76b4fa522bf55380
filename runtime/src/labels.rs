//! The labels and the annotation idem puts on every child it makes, read back by the child
//! caches, the controller's mappings and the apply engine.

/// Label naming the field manager that manages the object (Kubernetes recommended label).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Label naming the tenant a child belongs to.
pub const TENANT_LABEL: &str = "tenancy.idem.dev/tenant";
/// Label holding the owner's `metadata.uid`; used to list an owner's children for pruning.
pub const OWNER_UID_LABEL: &str = "tenancy.idem.dev/owner-uid";
/// Label holding the shard bucket of the owner's `metadata.uid` (decimal `0..=255`:
/// [`crate::shard::bucket_of`] of its FNV-1a hash), so that a sharded replica's child watches can select the children of the owners it owns by label
/// ([`crate::shard::Ranges::label_selector`]); the children's own uids hash elsewhere. Only
/// ever used to narrow a watch: which replica reconciles an owner is decided by the owner's
/// own uid, so a forged value can hide a child from its owner's replica (until read-repair
/// applies the label back) but never makes another replica act on it.
pub const SHARD_BUCKET_LABEL: &str = "tenancy.idem.dev/shard-bucket";
/// Annotation holding the fingerprint of the desired body last applied.
pub const FINGERPRINT_ANNOTATION: &str = "tenancy.idem.dev/applied-fingerprint";
