//! The shared store test suite on the SQLite store, each check on a fresh file; a rolling upgrade
//! on one file.

use std::sync::Arc;

use mcp_idempotency::store::{SqliteStore, Store};

mcp_idempotency::store_test_suite!(|| async {
    let dir = tempfile::tempdir().expect("temp dir").keep();
    Arc::new(
        SqliteStore::open(dir.join("records.sqlite3"))
            .await
            .expect("open"),
    ) as Arc<dyn Store>
});

/// The rolling upgrade ([`crate::rolling_upgrade`]) on one file, opened twice.
#[cfg(feature = "embedded")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_and_new_instances_share_a_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("records.sqlite3");
    let old = SqliteStore::open(&path).await.expect("open");
    let new = SqliteStore::open(&path).await.expect("open again");
    crate::rolling_upgrade::old_and_new_instances_share(Arc::new(old), Arc::new(new)).await;
}
