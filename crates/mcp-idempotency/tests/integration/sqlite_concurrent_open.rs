//! Several stores opened at once on a file that does not exist yet all open: switching the new
//! file to WAL used to fail with "database is locked" (SQLite answers SQLITE_BUSY at once there,
//! without calling the busy handler), e.g. when a client starts two `mcp-idem wrap` servers together
//! on first use of the default store.

use std::sync::{Arc, Barrier};

use mcp_idempotency::store::SqliteStore;

#[test]
fn stores_opened_together_on_a_new_file_all_open() {
    const OPENERS: usize = 8;
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.sqlite3");
        let barrier = Arc::new(Barrier::new(OPENERS));
        let openers: Vec<_> = (0..OPENERS)
            .map(|_| {
                let (barrier, path) = (Arc::clone(&barrier), path.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    SqliteStore::open_blocking(&path).map(drop)
                })
            })
            .collect();
        for (n, opener) in openers.into_iter().enumerate() {
            if let Err(err) = opener.join().unwrap() {
                panic!("round {round}, opener {n}: {err}");
            }
        }
    }
}
