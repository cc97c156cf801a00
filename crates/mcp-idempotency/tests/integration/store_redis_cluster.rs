//! The shared store test suite on a Redis Cluster, plus: records spread over every primary, the
//! store-wide quota's bound, inspection and purges across primaries, and `NOSCRIPT` after the
//! cluster lost its scripts.
//!
//! Runs against `REDIS_CLUSTER_URL` (default the cluster `scripts/redis-cluster.sh start` runs:
//! `redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002`), each store under a fresh
//! random key prefix. If the cluster cannot be used the checks fail when `CI=true`; otherwise they
//! print a note and end without checking anything.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mcp_idempotency::fingerprint::fingerprint;
use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, ListFilter, QuotaExceeded, RecordLimits, RedisStore, Store,
};
use mcp_idempotency::{FencingToken, IdempotencyKey, RecordId, Scope, Timestamp};

const T0: Timestamp = Timestamp::from_millis(1_800_000_000_000);
const HOUR: Duration = Duration::from_secs(3600);

fn cluster_url() -> String {
    std::env::var("REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        "redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002".to_owned()
    })
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci.eq_ignore_ascii_case("true") || ci == "1")
}

fn random_prefix() -> String {
    format!("mcp-idem-test-{:016x}", rand::random::<u64>())
}

/// `REDIS_CLUSTER_URL` with `?shards=N` (when given).
fn url_with_shards(shards: Option<u16>) -> String {
    let url = cluster_url();
    match shards {
        Some(n) if url.contains('?') => format!("{url}&shards={n}"),
        Some(n) => format!("{url}?shards={n}"),
        None => url,
    }
}

/// A store on the cluster under a fresh prefix, or `None` (with a note) when the cluster is
/// unreachable outside CI.
async fn cluster_store(shards: Option<u16>) -> Option<(RedisStore, String)> {
    let prefix = random_prefix();
    match RedisStore::open_with_prefix(&url_with_shards(shards), &prefix).await {
        Ok(store) => Some((store, prefix)),
        Err(err) if in_ci() => panic!(
            "CI=true but the Redis Cluster of REDIS_CLUSTER_URL cannot be used: {err} \
             (scripts/redis-cluster.sh start runs one)"
        ),
        Err(err) => {
            eprintln!(
                "NOTE: skipping a Redis Cluster check: {err} (run scripts/redis-cluster.sh start \
                 and set REDIS_CLUSTER_URL, or CI=true to fail)"
            );
            None
        }
    }
}

mod suite {
    use super::*;

    // Every check of the suite but `quota_total`: on a cluster the store-wide quota is bounded,
    // not exact (see `a_total_quota_is_bounded_by_the_shards_shares` below).
    mcp_idempotency::store_test_suite!(total_quota_bounded: || async {
        cluster_store(None)
            .await
            .map(|(store, _)| Arc::new(store) as Arc<dyn Store>)
    });
}

fn record_id(namespace: &str, principal: &str, key: &str) -> RecordId {
    RecordId {
        scope: Scope::new(namespace, principal),
        key: IdempotencyKey::new(key, 255).expect("valid key"),
    }
}

