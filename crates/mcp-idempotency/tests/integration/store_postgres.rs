//! The PostgreSQL store: the shared suite (each check in a fresh schema), plus races between two
//! pools, quotas under concurrency, migrations, unreachable servers and an outage through a proxy.
//!
//! Runs against `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`). When the server
//! cannot be reached the tests fail if `CI=true`, and otherwise print a note and end without
//! checking anything.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcp_idempotency::fingerprint::fingerprint;
use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, PostgresStore, QuotaExceeded,
    RecordLimits, Store, StoreError, StoreFuture, StoreStats, StoreUrl, TakeOverRequest,
};
use mcp_idempotency::{
    FencingToken, IdempotencyKey, Outcome, Record, RecordId, RecordState, Scope, Timestamp,
};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tokio_postgres::NoTls;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const T0: Timestamp = Timestamp::from_millis(1_800_000_000_000);

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// `DATABASE_URL` if its server answers; `None` (after a note) if not and not on CI.
async fn reachable_url() -> Option<String> {
    let url = database_url();
    let probe = async {
        let (client, connection) = tokio_postgres::connect(&url, NoTls).await?;
        let driver = tokio::spawn(connection);
        client.simple_query("SELECT 1").await?;
        drop(client);
        let _ = driver.await;
        Ok::<_, tokio_postgres::Error>(())
    };
    let error = match tokio::time::timeout(Duration::from_secs(10), probe).await {
        Ok(Ok(())) => return Some(url),
        Ok(Err(err)) => err.to_string(),
        Err(_) => "no answer within 10 s".to_owned(),
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "PostgreSQL at DATABASE_URL ({}) is unreachable: {error}. CI=true, so this fails \
             instead of skipping; start PostgreSQL or point DATABASE_URL at one",
            redacted(&url)
        );
    }
    eprintln!(
        "note: skipping PostgreSQL store tests: {} is unreachable ({error}); set DATABASE_URL",
        redacted(&url)
    );
    None
}

fn redacted(url: &str) -> String {
    let Ok(config) = tokio_postgres::Config::from_str(url) else {
        return "an unparsable URL".to_owned();
    };
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        other => format!("{other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}/{}", config.get_dbname().unwrap_or_default())
}

fn fresh_schema() -> String {
    format!("mcp_idem_test_{:016x}", rand::random::<u64>())
}

/// A store in its own schema, dropped with the store.
#[derive(Debug)]
struct TestStore {
    store: Option<PostgresStore>,
    admin_url: String,
    schema: String,
}

impl TestStore {
    async fn open(url: &str) -> Self {
        Self::open_via(url, url, &fresh_schema()).await
    }

    /// Opens a store through `url` in `schema`; the schema is dropped through `admin_url`.
    async fn open_via(url: &str, admin_url: &str, schema: &str) -> Self {
        let store = PostgresStore::open_in_schema(url, schema)
            .await
            .expect("open the PostgreSQL store");
        assert_eq!(store.schema(), schema);
        Self {
            store: Some(store),
            admin_url: admin_url.to_owned(),
            schema: schema.to_owned(),
        }
    }

    fn inner(&self) -> &PostgresStore {
        self.store.as_ref().expect("store is open")
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        drop(self.store.take());
        let url = self.admin_url.clone();
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema);
        // Drop may run inside a runtime, so the cleanup gets a thread and a runtime of its own.
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let (client, connection) = tokio_postgres::connect(&url, NoTls).await.ok()?;
                let driver = tokio::spawn(connection);
                let dropped = client.batch_execute(&sql).await;
                drop(client);
                let _ = driver.await;
                dropped.ok()
            })
        });
        if !matches!(cleanup.join(), Ok(Some(()))) {
            eprintln!("note: could not drop test schema {}", self.schema);
        }
    }
}

impl Store for TestStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        self.inner().claim(req)
    }
    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        self.inner().complete(req)
    }
    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        self.inner().take_over(req)
    }
    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease_expires_at: Timestamp,
    ) -> StoreFuture<'a, Fenced> {
        self.inner().renew(id, owner, lease_expires_at)
    }
    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        self.inner().release(id, owner)
    }
    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>> {
        self.inner().get(id, now)
    }
    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64> {
        self.inner().purge_expired(now)
    }
    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        self.inner().stats(now)
    }
    fn list<'a>(
        &'a self,
        filter: &'a ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Record>> {
        self.inner().list(filter, now, limit)
    }
    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        self.inner().delete(id)
    }
}

