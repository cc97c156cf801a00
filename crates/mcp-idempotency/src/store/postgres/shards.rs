//! The counter shards, which the tables (`schema`), the statements (`sql`) and the claims
//! (`quota`) all read: how many rows each counter is split over, and the names of the constraints
//! that say a shard is full.

/// Counter rows per scope and for the whole store.
pub(super) const SHARDS: i16 = 16;

/// The constraints of `idem_shard_guard`.
pub(super) const TOTAL_SHARD_FULL: &str = "idem_total_shard_full";
pub(super) const SCOPE_SHARD_FULL: &str = "idem_scope_shard_full";
