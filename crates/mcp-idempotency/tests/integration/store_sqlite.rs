//! The shared store test suite on the SQLite store, each check on a fresh file.

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