mcp_idempotency::store_test_suite!(|| async {
    match reachable_url().await {
        Some(url) => Some(Arc::new(TestStore::open(&url).await) as Arc<dyn Store>),
        None => None,
    }
});

fn scope() -> Scope {
    Scope::new(format!("pg-{:016x}", rand::random::<u64>()), "principal")
}

fn record_id(scope: &Scope, key: &str) -> RecordId {
    RecordId {
        scope: scope.clone(),
        key: IdempotencyKey::new(key, 1024).expect("valid key"),
    }
}

fn claim_req(id: &RecordId, now: Timestamp, limits: RecordLimits) -> ClaimRequest {
    ClaimRequest {
        id: id.clone(),
        fingerprint: fingerprint("charge", Some(r#"{"amount":1}"#)).expect("valid arguments"),
        tool_name: "charge".into(),
        owner: FencingToken::random(),
        now,
        lease_expires_at: later(now, 30),
        expires_at: later(now, 3600),
        limits,
    }
}

fn later(t: Timestamp, secs: u64) -> Timestamp {
    t.saturating_add(Duration::from_secs(secs))
}

/// Two stores with separate pools on one schema, as two gateway instances would have, race 50
/// claims of one key: one wins, everybody else sees the winner's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_pools_race_one_key() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let a = Arc::new(TestStore::open(&url).await);
    let b = Arc::new(
        PostgresStore::open_in_schema(&url, &a.schema)
            .await
            .unwrap(),
    );
    let id = record_id(&scope(), "contended");
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store: Arc<dyn Store> = if i % 2 == 0 { a.clone() } else { b.clone() };
            let req = claim_req(&id, T0, RecordLimits::UNLIMITED);
            tokio::spawn(async move { (req.owner, store.claim(&req).await.expect("claim")) })
        })
        .collect();
    let mut winners = Vec::new();
    let mut seen = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            (owner, ClaimOutcome::Claimed) => winners.push(owner),
            (_, ClaimOutcome::Existing(record)) => match record.state {
                RecordState::InProgress { owner, .. } => seen.push(owner),
                other => panic!("unexpected state {other:?}"),
            },
            (_, other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim wins");
    assert_eq!(seen.len(), 49);
    assert!(seen.iter().all(|owner| *owner == winners[0]));
    let stats = a.stats(T0).await.unwrap();
    assert_eq!(stats.in_progress, 1);
}

/// 50 distinct keys of one scope claimed at once through two pools, with room for 10: exactly 10
/// win, and the counters stay exact (releasing one makes room for exactly one more).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scope_quota_holds_under_concurrency() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let a = Arc::new(TestStore::open(&url).await);
    let b = Arc::new(
        PostgresStore::open_in_schema(&url, &a.schema)
            .await
            .unwrap(),
    );
    let limits = RecordLimits {
        max_records_per_scope: 10,
        max_records_total: u64::MAX,
    };
    let scope = scope();
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store: Arc<dyn Store> = if i % 2 == 0 { a.clone() } else { b.clone() };
            let req = claim_req(&record_id(&scope, &format!("k{i}")), T0, limits);
            tokio::spawn(async move { (req.clone(), store.claim(&req).await.expect("claim")) })
        })
        .collect();
    let mut claimed = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            (req, ClaimOutcome::Claimed) => claimed.push(req),
            (_, ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 10 })) => {}
            (_, other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(claimed.len(), 10);
    assert_eq!(a.stats(T0).await.unwrap().in_progress, 10);

    let freed = &claimed[0];
    assert_eq!(
        a.release(&freed.id, freed.owner).await.unwrap(),
        Fenced::Applied
    );
    let next = claim_req(&record_id(&scope, "after-release"), T0, limits);
    assert_eq!(b.claim(&next).await.unwrap(), ClaimOutcome::Claimed);
    let over = claim_req(&record_id(&scope, "one-too-many"), T0, limits);
    assert_eq!(
        a.claim(&over).await.unwrap(),
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 10 })
    );
}

