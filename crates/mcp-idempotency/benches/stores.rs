//! Claim + complete throughput of each store, on one core (a current-thread runtime).
//!
//! `cargo bench -p mcp-idempotency --bench stores`; add `--features redis` for the Redis store at
//! `REDIS_URL` (sequential round trips: a latency figure) and `--features metrics` for the memory
//! store behind `MeteredStore` with a Prometheus recorder installed. Criterion prints the throughput as elements
//! (claim+complete pairs) per second. Each pair claims a fresh key, as every new call does, and the
//! timing includes building the requests and the fencing token, but not key validation or
//! fingerprinting, which happen before a store is asked. `sqlite_floor_two_commits` is the floor
//! under the SQLite row: two one-row commits (an insert, then an update) through rusqlite.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mcp_idempotency::fingerprint::fingerprint;
use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, MemoryStore, RecordLimits, SqliteStore, Store,
};
use mcp_idempotency::{FencingToken, IdempotencyKey, Outcome, RecordId, Scope, Timestamp};

const OUTCOME: &str = r#"{"content":[{"type":"text","text":"charged: ch_0001"}],"structuredContent":{"chargeId":"ch_0001"}}"#;

/// Runs `iters` claim+complete pairs on fresh keys and returns the time they took.
fn claim_complete(store: Arc<dyn Store>, iters: u64) -> Duration {
    claim_complete_on(&current_thread_runtime(), store, iters)
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// [`claim_complete`] on a given runtime: a networked store's connection lives on the runtime
/// that opened it.
fn claim_complete_on(
    runtime: &tokio::runtime::Runtime,
    store: Arc<dyn Store>,
    iters: u64,
) -> Duration {
    let scope = Scope::new("bench", "principal");
    let tool_name: Arc<str> = "charge_payment".into();
    let fingerprint = fingerprint(&tool_name, Some(r#"{"amount":4200}"#)).unwrap();
    let now = Timestamp::now();
    let base = rand::random::<u64>() >> 16;
    // Keys arrive with the request; validating them is part of the engine's work, not the store's.
    let keys: Vec<IdempotencyKey> = (base..base + iters)
        .map(|i| IdempotencyKey::new(&format!("key-{i}"), 255).unwrap())
        .collect();
    runtime.block_on(async move {
        let start = Instant::now();
        for key in keys {
            let req = ClaimRequest {
                trace: None,
                id: RecordId {
                    scope: scope.clone(),
                    key,
                },
                fingerprint,
                tool_name: Arc::clone(&tool_name),
                owner: FencingToken::random(),
                now,
                lease_expires_at: now.saturating_add(Duration::from_secs(30)),
                expires_at: now.saturating_add(Duration::from_secs(86_400)),
                limits: RecordLimits::UNLIMITED,
            };
            assert_eq!(store.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
            let done = CompleteRequest {
                id: req.id,
                owner: req.owner,
                outcome: Outcome::Success(OUTCOME.into()),
                completed_at: now,
                expires_at: req.expires_at,
            };
            store.complete(done).await.unwrap();
        }
        start.elapsed()
    })
}

/// Records one store holds at most during a run: the default `max_records_total` quota.
const RECORDS_PER_STORE: u64 = 100_000;

/// Runs `iters` pairs on stores made by `make`, starting a fresh store every
/// [`RECORDS_PER_STORE`] pairs so that the store never holds more than the default quota.
fn on_bounded_stores(iters: u64, make: impl Fn() -> Arc<dyn Store>) -> Duration {
    let mut elapsed = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let batch = left.min(RECORDS_PER_STORE);
        elapsed += claim_complete(make(), batch);
        left -= batch;
    }
    elapsed
}

fn stores(c: &mut Criterion) {
    let mut group = c.benchmark_group("claim_complete");
    group.throughput(Throughput::Elements(1));
    group.bench_function("memory", |b| {
        b.iter_custom(|iters| on_bounded_stores(iters, || Arc::new(MemoryStore::new())))
    });
    // The same, measured by `MeteredStore` into a Prometheus recorder (what `--metrics-listen`
    // does): the cost of the metrics per claim+complete pair.
    #[cfg(feature = "metrics")]
    {
        let _handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("install the recorder");
        mcp_idempotency::metrics::describe();
        group.bench_function("memory_metered", |b| {
            b.iter_custom(|iters| {
                on_bounded_stores(iters, || {
                    Arc::new(mcp_idempotency::metrics::MeteredStore::new(Arc::new(
                        MemoryStore::new(),
                    )))
                })
            })
        });
    }
    let dir = tempfile::tempdir().unwrap();
    let sqlite: Arc<dyn Store> =
        Arc::new(SqliteStore::open_blocking(&dir.path().join("bench.sqlite3")).unwrap());
    group.sample_size(20);
    group.bench_function("sqlite", |b| {
        b.iter_custom(|iters| claim_complete(Arc::clone(&sqlite), iters))
    });
    // The floor under any SQLite store that records a claim before the call and its outcome
    // before the answer: two write transactions of one small row each, on the same settings (WAL,
    // synchronous=NORMAL), with SQLite's own checkpoints every 1000 pages.
    let floor = rusqlite::Connection::open(dir.path().join("floor.sqlite3")).unwrap();
    floor
        .execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
             CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT NOT NULL) WITHOUT ROWID;",
        )
        .unwrap();
    let mut next = 0u64;
    group.bench_function("sqlite_floor_two_commits", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                next += 1;
                let key = format!("key-{next}");
                // Cached statements, as the store's: the floor is the commits, not the parsing.
                floor
                    .prepare_cached("INSERT INTO t (k, v) VALUES (?1, 'claimed')")
                    .and_then(|mut insert| insert.execute([&key]))
                    .unwrap();
                floor
                    .prepare_cached("UPDATE t SET v = ?2 WHERE k = ?1")
                    .and_then(|mut update| update.execute([&key, OUTCOME]))
                    .unwrap();
            }
            start.elapsed()
        })
    });
    #[cfg(feature = "redis")]
    {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let runtime = current_thread_runtime();
        let prefix = format!("bench-{}", std::process::id());
        match runtime.block_on(mcp_idempotency::store::RedisStore::open_with_prefix(
            &url, &prefix,
        )) {
            Ok(redis) => {
                let redis: Arc<dyn Store> = Arc::new(redis);
                group.bench_function("redis", |b| {
                    b.iter_custom(|iters| claim_complete_on(&runtime, Arc::clone(&redis), iters))
                });
            }
            Err(err) => println!("note: Redis at {url} unreachable ({err}), skipped"),
        }
    }
    group.finish();
}

criterion_group!(benches, stores);
criterion_main!(benches);