fn claim_req(id: &RecordId, now: Timestamp, expires_in: Duration) -> ClaimRequest {
    ClaimRequest {
        trace: None,
        id: id.clone(),
        fingerprint: fingerprint("charge", Some(r#"{"amount":1}"#)).expect("valid arguments"),
        tool_name: "charge".into(),
        owner: FencingToken::random(),
        now,
        lease_expires_at: now.saturating_add(Duration::from_secs(30)),
        expires_at: now.saturating_add(expires_in),
        limits: RecordLimits::UNLIMITED,
    }
}

/// The primaries of the cluster (`HOST:PORT`), from `CLUSTER NODES` of its first seed node.
async fn primaries() -> Vec<String> {
    let url = cluster_url();
    let first = url
        .trim_start_matches("redis-cluster://")
        .split([',', '?', '/'])
        .next()
        .expect("a seed node")
        .to_owned();
    let mut conn = node(&first).await;
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .expect("CLUSTER NODES");
    let mut primaries: Vec<String> = nodes
        .lines()
        .filter(|line| {
            let flags = line.split(' ').nth(2).unwrap_or("");
            flags.split(',').any(|flag| flag == "master") && !flags.contains("fail")
        })
        .filter_map(|line| {
            let address = line.split(' ').nth(1)?;
            Some(address.split('@').next()?.to_owned())
        })
        .collect();
    primaries.sort();
    primaries
}

async fn node(address: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{address}"))
        .expect("a node URL")
        .get_multiplexed_async_connection()
        .await
        .expect("a connection to a cluster node")
}

/// How many keys of the store under `prefix` each primary holds (SCAN on each).
async fn keys_per_primary(prefix: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for primary in primaries().await {
        let mut conn = node(&primary).await;
        let pattern = format!("{{{prefix}:*");
        let mut cursor = 0_u64;
        let mut count = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .expect("SCAN");
            count += batch.len();
            if next == 0 {
                break;
            }
            cursor = next;
        }
        counts.insert(primary, count);
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_many_scopes_spread_over_every_primary_and_inspection_sees_them_all() {
    let Some((store, prefix)) = cluster_store(None).await else {
        return;
    };
    let primaries = primaries().await;
    assert!(
        primaries.len() >= 3,
        "the test cluster has 3 primaries: {primaries:?}"
    );
    const SCOPES: usize = 120;
    let short = Duration::from_secs(10);
    for n in 0..SCOPES {
        let id = record_id("spread", &format!("principal-{n}"), "k");
        let req = claim_req(&id, T0, short);
        assert_eq!(store.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    }

    let spread = keys_per_primary(&prefix).await;
    eprintln!("keys per primary: {spread:?}");
    assert_eq!(spread.len(), primaries.len());
    for (primary, keys) in &spread {
        // Each record has its hash and its scope index; the shard indexes come on top.
        assert!(
            *keys >= SCOPES / 10,
            "primary {primary} holds only {keys} keys: {spread:?}"
        );
    }

    // Stats, list and purge go through every shard, so every primary.
    let stats = store.stats(T0).await.unwrap();
    assert_eq!(stats.in_progress, SCOPES as u64);
    let listed = store
        .list(&ListFilter::default(), T0, 10_000)
        .await
        .unwrap();
    assert_eq!(listed.len(), SCOPES);
    let one = store
        .list(
            &ListFilter {
                namespace: Some("spread".into()),
                principal: Some("principal-7".into()),
                ..ListFilter::default()
            },
            T0,
            10,
        )
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].id.scope.principal(), "principal-7");
    let later = T0.saturating_add(Duration::from_secs(20));
    assert_eq!(store.stats(later).await.unwrap().expired, SCOPES as u64);
    assert_eq!(store.purge_expired(later).await.unwrap(), SCOPES as u64);
    let stats = store.stats(later).await.unwrap();
    assert_eq!(
        (stats.in_progress, stats.completed, stats.expired),
        (0, 0, 0)
    );
    let left = keys_per_primary(&prefix).await;
    assert!(left.values().all(|&n| n == 0), "{left:?}");
}

/// The rolling upgrade ([`crate::rolling_upgrade`]) on a sharded cluster store, opened twice
/// under one prefix.
#[cfg(feature = "embedded")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_and_new_instances_share_a_store() {
    let Some((old, prefix)) = cluster_store(Some(4)).await else {
        return;
    };
    let new = RedisStore::open_with_prefix(&url_with_shards(Some(4)), &prefix)
        .await
        .expect("a second connection to the cluster");
    crate::rolling_upgrade::old_and_new_instances_share(Arc::new(old), Arc::new(new)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_total_quota_is_bounded_by_the_shards_shares() {
    // Two shards, a limit of 3: each shard admits ⌈3 / 2⌉ = 2 live records, so the store holds at
    // most 4 (the documented bound, limit + shards − 1) and at least... its fullest shard's 2.
    let Some((store, _)) = cluster_store(Some(2)).await else {
        return;
    };
    let limits = RecordLimits {
        max_records_per_scope: u64::MAX,
        max_records_total: 3,
    };
    let mut claimed = 0;
    let mut refused = 0;
    for n in 0..64 {
        let id = record_id("bounded", &format!("p{n}"), "k");
        let req = ClaimRequest {
            limits,
            ..claim_req(&id, T0, HOUR)
        };
        match store.claim(&req).await.unwrap() {
            ClaimOutcome::Claimed => claimed += 1,
            ClaimOutcome::QuotaExceeded(QuotaExceeded::Total { limit: 3 }) => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    // 64 random scopes reach both shards (all in one: probability 2^-63).
    assert_eq!((claimed, refused), (4, 60));
    assert_eq!(store.stats(T0).await.unwrap().in_progress, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_work_after_the_cluster_lost_its_scripts() {
    let Some((store, _)) = cluster_store(None).await else {
        return;
    };
    let first = claim_req(&record_id("noscript", "p", "before"), T0, HOUR);
    assert_eq!(store.claim(&first).await.unwrap(), ClaimOutcome::Claimed);
    // As after a failover to a replica that never loaded them, or a restart: EVALSHA answers
    // NOSCRIPT on every node; the driver loads the script and runs it again.
    for primary in primaries().await {
        let mut conn = node(&primary).await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .expect("SCRIPT FLUSH");
    }
    for n in 0..12 {
        let req = claim_req(&record_id("noscript", &format!("p{n}"), "after"), T0, HOUR);
        assert_eq!(store.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    }
    let again = claim_req(&first.id, T0, HOUR);
    assert!(matches!(
        store.claim(&again).await.unwrap(),
        ClaimOutcome::Existing(_)
    ));
}