/// The store-wide limit under concurrency: 40 scopes race for 7 slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn total_quota_holds_under_concurrency() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let a = Arc::new(TestStore::open(&url).await);
    let b = Arc::new(
        PostgresStore::open_in_schema(&url, &a.schema)
            .await
            .unwrap(),
    );
    let limits = RecordLimits {
        max_records_per_scope: 1,
        max_records_total: 7,
    };
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let store: Arc<dyn Store> = if i % 2 == 0 { a.clone() } else { b.clone() };
            let req = claim_req(&record_id(&scope(), "k"), T0, limits);
            tokio::spawn(async move { store.claim(&req).await.expect("claim") })
        })
        .collect();
    let mut claimed = 0;
    for task in tasks {
        match task.await.unwrap() {
            ClaimOutcome::Claimed => claimed += 1,
            ClaimOutcome::QuotaExceeded(QuotaExceeded::Total { limit: 7 }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(claimed, 7);
    assert_eq!(a.stats(T0).await.unwrap().in_progress, 7);
}

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

/// A plain connection for looking at (or preparing) the tables directly.
async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// The counter rows agree with the records, shard by shard, and each counter keeps the capacity
/// invariant: all its rows carry one `capacity_limit`, and when it is set, no row holds more
/// records than its capacity and the capacities add up to at most the limit.
async fn assert_counters_consistent(url: &str, schema: &str) {
    let client = admin(url).await;
    let s = format!("\"{schema}\"");
    let scope_mismatches = count(
        &client,
        &format!(
            "SELECT count(*) FROM (
                SELECT namespace, principal, shard, count(*) AS n FROM {s}.idem_records
                GROUP BY namespace, principal, shard
             ) AS r FULL JOIN {s}.idem_scope_shards AS c USING (namespace, principal, shard)
             WHERE coalesce(r.n, 0) <> coalesce(c.records, 0)"
        ),
    )
    .await;
    assert_eq!(
        scope_mismatches, 0,
        "scope counters disagree with the records"
    );
    let total_mismatches = count(
        &client,
        &format!(
            "SELECT count(*) FROM (
                SELECT shard, count(*) AS n FROM {s}.idem_records GROUP BY shard
             ) AS r FULL JOIN {s}.idem_total_shards AS t USING (shard)
             WHERE coalesce(r.n, 0) <> coalesce(t.records, 0)"
        ),
    )
    .await;
    assert_eq!(
        total_mismatches, 0,
        "store counters disagree with the records"
    );
    assert_eq!(
        count(
            &client,
            &format!("SELECT count(*) FROM {s}.idem_total_shards")
        )
        .await,
        16
    );
    let broken = "count(DISTINCT capacity_limit) > 1
        OR (count(capacity_limit) > 0 AND count(capacity_limit) < count(*))
        OR (count(capacity_limit) > 0
            AND (sum(capacity) > max(capacity_limit) OR bool_or(records > capacity)))";
    let broken_scopes = count(
        &client,
        &format!(
            "SELECT count(*) FROM (
                SELECT 1 FROM {s}.idem_scope_shards GROUP BY namespace, principal HAVING {broken}
             ) AS b"
        ),
    )
    .await;
    assert_eq!(
        broken_scopes, 0,
        "a scope counter breaks the capacity invariant"
    );
    let broken_total = count(
        &client,
        &format!("SELECT count(*) FROM (SELECT 1 FROM {s}.idem_total_shards HAVING {broken}) AS b"),
    )
    .await;
    assert_eq!(
        broken_total, 0,
        "the store counter breaks the capacity invariant"
    );
}

/// Runs `requests` on `tasks` tasks, alternately on each of two stores, each task taking the
/// next request when done with one.
async fn claim_concurrently(
    pools: [Arc<dyn Store>; 2],
    requests: Vec<ClaimRequest>,
    tasks: usize,
) -> Vec<(ClaimRequest, ClaimOutcome)> {
    let queue = Arc::new(Mutex::new(requests));
    let workers: Vec<_> = (0..tasks)
        .map(|i| {
            let store = pools[i % 2].clone();
            let queue = queue.clone();
            tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    let Some(req) = queue.lock().unwrap().pop() else {
                        break done;
                    };
                    let outcome = store.claim(&req).await.expect("claim");
                    done.push((req, outcome));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.unwrap());
    }
    all
}

/// Two stores (separate pools) on one fresh schema.
async fn two_pools(url: &str) -> (Arc<TestStore>, Arc<dyn Store>) {
    let a = Arc::new(TestStore::open(url).await);
    let b = Arc::new(PostgresStore::open_in_schema(url, &a.schema).await.unwrap());
    (a, b)
}

