//! The rolling upgrade ([`crate::rolling_upgrade`]) on one Redis store: two connections under one
//! key prefix, and what the keys look like in Redis.

use std::sync::Arc;

use mcp_idempotency::store::{RedisStore, Store};

use super::{keys_under, raw_connection, redis_url, shared_store};
use crate::rolling_upgrade::old_and_new_instances_share;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_and_new_instances_share_a_store() {
    let Some((old, prefix)) = shared_store().await else {
        return;
    };
    let new = RedisStore::open_with_prefix(&redis_url(), &prefix)
        .await
        .expect("a second connection to the shared store");
    old_and_new_instances_share(Arc::new(old) as Arc<dyn Store>, Arc::new(new)).await;

    // In Redis, every key of both kinds carries the store's one hash tag; a derived key's U+001F
    // and `:` are percent-encoded in the key names, never raw.
    let mut conn = raw_connection().await;
    let names = keys_under(&mut conn, &prefix).await;
    let tag = format!("{{{prefix}}}:");
    for name in &names {
        assert!(name.starts_with(&tag), "{name}");
        assert_eq!(name.matches('{').count(), 1, "{name}");
        assert!(!name.contains('\u{1f}'), "{name:?}");
    }
    let derived_records = names
        .iter()
        .filter(|name| name.contains(":r:") && name.contains("%1F"))
        .count();
    assert_eq!(derived_records, 4, "{names:?}");
}
