//! The shared store test suite on the in-memory store, with one and with many shards.

use std::sync::Arc;

use mcp_idempotency::store::{MemoryStore, Store};

mod sharded {
    use super::*;
    mcp_idempotency::store_test_suite!(|| async { Arc::new(MemoryStore::new()) as Arc<dyn Store> });
}

mod single_shard {
    use super::*;
    mcp_idempotency::store_test_suite!(|| async {
        Arc::new(MemoryStore::with_shards(1)) as Arc<dyn Store>
    });
}