/// Many distinct keys of ONE scope claimed at once from two pools (the case whose claims all
/// locked one scope row and one store row before sharding): all win, every counter shard is used,
/// and the counters stay exact through completion, release and purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_keys_of_one_scope_from_two_pools() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let (a, b) = two_pools(&url).await;
    let limits = RecordLimits {
        max_records_per_scope: 100_000,
        max_records_total: 1_000_000,
    };
    let scope = scope();
    let requests: Vec<_> = (0..800)
        .map(|i| claim_req(&record_id(&scope, &format!("k{i}")), T0, limits))
        .collect();
    let results = claim_concurrently([a.clone(), b.clone()], requests, 32).await;
    assert_eq!(results.len(), 800);
    assert!(results.iter().all(|(_, o)| *o == ClaimOutcome::Claimed));
    assert_eq!(a.stats(T0).await.unwrap().in_progress, 800);
    assert_counters_consistent(&url, &a.schema).await;
    let client = admin(&url).await;
    let used = count(
        &client,
        &format!(
            "SELECT count(*) FROM \"{}\".idem_scope_shards WHERE records > 0",
            a.schema
        ),
    )
    .await;
    assert_eq!(used, 16, "800 keys spread over all 16 shards");

    // Release half (through the other pool), complete the other half with a short retention.
    for (i, (req, _)) in results.iter().enumerate() {
        let store: &dyn Store = if i % 2 == 0 { &*b } else { &*a };
        let fenced = if i % 2 == 0 {
            store.release(&req.id, req.owner).await.unwrap()
        } else {
            let done = CompleteRequest {
                id: req.id.clone(),
                owner: req.owner,
                outcome: Outcome::Success("{}".into()),
                completed_at: T0,
                expires_at: later(T0, 60),
            };
            store.complete(done).await.unwrap()
        };
        assert_eq!(fenced, Fenced::Applied);
    }
    assert_eq!(a.stats(T0).await.unwrap().completed, 400);
    assert_counters_consistent(&url, &a.schema).await;
    assert_eq!(a.purge_expired(later(T0, 60)).await.unwrap(), 400);
    assert_counters_consistent(&url, &a.schema).await;
    let s = &a.schema;
    assert_eq!(
        count(
            &client,
            &format!("SELECT count(*) FROM \"{s}\".idem_scope_shards")
        )
        .await,
        0,
        "the empty scope's counter rows are dropped"
    );
    assert_eq!(
        count(
            &client,
            &format!("SELECT coalesce(sum(records), 0)::int8 FROM \"{s}\".idem_total_shards")
        )
        .await,
        0
    );
}

