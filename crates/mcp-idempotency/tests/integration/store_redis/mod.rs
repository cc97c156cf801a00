//! The shared store test suite on the Redis store, plus outage, encoding and expiry checks, and a
//! rolling upgrade (`upgrade`: instances with and without tool policies on one store).
//!
//! Runs against `REDIS_URL` (default `redis://127.0.0.1:6379`), each store under a fresh random key
//! prefix so the checks never see each other's records. If that server cannot be reached the
//! checks fail when `CI=true`; otherwise they print a note and end without checking anything. The outage
//! check runs its own `redis-server` on a free port and never touches the shared server.

mod batches;
#[cfg(feature = "embedded")]
mod upgrade;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_idempotency::fingerprint::fingerprint;
use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, QuotaExceeded, RecordLimits, RedisStore,
    Store, StoreError,
};
use mcp_idempotency::{
    FencingToken, IdempotencyKey, Outcome, RecordId, RecordState, Scope, Timestamp,
};

const T0: Timestamp = Timestamp::from_millis(1_800_000_000_000);
const HOUR: Duration = Duration::from_secs(3600);

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci.eq_ignore_ascii_case("true") || ci == "1")
}

fn random_prefix() -> String {
    format!("mcp-idem-test-{:016x}", rand::random::<u64>())
}

/// A store on the shared server under a fresh prefix, or `None` (with a note) when the server is
/// unreachable outside CI.
async fn shared_store() -> Option<(RedisStore, String)> {
    let url = redis_url();
    let prefix = random_prefix();
    match RedisStore::open_with_prefix(&url, &prefix).await {
        Ok(store) => Some((store, prefix)),
        Err(err) if in_ci() => {
            panic!("CI=true but the Redis server of REDIS_URL cannot be used: {err}")
        }
        Err(err) => {
            eprintln!(
                "NOTE: skipping a Redis store check: {err} (set REDIS_URL, or CI=true to fail)"
            );
            None
        }
    }
}

mod suite {
    use super::*;

