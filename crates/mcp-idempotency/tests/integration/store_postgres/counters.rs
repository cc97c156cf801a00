//! The quota counters follow replacement of expired records and purges, including a backlog larger
//! than one purge batch.

use super::*;

/// Claiming over an expired record replaces it without counting a second record; purging
/// uncounts what it deletes; a full quota purges expired records before refusing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_follow_replacement_and_purge() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let store = TestStore::open(&url).await;
    let scope = scope();
    let two = RecordLimits {
        max_records_per_scope: 2,
        max_records_total: u64::MAX,
    };
    let short = |key: &str, now: Timestamp| ClaimRequest {
        expires_at: later(now, 10),
        ..claim_req(&record_id(&scope, key), now, RecordLimits::UNLIMITED)
    };
    assert_eq!(
        store.claim(&short("a", T0)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    // "a" expired: claiming it again replaces it, still one record in the scope.
    let t1 = later(T0, 10);
    let replaced = claim_req(&record_id(&scope, "a"), t1, RecordLimits::UNLIMITED);
    assert_eq!(store.claim(&replaced).await.unwrap(), ClaimOutcome::Claimed);
    let b = claim_req(&record_id(&scope, "b"), t1, two);
    assert_eq!(store.claim(&b).await.unwrap(), ClaimOutcome::Claimed);
    let c = claim_req(&record_id(&scope, "c"), t1, two);
    assert_eq!(
        store.claim(&c).await.unwrap(),
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 2 })
    );

    // Complete "b" with a short retention; once it expired, a full scope purges it to make room.
    let done = CompleteRequest {
        id: b.id.clone(),
        owner: b.owner,
        outcome: Outcome::Success("{}".into()),
        completed_at: t1,
        expires_at: later(t1, 5),
    };
    assert_eq!(store.complete(done).await.unwrap(), Fenced::Applied);
    let t2 = later(t1, 5);
    let c = claim_req(&record_id(&scope, "c"), t2, two);
    assert_eq!(store.claim(&c).await.unwrap(), ClaimOutcome::Claimed);
    assert_eq!(store.get(&b.id, t2).await.unwrap(), None);
    assert_eq!(
        store.stats(t2).await.unwrap(),
        StoreStats {
            in_progress: 2,
            completed: 0,
            expired: 0
        }
    );

    // Purging everything brings the counters back to zero: the scope takes two new records.
    assert_eq!(store.purge_expired(later(T0, 100_000)).await.unwrap(), 2);
    let t3 = later(T0, 100_000);
    for key in ["x", "y"] {
        let req = claim_req(&record_id(&scope, key), t3, two);
        assert_eq!(store.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    }
    let req = claim_req(&record_id(&scope, "z"), t3, two);
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        ClaimOutcome::QuotaExceeded(_)
    ));
}

/// A backlog larger than one purge batch (10 000) is purged completely, with the counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_a_large_backlog_in_batches() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let store = TestStore::open(&url).await;
    let scope = scope();
    let expired = claim_req(&record_id(&scope, "seed"), T0, RecordLimits::UNLIMITED);
    assert_eq!(store.claim(&expired).await.unwrap(), ClaimOutcome::Claimed);
    // Copy the seed record 12 345 times, in the seed's counter shard, counting the copies as
    // claims would.
    let client = admin(&url).await;
    let s = &store.schema;
    client
        .batch_execute(&format!(
            "INSERT INTO \"{s}\".idem_records (namespace, principal, key, fingerprint, tool_name,
                    owner, lease_expires_at, outcome_kind, outcome_body, completed_at,
                    created_at, expires_at, shard)
                SELECT namespace, principal, key || '-' || n, fingerprint, tool_name, owner,
                    lease_expires_at, outcome_kind, outcome_body, completed_at, created_at,
                    expires_at, shard
                FROM \"{s}\".idem_records, generate_series(1, 12345) AS n;
             UPDATE \"{s}\".idem_scope_shards SET records = records + 12345
                WHERE shard = (SELECT shard FROM \"{s}\".idem_records WHERE key = 'seed');
             UPDATE \"{s}\".idem_total_shards SET records = records + 12345
                WHERE shard = (SELECT shard FROM \"{s}\".idem_records WHERE key = 'seed');"
        ))
        .await
        .unwrap();
    assert_counters_consistent(&url, s).await;
    let after_retention = later(T0, 3600);
    assert_eq!(store.purge_expired(after_retention).await.unwrap(), 12_346);
    assert_eq!(
        store.stats(after_retention).await.unwrap(),
        StoreStats::default()
    );
    assert_counters_consistent(&url, s).await;
    let one = RecordLimits {
        max_records_per_scope: 1,
        max_records_total: 1,
    };
    let req = claim_req(&record_id(&scope, "fresh"), after_retention, one);
    assert_eq!(store.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
}