/// Near a limit, shards run out of room one by one and claims take the exact path: rounds of
/// races through two pools for the last few slots (of a scope, then of the store) admit exactly
/// as many as there is room for, never more, and never fewer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_races_near_the_limit_are_exact() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let (a, b) = two_pools(&url).await;
    let limits = RecordLimits {
        max_records_per_scope: 40,
        max_records_total: u64::MAX,
    };
    let scope = scope();
    let mut held = Vec::new();
    for i in 0..33 {
        let req = claim_req(&record_id(&scope, &format!("fill{i}")), T0, limits);
        assert_eq!(a.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
        held.push(req);
    }
    for round in 0..4 {
        let room = 40 - held.len();
        let requests: Vec<_> = (0..30)
            .map(|i| claim_req(&record_id(&scope, &format!("r{round}-{i}")), T0, limits))
            .collect();
        let results = claim_concurrently([a.clone(), b.clone()], requests, 12).await;
        let mut won = 0;
        for (req, outcome) in results {
            match outcome {
                ClaimOutcome::Claimed => {
                    won += 1;
                    held.push(req);
                }
                ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 40 }) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(won, room, "round {round}");
        assert_eq!(a.stats(T0).await.unwrap().in_progress, 40);
        assert_counters_consistent(&url, &a.schema).await;
        // Free a few slots for the next round.
        for req in held.drain(..round + 2) {
            assert_eq!(
                b.release(&req.id, req.owner).await.unwrap(),
                Fenced::Applied
            );
        }
    }

    // The store-wide limit, with claims spread over five scopes.
    let (a, b) = two_pools(&url).await;
    let limits = RecordLimits {
        max_records_per_scope: u64::MAX,
        max_records_total: 25,
    };
    let scopes: Vec<_> = (0..5).map(|_| self::scope()).collect();
    for i in 0..20 {
        let req = claim_req(&record_id(&scopes[i % 5], &format!("fill{i}")), T0, limits);
        assert_eq!(b.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    }
    let requests: Vec<_> = (0..40)
        .map(|i| claim_req(&record_id(&scopes[i % 5], &format!("race{i}")), T0, limits))
        .collect();
    let results = claim_concurrently([a.clone(), b.clone()], requests, 12).await;
    let won = results
        .iter()
        .filter(|(_, outcome)| match outcome {
            ClaimOutcome::Claimed => true,
            ClaimOutcome::QuotaExceeded(QuotaExceeded::Total { limit: 25 }) => false,
            other => panic!("unexpected {other:?}"),
        })
        .count();
    assert_eq!(won, 5);
    assert_eq!(a.stats(T0).await.unwrap().in_progress, 25);
    assert_counters_consistent(&url, &a.schema).await;
}

/// Capacities computed for one limit never let a claim with a lower limit through: a scope filled
/// to 40 under a limit of 64 refuses claims under a limit of 32 until it is down to 31 records.
/// Instances configured with different limits racing each other stay within the higher limit,
/// and reach it only if some claim under it was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lower_limit_is_never_exceeded() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let (a, b) = two_pools(&url).await;
    let with_limit = |n: u64| RecordLimits {
        max_records_per_scope: n,
        max_records_total: u64::MAX,
    };
    let scope = scope();
    let mut held = Vec::new();
    for i in 0..40 {
        let req = claim_req(&record_id(&scope, &format!("k{i}")), T0, with_limit(64));
        assert_eq!(a.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
        held.push(req);
    }
    for i in 0..16 {
        let req = claim_req(&record_id(&scope, &format!("low{i}")), T0, with_limit(32));
        assert_eq!(
            b.claim(&req).await.unwrap(),
            ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 32 })
        );
    }
    for req in held.drain(..9) {
        assert_eq!(
            a.release(&req.id, req.owner).await.unwrap(),
            Fenced::Applied
        );
    }
    let req = claim_req(&record_id(&scope, "low-fits"), T0, with_limit(32));
    assert_eq!(b.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    let req = claim_req(&record_id(&scope, "low-over"), T0, with_limit(32));
    assert_eq!(
        b.claim(&req).await.unwrap(),
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 32 })
    );
    let req = claim_req(&record_id(&scope, "high-fits"), T0, with_limit(64));
    assert_eq!(a.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    assert_counters_consistent(&url, &a.schema).await;

    // Two configurations racing on a fresh scope.
    let scope = self::scope();
    let requests: Vec<_> = (0..60)
        .map(|i| {
            let limit = if i % 2 == 0 { 30 } else { 20 };
            claim_req(
                &record_id(&scope, &format!("mixed{i}")),
                T0,
                with_limit(limit),
            )
        })
        .collect();
    let results = claim_concurrently([a.clone(), b.clone()], requests, 12).await;
    let won = results
        .iter()
        .filter(|(_, o)| *o == ClaimOutcome::Claimed)
        .count();
    let high_refused = results
        .iter()
        .any(|(_, o)| *o == ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 30 }));
    assert!(won <= 30, "{won}");
    if high_refused {
        assert_eq!(won, 30);
    }
    assert_counters_consistent(&url, &a.schema).await;
}

/// The version 1 tables, as the previous build created them.
fn v1_ddl(s: &str) -> String {
    format!(
        "CREATE SCHEMA {s};
        CREATE TABLE {s}.idem_schema_version (
            id      smallint PRIMARY KEY CHECK (id = 1),
            version integer  NOT NULL
        );
        INSERT INTO {s}.idem_schema_version (id, version) VALUES (1, 1);
        CREATE TABLE IF NOT EXISTS {s}.idem_records (
            namespace        text COLLATE \"C\" NOT NULL,
            principal        text COLLATE \"C\" NOT NULL,
            key              text COLLATE \"C\" NOT NULL,
            fingerprint      bytea  NOT NULL CHECK (octet_length(fingerprint) = 32),
            tool_name        text   NOT NULL,
            owner            bigint,
            lease_expires_at bigint,
            outcome_kind     text,
            outcome_body     text,
            completed_at     bigint,
            created_at       bigint NOT NULL,
            expires_at       bigint NOT NULL,
            PRIMARY KEY (namespace, principal, key),
            CHECK ((owner IS NULL) = (outcome_kind IS NOT NULL))
        );
        CREATE INDEX IF NOT EXISTS idem_records_expires_at ON {s}.idem_records (expires_at);
        CREATE TABLE IF NOT EXISTS {s}.idem_scope_counts (
            namespace text COLLATE \"C\" NOT NULL,
            principal text COLLATE \"C\" NOT NULL,
            records   bigint NOT NULL,
            PRIMARY KEY (namespace, principal)
        );
        CREATE TABLE IF NOT EXISTS {s}.idem_totals (
            id      smallint PRIMARY KEY CHECK (id = 1),
            records bigint NOT NULL
        );
        INSERT INTO {s}.idem_totals (id, records) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
        CREATE TABLE IF NOT EXISTS {s}.idem_quota_guard (
            total_ok boolean CONSTRAINT idem_total_quota_exceeded CHECK (total_ok),
            scope_ok boolean CONSTRAINT idem_scope_quota_exceeded CHECK (scope_ok)
        );"
    )
}