    mcp_idempotency::store_test_suite!(|| async {
        shared_store()
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

fn claim_req(id: &RecordId, now: Timestamp) -> ClaimRequest {
    ClaimRequest {
        trace: None,
        id: id.clone(),
        fingerprint: fingerprint("charge", Some(r#"{"amount":1}"#)).expect("valid arguments"),
        tool_name: "charge".into(),
        owner: FencingToken::random(),
        now,
        lease_expires_at: now.saturating_add(Duration::from_secs(30)),
        expires_at: now.saturating_add(HOUR),
        limits: RecordLimits::UNLIMITED,
    }
}

fn later(t: Timestamp, secs: u64) -> Timestamp {
    t.saturating_add(Duration::from_secs(secs))
}

async fn raw_connection() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .expect("REDIS_URL parses")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection to REDIS_URL")
}

/// Every key of the store with this prefix. SCAN in steps rather than one KEYS, which blocks a
/// server that holds many other keys long enough to time out.
async fn keys_under(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> Vec<String> {
    let pattern = format!("{{{prefix}}}:*");
    let mut keys = Vec::new();
    let mut cursor = 0_u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .expect("SCAN");
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys.dedup();
    keys
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_startup_error() {
    let port = free_port();
    let url = format!("redis://admin:s3cret@127.0.0.1:{port}/0");
    let started = Instant::now();
    let err = RedisStore::open(&url)
        .await
        .expect_err("nothing listens there");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert!(err.is_unavailable(), "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains(&format!("127.0.0.1:{port}")), "{shown}");
    assert!(!shown.contains("s3cret"), "{shown}");

    let err = RedisStore::open("redis://").await.expect_err("no host");
    assert!(matches!(err, StoreError::InvalidUrl { .. }), "{err:?}");
    let err = RedisStore::open_with_prefix(&url, "a{b}")
        .await
        .expect_err("braces in the prefix");
    assert!(matches!(err, StoreError::InvalidUrl { .. }), "{err:?}");
}

#[tokio::test]
async fn awkward_scopes_and_keys_never_collide() {
    let Some((store, prefix)) = shared_store().await else {
        return;
    };
    let ids = [
        record_id("a:b", "c", "k"),
        record_id("a", "b:c", "k"),
        record_id("a", "b", "c:k"),
        record_id("a", "b", "k"),
        record_id("{a}", "b", "k"),
        record_id("a", "{b}", "k"),
        record_id("a", "b", "{k}"),
        record_id("a}", "{b", "k"),
        record_id("a%3Ab", "c", "k"),
        record_id("пространство", "主体", "ключ 🔑"),
        record_id("a", "b", "k "),
        record_id("a", "b", "*"),
        record_id("a", "b", "%"),
    ];
    let mut owners = Vec::new();
    for id in &ids {
        let req = claim_req(id, T0);
        assert_eq!(
            store.claim(&req).await.unwrap(),
            ClaimOutcome::Claimed,
            "{id:?}"
        );
        owners.push(req.owner);
    }
    for (id, owner) in ids.iter().zip(&owners) {
        let record = store.get(id, T0).await.unwrap().expect("record");
        assert_eq!(&record.id, id);
        assert!(
            matches!(record.state, RecordState::InProgress { owner: o, .. } if o == *owner),
            "{id:?}"
        );
    }
    let first = CompleteRequest {
        id: ids[0].clone(),
        owner: owners[0],
        outcome: Outcome::Success("\"done\"".into()),
        completed_at: T0,
        expires_at: later(T0, 3600),
    };
    assert_eq!(store.complete(first).await.unwrap(), Fenced::Applied);
    assert_eq!(store.stats(T0).await.unwrap().completed, 1);
    assert_eq!(
        store.stats(T0).await.unwrap().in_progress,
        ids.len() as u64 - 1
    );

    // Every key of the store carries the one hash tag.
    let mut conn = raw_connection().await;
    let keys = keys_under(&mut conn, &prefix).await;
    assert!(keys.len() > ids.len(), "{keys:?}");
    let tag = format!("{{{prefix}}}:");
    for key in &keys {
        assert!(key.starts_with(&tag), "{key}");
        assert_eq!(key.matches('{').count(), 1, "{key}");
    }
}

#[tokio::test]
async fn record_keys_expire_with_their_retention_and_indexes_outlive_them() {
    let Some((store, prefix)) = shared_store().await else {
        return;
    };
    let id = record_id("ns", "p", "k");
    let req = claim_req(&id, T0);
    store.claim(&req).await.unwrap();
    let mut conn = raw_connection().await;
    let keys = keys_under(&mut conn, &prefix).await;
    assert_eq!(keys.len(), 4, "{keys:?}");
    let ttl_conn = conn.clone();
    let ttl = |key: String| {
        let mut conn = ttl_conn.clone();
        async move {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            ttl
        }
    };
    let record_key = keys.iter().find(|k| k.contains(":r:")).unwrap().clone();
    let record_ttl = ttl(record_key.clone()).await;
    // One hour of retention by the caller's clock plus the grace period, whatever the server's
    // clock says.
    let hour = HOUR.as_millis() as i64;
    assert!(
        record_ttl > hour && record_ttl <= hour + 300_000,
        "{record_ttl}"
    );
    for key in &keys {
        let key_ttl = ttl(key.clone()).await;
        assert!(key_ttl >= record_ttl - 1000, "{key}");
        // An index outlives its latest record by at most an hour (its slack).
        assert!(
            key_ttl <= record_ttl + hour + 1000,
            "{key}: {key_ttl} vs {record_ttl}"
        );
    }

    // Renewing past the retention window pushes the key's expiry back as much.
    let lease = later(T0, 7200);
    assert_eq!(
        store.renew(&id, req.owner, lease).await.unwrap(),
        Fenced::Applied
    );
    let renewed = ttl(record_key.clone()).await;
    assert!(
        renewed > record_ttl + hour - 5000,
        "{renewed} vs {record_ttl}"
    );
    for key in &keys {
        assert!(ttl(key.clone()).await >= renewed - 1000, "{key}");
    }

    // A retention beyond any sensible TTL makes the key persistent rather than wrap around.
    let forever = ClaimRequest {
        expires_at: Timestamp::from_millis(u64::MAX),
        ..claim_req(&record_id("ns", "p", "forever"), T0)
    };
    assert_eq!(store.claim(&forever).await.unwrap(), ClaimOutcome::Claimed);
    let record = store.get(&forever.id, T0).await.unwrap().unwrap();
    assert_eq!(record.expires_at, Timestamp::from_millis(u64::MAX));
    let keys = keys_under(&mut conn, &prefix).await;
    let forever_key = keys.iter().find(|k| k.ends_with(":forever")).unwrap();
    assert_eq!(ttl(forever_key.clone()).await, -1);
    assert_eq!(ttl(format!("{{{prefix}}}:all")).await, -1);
    // Persistent keys would outlive the test: remove them.
    let _: u64 = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .expect("DEL");
}

#[tokio::test]
async fn a_refused_claim_purges_expired_records() {
    let Some((store, _)) = shared_store().await else {
        return;
    };
    let limits = RecordLimits {
        max_records_per_scope: 1,
        max_records_total: u64::MAX,
    };
    let short = ClaimRequest {
        limits,
        expires_at: later(T0, 10),
        ..claim_req(&record_id("ns", "p", "short"), T0)
    };
    assert_eq!(store.claim(&short).await.unwrap(), ClaimOutcome::Claimed);
    let now = later(T0, 20);
    let next = ClaimRequest {
        limits,
        ..claim_req(&record_id("ns", "p", "next"), now)
    };
    assert_eq!(store.claim(&next).await.unwrap(), ClaimOutcome::Claimed);
    assert_eq!(store.stats(now).await.unwrap().expired, 1);
    let refused = ClaimRequest {
        limits,
        ..claim_req(&record_id("ns", "p", "refused"), now)
    };
    assert_eq!(
        store.claim(&refused).await.unwrap(),
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 1 })
    );
    let stats = store.stats(now).await.unwrap();
    assert_eq!((stats.in_progress, stats.expired), (1, 0));
    assert_eq!(store.purge_expired(now).await.unwrap(), 0);
}

#[tokio::test]
async fn a_corrupt_record_is_reported_as_corrupt() {
    let Some((store, prefix)) = shared_store().await else {
        return;
    };
    let id = record_id("ns", "p", "k");
    store.claim(&claim_req(&id, T0)).await.unwrap();
    let mut conn = raw_connection().await;
    let record_key = format!("{{{prefix}}}:r:ns:p:k");
    let _: () = redis::cmd("HSET")
        .arg(&record_key)
        .arg("fp")
        .arg("short")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = store.get(&id, T0).await.expect_err("corrupt");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    let err = store.claim(&claim_req(&id, T0)).await.expect_err("corrupt");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
}

/// A `redis-server` of our own on 127.0.0.1, killed when dropped.
struct PrivateServer {
    child: Child,
}

impl PrivateServer {
    fn start(port: u16) -> Option<Self> {
        Self::start_in(port, &std::env::temp_dir(), &[])
    }

    /// A server on `port` keeping its files (a replica's copy, if any) in `dir`, with `extra`
    /// arguments.
    fn start_in(port: u16, dir: &Path, extra: &[&str]) -> Option<Self> {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        match child {
            Ok(child) => Some(Self { child }),
            Err(err) if in_ci() => panic!("CI=true but redis-server cannot be started: {err}"),
            Err(err) => {
                eprintln!(
                    "NOTE: skipping a check on a private redis-server: cannot start it: {err}"
                );
                None
            }
        }
    }

    fn stop(mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

async fn wait_until_up(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let up = async {
            let client = redis::Client::open(url).ok()?;
            let mut conn = client.get_multiplexed_async_connection().await.ok()?;
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .ok()
        };
        if up.await.is_some() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "redis-server at {url} did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `redis-server` of the check's own on a free port, and a store on it.
struct Private {
    server: PrivateServer,
    store: RedisStore,
    port: u16,
    url: String,
}

/// Starts a [`Private`] server, or `None` (with a note) when redis-server cannot start outside CI.
async fn private_store() -> Option<Private> {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let server = PrivateServer::start(port)?;
    wait_until_up(&url).await;
    let store = RedisStore::open_with_prefix(&url, &random_prefix())
        .await
        .expect("open");
    Some(Private {
        server,
        store,
        port,
        url,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_works_after_the_server_lost_its_scripts() {
    // A private server: `SCRIPT FLUSH` on the shared one would touch every other check's scripts.
    let Some(Private {
        server: _running,
        store,
        url,
        ..
    }) = private_store().await
    else {
        return;
    };
    let mut conn = redis::Client::open(url.as_str())
        .expect("url parses")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    // As after a restart: every script's EVALSHA answers NOSCRIPT until it is loaded again.
    let flush = || redis::cmd("SCRIPT").arg("FLUSH").to_owned();
    let run = record_id("noscript", "p", "k");
    let _: () = flush().query_async(&mut conn).await.expect("SCRIPT FLUSH");
    let claim = claim_req(&run, T0);
    assert_eq!(store.claim(&claim).await.unwrap(), ClaimOutcome::Claimed);
    let _: () = flush().query_async(&mut conn).await.expect("SCRIPT FLUSH");
    let done = CompleteRequest {
        id: run.clone(),
        owner: claim.owner,
        outcome: Outcome::Success("\"done\"".into()),
        completed_at: T0,
        expires_at: later(T0, 60),
    };
    assert_eq!(store.complete(done).await.unwrap(), Fenced::Applied);
    let _: () = flush().query_async(&mut conn).await.expect("SCRIPT FLUSH");
    let listed = store.list(&Default::default(), T0, 10).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].state,
        RecordState::Completed {
            outcome: Outcome::Success("\"done\"".into()),
            completed_at: T0
        }
    );
    let _: () = flush().query_async(&mut conn).await.expect("SCRIPT FLUSH");
    assert_eq!(store.purge_expired(later(T0, 61)).await.unwrap(), 1);
    let _: () = flush().query_async(&mut conn).await.expect("SCRIPT FLUSH");
    assert!(!store.delete(&run).await.unwrap(), "purged already");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_unavailable_and_the_store_recovers() {
    let Some(Private {
        server,
        store,
        port,
        url,
    }) = private_store().await
    else {
        return;
    };
    let scope = "outage";
    let first = claim_req(&record_id(scope, "p", "before"), T0);
    assert_eq!(store.claim(&first).await.unwrap(), ClaimOutcome::Claimed);

    server.stop();
    for attempt in 0..3 {
        let started = Instant::now();
        let req = claim_req(&record_id(scope, "p", &format!("during-{attempt}")), T0);
        let err = store.claim(&req).await.expect_err("server is down");
        assert!(err.is_unavailable(), "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(12),
            "took {:?}",
            started.elapsed()
        );
        let err = store.get(&first.id, T0).await.expect_err("server is down");
        assert!(err.is_unavailable(), "{err:?}");
    }
    let err = store.stats(T0).await.expect_err("server is down");
    assert!(err.is_unavailable(), "{err:?}");

    let _server = PrivateServer::start(port).expect("restart");
    wait_until_up(&url).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = claim_req(&record_id(scope, "p", "after"), T0);
    loop {
        match store.claim(&after).await {
            Ok(outcome) => {
                assert_eq!(outcome, ClaimOutcome::Claimed);
                break;
            }
            Err(err) => {
                assert!(err.is_unavailable(), "{err:?}");
                assert!(
                    Instant::now() < deadline,
                    "the store did not recover: {err}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    // The restarted server kept nothing (no persistence), and the store works normally on it.
    assert_eq!(store.get(&first.id, T0).await.unwrap(), None);
    assert_eq!(
        store
            .complete(CompleteRequest {
                id: after.id.clone(),
                owner: after.owner,
                outcome: Outcome::Success("1".into()),
                completed_at: T0,
                expires_at: later(T0, 60),
            })
            .await
            .unwrap(),
        Fenced::Applied
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_is_unavailable_not_a_hang() {
    let Some(Private { server, store, .. }) = private_store().await else {
        return;
    };
    let signal = |name: &str| {
        let status = Command::new("kill")
            .args([name, &server.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {name}");
    };
    // A stopped server keeps accepting connections but never answers.
    signal("-STOP");
    let started = Instant::now();
    let req = claim_req(&record_id("stopped", "p", "k"), T0);
    let err = store.claim(&req).await.expect_err("server is stopped");
    signal("-CONT");
    assert!(err.is_unavailable(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "took {:?}",
        started.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let next = claim_req(&record_id("stopped", "p", "next"), T0);
    while let Err(err) = store.claim(&next).await {
        assert!(
            Instant::now() < deadline,
            "the store did not recover: {err}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
