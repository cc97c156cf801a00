//! A SQLite store whose file is write-locked by another connection waits for the lock on the
//! blocking pool instead of failing, and never blocks the async runtime meanwhile; reads do not
//! wait for it.

use std::sync::Arc;
use std::time::Duration;

use mcp_idempotency::fingerprint::fingerprint;
use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, ListFilter, RecordLimits, SqliteStore, Store,
};
use mcp_idempotency::{FencingToken, IdempotencyKey, RecordId, Scope, Timestamp};

fn claim_request(key: &str) -> ClaimRequest {
    let now = Timestamp::now();
    ClaimRequest {
        trace: None,
        id: RecordId {
            scope: Scope::new("ns", "alice"),
            key: IdempotencyKey::new(key, 255).unwrap(),
        },
        fingerprint: fingerprint("charge", Some("{}")).unwrap(),
        tool_name: Arc::from("charge"),
        owner: FencingToken::random(),
        now,
        lease_expires_at: now.saturating_add(Duration::from_secs(30)),
        expires_at: now.saturating_add(Duration::from_secs(3600)),
        limits: RecordLimits::UNLIMITED,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn claim_waits_for_another_connections_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("records.sqlite3");
    let store = SqliteStore::open(&path).await.unwrap();

    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();

    let claiming = tokio::spawn({
        let store = store.clone();
        async move { store.claim(&claim_request("k1")).await }
    });
    // The runtime keeps running (this sleep completes) while the claim waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!claiming.is_finished(), "the claim must wait for the lock");

    other.execute_batch("COMMIT").unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), claiming)
        .await
        .expect("the claim finishes once the lock is free")
        .unwrap()
        .unwrap();
    assert_eq!(outcome, ClaimOutcome::Claimed);

    // With the lock free, a second claim of the same key finds the record.
    let again = store.claim(&claim_request("k1")).await.unwrap();
    assert!(matches!(again, ClaimOutcome::Existing(_)), "{again:?}");
}

/// Reads take no write lock: while another connection holds it, a retry still finds its record,
/// and `get`, `list` and `stats` still answer, at once.
#[tokio::test(flavor = "current_thread")]
async fn reads_and_retries_answer_while_another_connection_holds_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("records.sqlite3");
    let store = SqliteStore::open(&path).await.unwrap();
    let first = claim_request("k1");
    assert_eq!(store.claim(&first).await.unwrap(), ClaimOutcome::Claimed);

    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let at_once = Duration::from_secs(1);
    let now = Timestamp::now();

    let retry = tokio::time::timeout(at_once, store.claim(&claim_request("k1")))
        .await
        .expect("a retry does not wait for the write lock")
        .unwrap();
    assert!(matches!(retry, ClaimOutcome::Existing(_)), "{retry:?}");
    let record = tokio::time::timeout(at_once, store.get(&first.id, now))
        .await
        .expect("get does not wait for the write lock")
        .unwrap();
    assert!(record.is_some());
    let listed = tokio::time::timeout(at_once, store.list(&ListFilter::default(), now, 10))
        .await
        .expect("list does not wait for the write lock")
        .unwrap();
    assert_eq!(listed.len(), 1);
    let stats = tokio::time::timeout(at_once, store.stats(now))
        .await
        .expect("stats does not wait for the write lock")
        .unwrap();
    assert_eq!(stats.in_progress, 1);

    other.execute_batch("COMMIT").unwrap();
}