/// A version 1 schema with records in it is migrated on open: the records are kept (in shard 0),
/// the counts carried over, quotas hold across old and new records, and releasing and purging old
/// records uncounts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrates_a_version_1_schema() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let schema = fresh_schema();
    let client = admin(&url).await;
    let s = format!("\"{schema}\"");
    client.batch_execute(&v1_ddl(&s)).await.unwrap();
    let scope = scope();
    let other = self::scope();
    let (ns, pr) = (scope.namespace(), scope.principal());
    let ms = |t: Timestamp| t.as_millis() as i64;
    let fp = "decode(repeat('ab', 32), 'hex')";
    // In the scope: "a" in progress (owner 42), "b" completed, "c" expired; "d" elsewhere.
    for (ns, pr, key, owner, kind, expires) in [
        (ns, pr, "a", Some(42_i64), None, later(T0, 3600)),
        (ns, pr, "b", None, Some("success"), later(T0, 3600)),
        (ns, pr, "c", Some(7), None, T0),
        (
            other.namespace(),
            other.principal(),
            "d",
            Some(8),
            None,
            later(T0, 3600),
        ),
    ] {
        client
            .execute(
                &format!(
                    "INSERT INTO {s}.idem_records VALUES ($1, $2, $3, {fp}, 'charge', $4, $5, $6,
                        CASE WHEN $6::text IS NULL THEN NULL ELSE '{{}}' END,
                        CASE WHEN $6::text IS NULL THEN NULL ELSE $7::int8 END, $7, $8)"
                ),
                &[
                    &ns,
                    &pr,
                    &key,
                    &owner,
                    &owner.map(|_| ms(later(T0, 30))),
                    &kind,
                    &ms(T0),
                    &ms(expires),
                ],
            )
            .await
            .unwrap();
    }
    client
        .execute(
            &format!("INSERT INTO {s}.idem_scope_counts VALUES ($1, $2, 3), ($3, $4, 1)"),
            &[&ns, &pr, &other.namespace(), &other.principal()],
        )
        .await
        .unwrap();
    client
        .batch_execute(&format!("UPDATE {s}.idem_totals SET records = 4"))
        .await
        .unwrap();

    let store = TestStore::open_via(&url, &url, &schema).await;
    assert_eq!(
        count(
            &client,
            &format!("SELECT version::int8 FROM {s}.idem_schema_version")
        )
        .await,
        2
    );
    for old in ["idem_scope_counts", "idem_totals", "idem_quota_guard"] {
        let gone: bool = client
            .query_one("SELECT to_regclass($1) IS NULL", &[&format!("{s}.{old}")])
            .await
            .unwrap()
            .get(0);
        assert!(gone, "{old} was dropped");
    }
    assert_counters_consistent(&url, &schema).await;
    let a = record_id(&scope, "a");
    assert!(matches!(
        store.get(&a, T0).await.unwrap().unwrap().state,
        RecordState::InProgress { owner, .. } if owner.as_u64() == 42
    ));
    assert!(matches!(
        store
            .get(&record_id(&scope, "b"), T0)
            .await
            .unwrap()
            .unwrap()
            .state,
        RecordState::Completed { .. }
    ));
    assert_eq!(store.get(&record_id(&scope, "c"), T0).await.unwrap(), None);

    // Three records (one expired) count against a limit of 4.
    let four = RecordLimits {
        max_records_per_scope: 4,
        max_records_total: 5,
    };
    let claim = |key: &str| claim_req(&record_id(&scope, key), T0, four);
    assert_eq!(
        store.claim(&claim("new1")).await.unwrap(),
        ClaimOutcome::Claimed
    );
    // Full: purging the expired "c" makes room.
    assert_eq!(
        store.claim(&claim("new2")).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        store
            .get(&record_id(&scope, "c"), later(T0, 1))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store.claim(&claim("new3")).await.unwrap(),
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 4 })
    );
    // The store holds five (with "d"): the store-wide limit refuses elsewhere.
    let elsewhere = claim_req(&record_id(&self::scope(), "x"), T0, four);
    assert_eq!(
        store.claim(&elsewhere).await.unwrap(),
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Total { limit: 5 })
    );
    assert_eq!(
        store.release(&a, FencingToken::from_u64(42)).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.claim(&claim("new3")).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_counters_consistent(&url, &schema).await;

    // Purging everything brings every counter back to zero.
    assert_eq!(store.purge_expired(later(T0, 100_000)).await.unwrap(), 5);
    assert_counters_consistent(&url, &schema).await;
    assert_eq!(
        count(
            &client,
            &format!(
                "SELECT ((SELECT coalesce(sum(records), 0) FROM {s}.idem_scope_shards)
                    + (SELECT coalesce(sum(records), 0) FROM {s}.idem_total_shards))::int8"
            )
        )
        .await,
        0
    );
}

