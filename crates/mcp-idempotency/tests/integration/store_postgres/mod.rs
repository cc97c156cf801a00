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

use crate::at_once::claim_all;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const T0: Timestamp = Timestamp::from_millis(1_800_000_000_000);

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// `DATABASE_URL` if its server answers; `None` (after a note) if not and not on CI.
async fn reachable_url() -> Option<String> {
    reachable(
        "DATABASE_URL",
        &database_url(),
        "start PostgreSQL or point DATABASE_URL at one",
    )
    .await
}

/// `url` (from the variable `var`) if a server answers there, connecting with `tls`; `None`
/// (after a note) if not and not on CI, where it panics instead, saying `hint`.
async fn reachable_with<T>(var: &str, url: &str, hint: &str, tls: T) -> Option<String>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket> + Send,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as tokio_postgres::tls::TlsConnect<tokio_postgres::Socket>>::Future: Send,
{
    let probe = async {
        let (client, connection) = tokio_postgres::connect(url, tls).await?;
        let driver = tokio::spawn(connection);
        client.simple_query("SELECT 1").await?;
        drop(client);
        let _ = driver.await;
        Ok::<_, tokio_postgres::Error>(())
    };
    let error = match tokio::time::timeout(Duration::from_secs(10), probe).await {
        Ok(Ok(())) => return Some(url.to_owned()),
        Ok(Err(err)) => format!("{err}: {:?}", std::error::Error::source(&err)),
        Err(_) => "no answer within 10 s".to_owned(),
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "PostgreSQL at {var} ({}) is unreachable: {error}. CI=true, so this fails instead of \
             skipping; {hint}",
            redacted(url)
        );
    }
    eprintln!(
        "note: skipping PostgreSQL tests: {var} ({}) is unreachable ({error}); {hint}",
        redacted(url)
    );
    None
}

async fn reachable(var: &str, url: &str, hint: &str) -> Option<String> {
    reachable_with(var, url, hint, NoTls).await
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

/// The rolling upgrade ([`crate::rolling_upgrade`]) on one schema, through two pools.
#[cfg(feature = "embedded")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_and_new_instances_share_a_store() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let old = TestStore::open(&url).await;
    let new = PostgresStore::open_in_schema(&url, &old.schema)
        .await
        .expect("a second pool on the schema");
    crate::rolling_upgrade::old_and_new_instances_share(Arc::new(old), Arc::new(new)).await;
}

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
        trace: None,
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

mod batches;
mod connections;
mod counters;
mod pgbouncer;
mod races;
mod schema;
mod tls;