/// Outcome bodies, keys and tokens come back exactly, including tokens above `i64::MAX`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_bodies_round_trip_bit_for_bit() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let store = TestStore::open(&url).await;
    let scope = scope();
    for (i, owner) in [1, u64::MAX, 1 << 63, i64::MAX as u64]
        .into_iter()
        .enumerate()
    {
        let req = ClaimRequest {
            owner: FencingToken::from_u64(owner),
            ..claim_req(
                &record_id(&scope, &format!("k{i}")),
                T0,
                RecordLimits::UNLIMITED,
            )
        };
        assert_eq!(store.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
        let record = store.get(&req.id, T0).await.unwrap().unwrap();
        assert!(
            matches!(record.state, RecordState::InProgress { owner: got, .. } if got.as_u64() == owner)
        );
        let body = format!("{{\"n\": {i}, \"s\": \"\\u0000 \u{1F600} \\\"x\\\" \r\n\"}}");
        let done = CompleteRequest {
            id: req.id.clone(),
            owner: req.owner,
            outcome: Outcome::Error(body.clone()),
            completed_at: T0,
            expires_at: later(T0, 60),
        };
        assert_eq!(store.complete(done).await.unwrap(), Fenced::Applied);
        let record = store.get(&req.id, T0).await.unwrap().unwrap();
        assert_eq!(
            record.state,
            RecordState::Completed {
                outcome: Outcome::Error(body),
                completed_at: T0
            }
        );
    }
}

/// Several processes opening a new schema at once: the advisory lock makes them take turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_opens_of_a_new_schema() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let schema = fresh_schema();
    let opens: Vec<_> = (0..8)
        .map(|_| {
            let (url, schema) = (url.clone(), schema.clone());
            tokio::spawn(async move { PostgresStore::open_in_schema(&url, &schema).await })
        })
        .collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap().expect("concurrent open"));
    }
    // Adopt the schema so that it is dropped at the end.
    let owner = TestStore::open_via(&url, &url, &schema).await;
    let req = claim_req(&record_id(&scope(), "k"), T0, RecordLimits::UNLIMITED);
    assert_eq!(stores[3].claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    assert!(owner.get(&req.id, T0).await.unwrap().is_some());
}

/// A schema written by a newer build is refused with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_schema_version_is_refused() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let store = TestStore::open(&url).await;
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "UPDATE \"{}\".idem_schema_version SET version = 99",
            store.schema
        ))
        .await
        .unwrap();
    let err = PostgresStore::open_in_schema(&url, &store.schema)
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("version 99"), "{message}");
    assert!(message.contains("newer"), "{message}");
}

/// `store::open` takes `postgres://…?schema=NAME`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opens_from_a_store_url_with_a_schema_parameter() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let owner = TestStore::open(&url).await;
    let separator = if url.contains('?') { '&' } else { '?' };
    let store_url: StoreUrl = format!("{url}{separator}schema={}", owner.schema)
        .parse()
        .unwrap();
    let store = mcp_idempotency::store::open(&store_url).await.unwrap();
    let req = claim_req(&record_id(&scope(), "k"), T0, RecordLimits::UNLIMITED);
    assert_eq!(store.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    assert!(owner.get(&req.id, T0).await.unwrap().is_some());
}

/// A closed port fails at open, quickly, naming host and database but not the password.
#[tokio::test]
async fn unreachable_server_fails_fast_at_open() {
    let port = closed_port().await;
    let started = Instant::now();
    let err = PostgresStore::open(&format!(
        "postgres://postgres:hunter2@127.0.0.1:{port}/somedb"
    ))
    .await
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(err.is_unavailable(), "{err:?}");
    let message = format!("{err} {err:?}");
    assert!(
        message.contains(&format!("127.0.0.1:{port}/somedb")),
        "{message}"
    );
    assert!(message.contains("onnection refused"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
}

/// A server that accepts connections and never answers: open gives up after `connect_timeout`.
#[tokio::test]
async fn silent_server_times_out_at_open() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    let silent = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            keep.lock().unwrap().push(socket);
        }
    });
    let started = Instant::now();
    let err = PostgresStore::open(&format!(
        "postgres://postgres:hunter2@127.0.0.1:{port}/db?connect_timeout=1"
    ))
    .await
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(err.is_unavailable(), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("hunter2"));
    silent.abort();
}

#[tokio::test]
async fn malformed_urls_and_schemas_are_refused() {
    for (url, needle) in [
        (
            "postgres://u:hunter2@localhost:notaport/db",
            "invalid value for option `port`",
        ),
        (
            "postgres://u:hunter2@localhost/db?bogus=1",
            "unknown option `bogus`",
        ),
        (
            "postgres://u:hunter2@localhost/db?schema=no-dashes",
            "schema",
        ),
        ("postgres://u:hunter2@localhost/db?sslmode=require", "TLS"),
    ] {
        let err = PostgresStore::open(url).await.unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidUrl { .. }),
            "{url}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(needle), "{url}: {message}");
        assert!(!message.contains("hunter2"), "{url}: {message}");
    }
    let err = PostgresStore::open_in_schema(DEFAULT_URL, "x\"; DROP TABLE y; --")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidUrl { .. }), "{err:?}");
}

/// The database goes away (a proxy in front of it stops) and comes back: operations fail with
/// `Unavailable` within a bounded time during the outage and succeed afterwards, without reopening
/// the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovers_after_an_outage() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let config = tokio_postgres::Config::from_str(&url).unwrap();
    let (Some(tokio_postgres::config::Host::Tcp(host)), Some(port)) =
        (config.get_hosts().first(), config.get_ports().first())
    else {
        eprintln!("note: skipping the outage test: DATABASE_URL is not a TCP host and port");
        return;
    };
    let upstream: SocketAddr = tokio::net::lookup_host((host.as_str(), *port))
        .await
        .unwrap()
        .next()
        .unwrap();
    if config.get_password().is_some() {
        eprintln!("note: skipping the outage test: it does not forward passwords");
        return;
    }
    let mut proxy = Proxy::start(upstream, 0).await;
    let proxied_url = format!(
        "postgres://{}@127.0.0.1:{}/{}?connect_timeout=2",
        config.get_user().unwrap_or("postgres"),
        proxy.port,
        config.get_dbname().unwrap_or("postgres")
    );
    let store = TestStore::open_via(&proxied_url, &url, &fresh_schema()).await;
    let scope = scope();
    let first = claim_req(&record_id(&scope, "before"), T0, RecordLimits::UNLIMITED);
    assert_eq!(store.claim(&first).await.unwrap(), ClaimOutcome::Claimed);

    proxy.stop();
    let during = claim_req(&record_id(&scope, "during"), T0, RecordLimits::UNLIMITED);
    for _ in 0..3 {
        let started = Instant::now();
        let err = store.claim(&during).await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let err = store.get(&first.id, T0).await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
    }

    proxy = Proxy::start(upstream, proxy.port).await;
    assert_eq!(store.claim(&during).await.unwrap(), ClaimOutcome::Claimed);
    assert!(store.get(&first.id, T0).await.unwrap().is_some());
    drop(proxy);
}

/// A TCP forwarder to the database that can be stopped (listener closed, connections cut).
struct Proxy {
    port: u16,
    accept: JoinHandle<()>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: SocketAddr, port: u16) -> Self {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket
            .bind(SocketAddr::from(([127, 0, 0, 1], port)))
            .unwrap();
        let listener = socket.listen(64).unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(Mutex::new(Vec::new()));
        let tracked = connections.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let forward = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                tracked.lock().unwrap().push(forward);
            }
        });
        Self {
            port,
            accept,
            connections,
        }
    }

    fn stop(&self) {
        self.accept.abort();
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}
