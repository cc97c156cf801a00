//! The PostgreSQL store: records shared by every gateway instance that points at one database.
//!
//! # Schema
//!
//! Four tables live in one schema (`public` unless the URL says `?schema=NAME` or the store is
//! opened with [`PostgresStore::open_in_schema`]), plus a version table (version 2):
//!
//! * `idem_records`: one row per `(namespace, principal, key)` (the primary key, `COLLATE "C"` so
//!   keys compare byte for byte), with the fingerprint (`bytea`, 32 bytes), the owner token
//!   (`bigint`, the `u64` cast bitwise) and lease while in progress, or the outcome kind and body
//!   (`text`, kept byte for byte) once completed, and the counter shard the record is counted in
//!   (`shard`, `0..16`). Times are the caller's milliseconds since the epoch (`bigint`), never the
//!   database clock. An index on `expires_at` serves purges.
//! * `idem_scope_shards` and `idem_total_shards`: how many records (live or expired but not yet
//!   purged) each scope and the whole store hold, split over 16 counter rows ("shards") per scope
//!   and 16 for the store, kept in step with `idem_records` by the same statements that insert and
//!   delete records, so quotas are checked without counting rows. A record is counted in the shard
//!   with the number stored in its row (for both counters), chosen when it is first inserted from a
//!   hash of its scope and key; releases, purges and replacements of expired records use the stored
//!   number, so decrements always hit the row that was incremented.
//! * `idem_shard_guard`: always empty. Its two `CHECK` constraints turn "a counter shard has no
//!   room" into an error that aborts the claiming statement (see below).
//!
//! # Counter shards and capacities
//!
//! Each shard row holds `records`, a `capacity` and the limit the capacities were computed for
//! (`capacity_limit`, `NULL` when they were never computed). The store keeps this invariant for
//! each counter (one scope, or the store), in every committed state:
//!
//! > all of the counter's rows carry the same `capacity_limit`; when it is some `L`, every row has
//! > `records <= capacity` and the capacities add up to at most `L`.
//!
//! Hence, while it holds, the counter holds at most `L` records.
//!
//! # Claims
//!
//! Claims run under READ COMMITTED. The common case is one statement (one round trip), which locks
//! one scope row and one store row, so claims counted in different shards (for two claims of
//! distinct keys, 15 times out of 16, even within one scope) neither wait for each other nor for
//! each other's commit:
//!
//! 1. `INSERT … ON CONFLICT (namespace, principal, key) DO UPDATE … WHERE <the existing record
//!    expired>`. PostgreSQL's arbiter index decides conflicts on the latest committed data (a
//!    concurrent inserter of the same key is waited for), so of N concurrent claims of one key
//!    exactly one inserts; the others either see its live row (no update, no row returned) or,
//!    when the row expired, lock it and replace it, again one at a time. `RETURNING (xmax = 0)`
//!    tells a fresh insert from the replacement of an expired record (a long-standing PostgreSQL
//!    behaviour rather than a documented one; the tests check the counters through replacements).
//!    A replacement keeps the record's shard and its place in the counters.
//! 2. Only for a fresh insert, the record's scope shard row and then its store shard row are
//!    incremented, each by an `UPDATE … WHERE capacity_limit = <the claim's limit> AND records <
//!    capacity`. The row is locked and the condition evaluated on its latest committed version (a
//!    concurrent writer is waited for), so the increment keeps `records <= capacity`.
//! 3. If either update found no room (or no row, or capacities computed for another limit), a row
//!    is inserted into `idem_shard_guard`, whose `CHECK` fails: the whole statement aborts, the
//!    insert and increment vanish, and the error names the counter. The claim then takes the
//!    exact path below for that counter.
//! 4. The statement returns either "claimed" or the existing live record read from its snapshot.
//!    In the rare case the snapshot predates the conflicting row (a concurrent claim of the same
//!    key committed after this statement started), it returns nothing and the claim is re-run.
//!
//! The exact path is one transaction: the record insert of step 1, then, for each counter that
//! refused (the other one gets the conditional increment of step 2), every shard row of the
//! counter is locked in shard order (an upsert of all 16 rows, which creates missing ones and
//! returns the latest committed values), the records are summed, and
//!
//! * if the sum is at least the claim's limit, the transaction is rolled back and the claim is
//!   refused (after one purge of expired records and one more try, as before);
//! * otherwise the record's shard is incremented and all capacities are recomputed for the
//!   claim's limit: each row gets its records plus an equal part of the spare room (`limit − sum`,
//!   the remainder going one each to the lowest shards).
//!
//! If a conditional increment of the exact path finds no room, the transaction is rolled back and
//! re-run with both counters on the exact path.
//!
//! # Quotas are exact
//!
//! A claim is admitted if and only if, at the moment it holds the counter rows it changes, the
//! counter holds fewer records than the claim's limit. Sharding never refuses a claim early (the
//! largest early refusal is zero records): a shard without room is not a refusal, it only sends
//! the claim to the exact path. So filling a scope or the store to exactly its limit with distinct
//! keys succeeds and the next claim is refused, whatever shards the keys hash to; limits below 16
//! work the same way (at most that many shards get capacity, the others' claims take the exact
//! path), and a limit of 0 refuses every new record.
//!
//! * the one-statement path admits only while its shard is below capacity, and by the invariant
//!   the other rows are at or below theirs, so the counter ends at or below the sum of the
//!   capacities, which is the claim's limit (the `capacity_limit` matched);
//! * the exact path holds all of the counter's rows, so its sum is the true count, and it admits
//!   exactly when that count is below the limit.
//!
//! The invariant holds in every committed state: a conditional increment keeps its row within
//! capacity; decrements only lower counts; capacities and `capacity_limit` are only written by the
//! exact path, for all rows of the counter at once, while it holds all of them, with capacities
//! summing to the limit and at least the counts; rows are only created by the exact path and only
//! deleted when a scope's rows are all empty (deleting a row removes capacity, never records).
//!
//! Costs: the first claim of a scope (whose rows do not exist yet), a claim whose shard used up its
//! capacity (the spare room is spread evenly again each time, so this happens mostly once the
//! counter is within a few times 16 records of its limit), and a claim whose limit differs from
//! the one the capacities were computed for (a changed configuration, or instances configured
//! differently, which then take turns recomputing) take the exact path: a transaction of four to
//! seven round trips, serialized with every other claim of that counter. Each scope with records
//! has 16 counter rows instead of 1; purges drop those of scopes left empty.
//!
//! # Locks and deadlocks
//!
//! Every statement and transaction takes row locks in one global order: records first, then scope
//! shard rows in `(namespace, principal, shard)` order, then store shard rows in shard order. The
//! one-statement claim, release and delete lock one record, one scope row, one store row; the
//! exact path locks one record, then one scope row or all 16 rows of one scope in shard order, then
//! one store row or all 16 in shard order (a conditional increment that found no room may leave its row
//! locked, so the transaction is rolled back before the counter is locked exactly); purges lock
//! records, then the scope rows they decrement and then the store rows, each sorted (`ORDER BY …
//! FOR UPDATE`); dropping empty scopes locks scope rows sorted. Since nobody waits for a lock
//! that comes earlier in the order than one it holds, these cannot deadlock each other (purges
//! also take turns on an advisory lock, since the records they delete are not sorted).
//!
//! # Upgrading from version 1
//!
//! Version 1 kept one counter row per scope and one for the store. Opening a version 1 schema
//! migrates it in one transaction under the migration advisory lock: existing records get shard 0
//! (a column with a default, so the table is not rewritten), each scope's count and the store's
//! count move to their shard 0 rows with no capacities (the first claims take the exact path and
//! compute them), and the old counter and guard tables are dropped. Instances still running the
//! previous version then fail their claims, releases and purges with an error (their statements
//! name the dropped tables, so they cannot corrupt the counters) until they are upgraded.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    ClientWrapper, Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime,
    TimeoutType,
};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use super::sql_list::{list_query, SqlParam};
use super::sql_row::{self, decode, sql_time, sql_token, ClaimColumns, RECORD_COLUMNS};
use super::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, QuotaExceeded, Store,
    StoreError, StoreFuture, StoreStats, TakeOverRequest,
};
use crate::record::{CorruptRecord, FencingToken, Record, RecordId};
use crate::time::Timestamp;

/// The schema version this build creates and understands.
const SCHEMA_VERSION: i32 = 2;

/// Counter rows per scope and for the whole store.
const SHARDS: i16 = 16;

/// The schema used when neither the URL nor the caller names one.
const DEFAULT_SCHEMA: &str = "public";

/// How long establishing one connection (TCP and startup) may take, unless the URL sets
/// `connect_timeout`.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one operation may take once it has a connection, and how long it may wait for a free
/// pooled connection.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections per store (per process).
const MAX_CONNECTIONS: usize = 16;

/// How often a claim is re-run because a concurrent claim of the same key committed after the
/// claim's snapshot. Each re-run needs another commit on that key; this bound is never reached in
/// practice.
const MAX_CLAIM_ATTEMPTS: usize = 8;

/// Most records one purge statement deletes.
const PURGE_BATCH: i64 = 10_000;

/// How often an operation aborted by the server (deadlock, serialization failure) is re-run.
const MAX_TRANSIENT_RETRIES: usize = 3;

/// The constraints of `idem_shard_guard`.
const TOTAL_SHARD_FULL: &str = "idem_total_shard_full";
const SCOPE_SHARD_FULL: &str = "idem_scope_shard_full";

/// Records in a PostgreSQL database, through a pool of connections.
///
/// Every operation is a single statement, atomic on its own, so any number of processes and
/// machines may share the database. Operations fail with [`StoreError::Unavailable`] within a
/// bounded time when the server cannot be reached (the connect timeout, 5 s unless the URL sets
/// `connect_timeout`, to open a connection; 10 s for a statement or to wait for a busy pool), and
/// the pool reconnects by itself once it is back.
///
/// A statement the client gave up on may still complete on the server, like a call whose process
/// crashed: a claim then stays in progress until its lease runs out. To have the server abort such
/// statements too, set a `statement_timeout` for the role or database, or in the URL with
/// `options=-c%20statement_timeout%3D10000`.
///
/// Quotas are exact, as with the other stores: a claim that would create a record is refused if
/// and only if its scope (or the store) already holds as many records as the limit it carries.
/// Counters are split in 16 shards so that claims of distinct keys do not wait for each other;
/// near a limit (or for the first claim of a scope) claims lock the whole counter instead (see
/// the module documentation).
///
/// Open one with [`PostgresStore::open`] (`postgres://user:password@host:port/db`, optionally
/// `?schema=NAME` and the parameters tokio-postgres takes, such as `connect_timeout` in seconds)
/// or [`PostgresStore::open_in_schema`]. TLS is not supported by this build.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    /// Where the store connects, without the password: for error messages.
    target: String,
    schema: String,
    sql: Sql,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.inner.target)
            .field("schema", &self.inner.schema)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to the database a `postgres://` URL names, creating or migrating the tables.
    ///
    /// The tables live in the schema named by the URL parameter `schema` (ASCII letters, digits and
    /// `_`), or in `public`. Fails with [`StoreError::InvalidUrl`] for a malformed URL and
    /// [`StoreError::Unavailable`] when the server cannot be reached; messages name the host and
    /// database, never the password.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let (url, schema) = split_schema_param(url)?;
        Self::connect(&url, schema.as_deref().unwrap_or(DEFAULT_SCHEMA)).await
    }

    /// Like [`PostgresStore::open`], with the tables in `schema` (created if missing), which wins
    /// over a `schema` URL parameter. Separate schemas keep separate sets of records in one
    /// database, e.g. one per test.
    pub async fn open_in_schema(url: &str, schema: &str) -> Result<Self, StoreError> {
        let (url, _) = split_schema_param(url)?;
        Self::connect(&url, schema).await
    }

    /// The schema the tables live in.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    async fn connect(url: &str, schema: &str) -> Result<Self, StoreError> {
        let invalid = |reason: String| StoreError::InvalidUrl {
            url: super::redact_password(url),
            reason,
        };
        validate_schema_name(schema).map_err(invalid)?;
        let mut config =
            tokio_postgres::Config::from_str(url).map_err(|err| invalid(explain(&err)))?;
        if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
            return Err(invalid("the URL names no host".into()));
        }
        if config.get_ssl_mode() == SslMode::Require {
            return Err(invalid(
                "sslmode=require is not supported: this build has no TLS support".into(),
            ));
        }
        let connect_timeout = *config
            .get_connect_timeout()
            .unwrap_or(&DEFAULT_CONNECT_TIMEOUT);
        config.connect_timeout(connect_timeout);
        if config.get_tcp_user_timeout().is_none() {
            // Data unacknowledged this long means the server is gone: drop the connection.
            config.tcp_user_timeout(OPERATION_TIMEOUT);
        }
        let target = describe(&config);

        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(MAX_CONNECTIONS)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(OPERATION_TIMEOUT))
            .create_timeout(Some(connect_timeout))
            .recycle_timeout(Some(connect_timeout))
            .build()
            .map_err(|err| StoreError::Backend {
                message: format!(
                    "cannot set up a connection pool for PostgreSQL at {target}: {err}"
                ),
                source: Some(Box::new(err)),
            })?;
        let mut client = pool.get().await.map_err(|err| pool_error(&target, err))?;
        let quoted = quote_ident(schema);
        let migrated =
            tokio::time::timeout(OPERATION_TIMEOUT, migrate(&mut client, schema, &quoted))
                .await
                .unwrap_or(Err(OpError::TimedOut("preparing the schema")));
        migrated.map_err(|err| match err {
            OpError::Pg(err) if is_connection_error(&err) => StoreError::Unavailable {
                message: format!(
                    "cannot connect to PostgreSQL at {target}: {}",
                    explain(&err)
                ),
                source: Some(Box::new(err)),
            },
            OpError::Pg(err) => StoreError::Backend {
                message: format!(
                    "cannot prepare schema {schema:?} in PostgreSQL at {target}: {}",
                    explain(&err)
                ),
                source: Some(Box::new(err)),
            },
            other => other.into_store_error(&target),
        })?;
        drop(client);
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                target,
                schema: schema.to_owned(),
                sql: Sql::new(&quoted),
            }),
        })
    }

    /// A pooled connection, or [`StoreError::Unavailable`] within the pool's timeouts.
    async fn connection(&self) -> Result<Object, StoreError> {
        self.inner
            .pool
            .get()
            .await
            .map_err(|err| pool_error(&self.inner.target, err))
    }

    /// Decides what to do with the result of one run of an operation on `client`: `None` to run
    /// it again (the server aborted it: deadlock or serialization failure, nothing was written),
    /// otherwise the answer. A connection that failed or timed out is closed instead of going
    /// back to the pool.
    fn settle<T>(
        &self,
        what: &'static str,
        client: Object,
        result: Result<T, OpError>,
        retries: &mut usize,
    ) -> Option<Result<T, StoreError>> {
        match result {
            Ok(value) => Some(Ok(value)),
            Err(err) if err.is_transient() && *retries < MAX_TRANSIENT_RETRIES => {
                *retries += 1;
                tracing::debug!(operation = what, error = %err, "PostgreSQL aborted the statement; retrying");
                None
            }
            Err(err) => {
                if err.breaks_connection() {
                    drop(Object::take(client));
                }
                Some(Err(err.into_store_error(&self.inner.target)))
            }
        }
    }
}

/// Runs `$body` (an expression using the connection `$client`) within [`OPERATION_TIMEOUT`] on a
/// pooled connection, through [`PostgresStore::settle`]. A macro rather than a function taking a
/// closure, because a closure borrowing the connection cannot be shown `Send` for every lifetime.
macro_rules! run {
    ($store:expr, $what:literal, |$client:ident| $body:expr) => {{
        let store: &PostgresStore = $store;
        let mut retries = 0;
        loop {
            #[allow(unused_mut)]
            let mut $client = store.connection().await?;
            let result = match tokio::time::timeout(OPERATION_TIMEOUT, async { $body }).await {
                Ok(result) => result,
                Err(_) => Err(OpError::TimedOut($what)),
            };
            if let Some(answer) = store.settle($what, $client, result, &mut retries) {
                break answer;
            }
        }
    }};
}

/// What went wrong inside one operation.
#[derive(Debug, thiserror::Error)]
enum OpError {
    #[error("{}", explain(.0))]
    Pg(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Corrupt(#[from] CorruptRecord),
    #[error("{0} took longer than {OPERATION_TIMEOUT:?}")]
    TimedOut(&'static str),
    #[error("the claim raced concurrent claims of the same key {MAX_CLAIM_ATTEMPTS} times")]
    KeptRacing,
    #[error("{0}")]
    Refused(String),
}

impl OpError {
    /// The server aborted the statement without applying it; running it again is safe.
    fn is_transient(&self) -> bool {
        matches!(self, Self::Pg(err) if matches!(
            err.code(),
            Some(code) if *code == SqlState::T_R_DEADLOCK_DETECTED
                || *code == SqlState::T_R_SERIALIZATION_FAILURE
        ))
    }

    /// The connection may be unusable (or stuck behind a statement that timed out).
    fn breaks_connection(&self) -> bool {
        match self {
            Self::Pg(err) => is_connection_error(err),
            Self::TimedOut(_) => true,
            _ => false,
        }
    }

    fn into_store_error(self, target: &str) -> StoreError {
        match self {
            Self::Pg(err) if is_connection_error(&err) => StoreError::Unavailable {
                message: format!("PostgreSQL at {target} is unavailable: {err}"),
                source: Some(Box::new(err)),
            },
            Self::Pg(err) => StoreError::Backend {
                message: format!("PostgreSQL at {target}: {err}"),
                source: Some(Box::new(err)),
            },
            Self::Corrupt(err) => StoreError::Corrupt(err),
            err @ Self::TimedOut(_) => StoreError::Unavailable {
                message: format!("PostgreSQL at {target} did not answer: {err}"),
                source: None,
            },
            err @ (Self::KeptRacing | Self::Refused(_)) => StoreError::Backend {
                message: format!("PostgreSQL at {target}: {err}"),
                source: None,
            },
        }
    }
}

/// Why getting a pooled connection failed, as [`StoreError::Unavailable`].
fn pool_error(target: &str, err: PoolError) -> StoreError {
    let why = match &err {
        PoolError::Backend(err) => format!("cannot connect: {}", explain(err)),
        PoolError::Timeout(TimeoutType::Wait) => format!(
            "all {MAX_CONNECTIONS} connections stayed busy for {}s",
            OPERATION_TIMEOUT.as_secs()
        ),
        PoolError::Timeout(TimeoutType::Create) => "connecting timed out".to_owned(),
        PoolError::Timeout(TimeoutType::Recycle) => {
            "checking a pooled connection timed out".to_owned()
        }
        other => explain(other),
    };
    StoreError::Unavailable {
        message: format!("PostgreSQL at {target} is unavailable: {why}"),
        source: Some(Box::new(err)),
    }
}

/// An error and its causes, `: `-separated (tokio-postgres errors show their cause only as a
/// source, e.g. "error connecting to server" without "Connection refused").
fn explain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Whether `err` means the server could not be reached or dropped the connection (as opposed to
/// answering a statement with an error).
fn is_connection_error(err: &tokio_postgres::Error) -> bool {
    let Some(code) = err.code() else {
        // No SQLSTATE: the client failed to talk to the server (I/O, closed connection, timeout).
        return true;
    };
    let code = code.code();
    // 08: connection exception; 53: insufficient resources (too many connections, disk full);
    // 57P0x: server shutting down or starting up; 57014: statement_timeout or cancel.
    code.starts_with("08") || code.starts_with("53") || code.starts_with("57P") || code == "57014"
}

/// The statements, with the schema name spliced in (quoted) once.
struct Sql {
    claim: String,
    insert_record: String,
    bump_scope: String,
    bump_total: String,
    lock_scope: String,
    lock_total: String,
    set_scope: String,
    set_total: String,
    get: String,
    complete: String,
    take_over: String,
    renew: String,
    release: String,
    delete: String,
    /// The quoted `schema.idem_records`, for the statements [`list_query`] builds.
    records: String,
    purge: String,
    drop_empty_scopes: String,
    stats: String,
}

/// Inserts a record, or replaces an expired one (keeping its shard), returning whether it was a
/// fresh insert; returns nothing when a live record holds the key. Parameters as for
/// [`Sql::claim`], with the shard as `$shard`.
fn insert_record(s: &str, shard: &str) -> String {
    format!(
        "INSERT INTO {s}.idem_records AS r (namespace, principal, key, fingerprint, tool_name,
            owner, lease_expires_at, outcome_kind, outcome_body, completed_at, created_at,
            expires_at, shard)
        VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, NULL, NULL, $8, $9, {shard})
        ON CONFLICT (namespace, principal, key) DO UPDATE SET
            fingerprint = EXCLUDED.fingerprint, tool_name = EXCLUDED.tool_name,
            owner = EXCLUDED.owner, lease_expires_at = EXCLUDED.lease_expires_at,
            outcome_kind = NULL, outcome_body = NULL, completed_at = NULL,
            created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
        WHERE r.expires_at <= $8
        RETURNING (r.xmax = 0) AS created"
    )
}

/// Deletes the record `$1, $2, $3` if `extra` (more conditions) holds, and uncounts it; returns how
/// many records it deleted. The totals update reads `scope_count` so that it runs (and locks)
/// after it.
fn counted_delete(s: &str, extra: &str) -> String {
    format!(
        "WITH del AS (
            DELETE FROM {s}.idem_records
            WHERE namespace = $1 AND principal = $2 AND key = $3 {extra} RETURNING shard
        ),
        scope_count AS (
            UPDATE {s}.idem_scope_shards AS c SET records = c.records - 1
            FROM del
            WHERE c.namespace = $1 AND c.principal = $2 AND c.shard = del.shard
            RETURNING c.records
        ),
        total_count AS (
            UPDATE {s}.idem_total_shards AS t SET records = t.records - 1
            FROM del, (SELECT count(*) FROM scope_count) AS after_scopes
            WHERE t.shard = del.shard
        )
        SELECT count(*) FROM del"
    )
}

/// Parameters of a statement built at run time.
type Params = Vec<Box<dyn ToSql + Sync + Send>>;

impl Sql {
    fn new(s: &str) -> Self {
        let key = "namespace = $1 AND principal = $2 AND key = $3";
        let last = SHARDS - 1;
        Self {
            // $1 namespace, $2 principal, $3 key, $4 fingerprint, $5 tool, $6 owner,
            // $7 lease_expires_at, $8 now, $9 expires_at, $10 scope limit, $11 total limit,
            // $12 shard. The total update reads `scope_count` so that it runs (and locks) after
            // it, and only when the scope had room.
            claim: format!(
                "WITH ins AS ({}),
                scope_count AS (
                    UPDATE {s}.idem_scope_shards AS c SET records = c.records + 1
                    FROM ins
                    WHERE ins.created AND c.namespace = $1 AND c.principal = $2 AND c.shard = $12
                        AND c.capacity_limit = $10::int8 AND c.records < c.capacity
                    RETURNING c.records
                ),
                total_count AS (
                    UPDATE {s}.idem_total_shards AS t SET records = t.records + 1
                    FROM (SELECT count(*) AS n FROM scope_count) AS after_scope
                    WHERE after_scope.n > 0 AND t.shard = $12
                        AND t.capacity_limit = $11::int8 AND t.records < t.capacity
                    RETURNING t.records
                ),
                guard AS (
                    INSERT INTO {s}.idem_shard_guard (scope_ok, total_ok)
                    SELECT EXISTS (SELECT 1 FROM scope_count),
                        EXISTS (SELECT 1 FROM total_count) OR NOT EXISTS (SELECT 1 FROM scope_count)
                    FROM ins WHERE ins.created AND NOT EXISTS (SELECT 1 FROM total_count)
                )
                SELECT true AS claimed, NULL::bytea, NULL::text, NULL::int8, NULL::int8,
                    NULL::text, NULL::text, NULL::int8, NULL::int8, NULL::int8
                FROM ins
                UNION ALL
                SELECT false, {RECORD_COLUMNS} FROM {s}.idem_records
                WHERE {key} AND expires_at > $8 AND NOT EXISTS (SELECT 1 FROM ins)",
                insert_record(s, "$12")
            ),
            // The exact path, statement by statement in one transaction. $1 to $9 as for
            // `claim`, $10 shard.
            insert_record: insert_record(s, "$10"),
            // $1 namespace, $2 principal, $3 shard, $4 limit.
            bump_scope: format!(
                "UPDATE {s}.idem_scope_shards SET records = records + 1
                 WHERE namespace = $1 AND principal = $2 AND shard = $3
                    AND capacity_limit = $4 AND records < capacity"
            ),
            // $1 shard, $2 limit.
            bump_total: format!(
                "UPDATE {s}.idem_total_shards SET records = records + 1
                 WHERE shard = $1 AND capacity_limit = $2 AND records < capacity"
            ),
            // Locks (creating any missing) all shard rows of a scope, in shard order, and returns
            // their latest committed counts. $1 namespace, $2 principal.
            lock_scope: format!(
                "INSERT INTO {s}.idem_scope_shards AS c
                    (namespace, principal, shard, records, capacity, capacity_limit)
                SELECT $1, $2, g::int2, 0, 0, NULL::int8 FROM generate_series(0, {last}) AS g
                ORDER BY g
                ON CONFLICT (namespace, principal, shard) DO UPDATE SET records = c.records
                RETURNING c.shard, c.records"
            ),
            lock_total: format!(
                "INSERT INTO {s}.idem_total_shards AS t (shard, records, capacity, capacity_limit)
                SELECT g::int2, 0, 0, NULL::int8 FROM generate_series(0, {last}) AS g
                ORDER BY g
                ON CONFLICT (shard) DO UPDATE SET records = t.records
                RETURNING t.shard, t.records"
            ),
            // Counts one more record in a shard and sets every row's capacity (by shard, from an
            // array) for a limit. $1 namespace, $2 principal, $3 shard, $4 capacities, $5 limit.
            set_scope: format!(
                "UPDATE {s}.idem_scope_shards
                 SET records = records + (shard = $3)::int, capacity = ($4::int8[])[shard + 1],
                    capacity_limit = $5
                 WHERE namespace = $1 AND principal = $2"
            ),
            // $1 shard, $2 capacities, $3 limit.
            set_total: format!(
                "UPDATE {s}.idem_total_shards
                 SET records = records + (shard = $1)::int, capacity = ($2::int8[])[shard + 1],
                    capacity_limit = $3"
            ),
            get: format!(
                "SELECT {RECORD_COLUMNS} FROM {s}.idem_records WHERE {key} AND expires_at > $4"
            ),
            complete: format!(
                "UPDATE {s}.idem_records SET owner = NULL, lease_expires_at = NULL,
                    outcome_kind = $5, outcome_body = $6, completed_at = $7, expires_at = $8
                 WHERE {key} AND owner = $4"
            ),
            take_over: format!(
                "UPDATE {s}.idem_records SET owner = $5, lease_expires_at = $6, expires_at = $7
                 WHERE {key} AND owner = $4 AND lease_expires_at <= $8 AND expires_at > $8"
            ),
            renew: format!(
                "UPDATE {s}.idem_records
                 SET lease_expires_at = $5, expires_at = GREATEST(expires_at, $5)
                 WHERE {key} AND owner = $4"
            ),
            release: counted_delete(s, "AND owner = $4"),
            delete: counted_delete(s, ""),
            records: format!("{s}.idem_records"),
            // $1 now, $2 advisory lock key: purges of one schema take turns, so two of them never
            // delete the same records in different orders and deadlock. $3: at most this many
            // records. Counter rows are locked sorted (scope rows, then store rows) before they
            // are decremented, in the order claims lock them.
            purge: format!(
                "WITH purge_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock($2::int8)),
                del AS (
                    DELETE FROM {s}.idem_records AS r
                    USING (
                        SELECT namespace, principal, key FROM {s}.idem_records
                        WHERE expires_at <= $1 AND EXISTS (SELECT 1 FROM purge_lock)
                        ORDER BY expires_at LIMIT $3
                    ) AS old
                    WHERE r.namespace = old.namespace AND r.principal = old.principal
                        AND r.key = old.key AND r.expires_at <= $1
                    RETURNING r.namespace, r.principal, r.shard
                ),
                per_scope AS (
                    SELECT namespace, principal, shard, count(*) AS n FROM del
                    GROUP BY namespace, principal, shard
                ),
                scope_locked AS MATERIALIZED (
                    SELECT c.namespace, c.principal, c.shard, p.n
                    FROM {s}.idem_scope_shards AS c
                    JOIN per_scope AS p ON c.namespace = p.namespace
                        AND c.principal = p.principal AND c.shard = p.shard
                    ORDER BY c.namespace, c.principal, c.shard
                    FOR UPDATE OF c
                ),
                scope_count AS (
                    UPDATE {s}.idem_scope_shards AS c SET records = c.records - l.n
                    FROM scope_locked AS l
                    WHERE c.namespace = l.namespace AND c.principal = l.principal
                        AND c.shard = l.shard
                    RETURNING c.records
                ),
                per_shard AS (SELECT shard, count(*) AS n FROM del GROUP BY shard),
                total_locked AS MATERIALIZED (
                    SELECT t.shard, p.n
                    FROM {s}.idem_total_shards AS t
                    JOIN per_shard AS p ON t.shard = p.shard,
                        (SELECT count(*) FROM scope_count) AS after_scopes
                    ORDER BY t.shard
                    FOR UPDATE OF t
                ),
                total_count AS (
                    UPDATE {s}.idem_total_shards AS t SET records = t.records - l.n
                    FROM total_locked AS l
                    WHERE t.shard = l.shard
                )
                SELECT count(*) FROM del"
            ),
            // Scopes left without records (by purges or by releases) lose their counter rows,
            // locked sorted; a row counted in since is kept (the condition is checked again on
            // its latest version), and a claim recreates missing rows.
            drop_empty_scopes: format!(
                "WITH empty AS (
                    SELECT namespace, principal FROM {s}.idem_scope_shards
                    GROUP BY namespace, principal HAVING max(records) <= 0
                ),
                locked AS MATERIALIZED (
                    SELECT c.namespace, c.principal, c.shard FROM {s}.idem_scope_shards AS c
                    JOIN empty AS e ON c.namespace = e.namespace AND c.principal = e.principal
                    WHERE c.records <= 0
                    ORDER BY c.namespace, c.principal, c.shard
                    FOR UPDATE OF c
                )
                DELETE FROM {s}.idem_scope_shards AS c USING locked AS l
                WHERE c.namespace = l.namespace AND c.principal = l.principal
                    AND c.shard = l.shard AND c.records <= 0"
            ),
            stats: format!(
                "SELECT count(*) FILTER (WHERE expires_at > $1 AND owner IS NOT NULL),
                    count(*) FILTER (WHERE expires_at > $1 AND owner IS NULL),
                    count(*) FILTER (WHERE expires_at <= $1)
                 FROM {s}.idem_records"
            ),
        }
    }
}

/// The version 2 tables (creating only what is missing).
fn schema_ddl(s: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {s}.idem_records (
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
            shard            smallint NOT NULL DEFAULT 0,
            PRIMARY KEY (namespace, principal, key),
            CHECK ((owner IS NULL) = (outcome_kind IS NOT NULL))
        );
        CREATE INDEX IF NOT EXISTS idem_records_expires_at ON {s}.idem_records (expires_at);
        {}",
        counter_ddl(s)
    )
}

/// The version 2 counter and guard tables, with the store's shard rows.
fn counter_ddl(s: &str) -> String {
    let last = SHARDS - 1;
    format!(
        "CREATE TABLE IF NOT EXISTS {s}.idem_scope_shards (
            namespace      text COLLATE \"C\" NOT NULL,
            principal      text COLLATE \"C\" NOT NULL,
            shard          smallint NOT NULL CHECK (shard BETWEEN 0 AND {last}),
            records        bigint NOT NULL,
            capacity       bigint NOT NULL,
            capacity_limit bigint,
            PRIMARY KEY (namespace, principal, shard)
        );
        CREATE TABLE IF NOT EXISTS {s}.idem_total_shards (
            shard          smallint PRIMARY KEY CHECK (shard BETWEEN 0 AND {last}),
            records        bigint NOT NULL,
            capacity       bigint NOT NULL,
            capacity_limit bigint
        );
        INSERT INTO {s}.idem_total_shards (shard, records, capacity, capacity_limit)
        SELECT g, 0, 0, NULL FROM generate_series(0, {last}) AS g
        ON CONFLICT (shard) DO NOTHING;
        CREATE TABLE IF NOT EXISTS {s}.idem_shard_guard (
            total_ok boolean CONSTRAINT {TOTAL_SHARD_FULL} CHECK (total_ok),
            scope_ok boolean CONSTRAINT {SCOPE_SHARD_FULL} CHECK (scope_ok)
        );"
    )
}

/// Version 1 to 2: records get shard 0 (a default, so the table is not rewritten), the counts move
/// to shard 0 rows without capacities, and the old counter and guard tables go.
fn migrate_v1_ddl(s: &str) -> String {
    format!(
        "ALTER TABLE {s}.idem_records ADD COLUMN IF NOT EXISTS shard smallint NOT NULL DEFAULT 0;
        {}
        INSERT INTO {s}.idem_scope_shards
            (namespace, principal, shard, records, capacity, capacity_limit)
        SELECT namespace, principal, 0, records, 0, NULL FROM {s}.idem_scope_counts
        WHERE records <> 0;
        UPDATE {s}.idem_total_shards
        SET records = coalesce((SELECT records FROM {s}.idem_totals WHERE id = 1), 0)
        WHERE shard = 0;
        DROP TABLE {s}.idem_scope_counts, {s}.idem_totals, {s}.idem_quota_guard;",
        counter_ddl(s)
    )
}

/// Creates or upgrades the tables, holding a transaction-level advisory lock so that processes
/// opening the store at the same time take turns. Refuses a schema newer than this build.
async fn migrate(client: &mut Object, schema: &str, quoted: &str) -> Result<(), OpError> {
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1)",
        &[&lock_key("migrate", schema)],
    )
    .await?;
    let encoding: String = tx
        .query_one("SELECT current_setting('server_encoding')", &[])
        .await?
        .try_get(0)?;
    if !matches!(encoding.as_str(), "UTF8" | "SQL_ASCII") {
        return Err(OpError::Refused(format!(
            "the database encoding is {encoding}; the store needs UTF8 to keep outcomes byte for byte"
        )));
    }
    // Look before creating anything: a role without CREATE privileges may use tables that are
    // already up to date.
    let version_table = format!("{quoted}.idem_schema_version");
    let has_version_table: bool = tx
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&version_table])
        .await?
        .try_get(0)?;
    let version: i32 = if has_version_table {
        tx.query_opt(
            &format!("SELECT version FROM {version_table} WHERE id = 1"),
            &[],
        )
        .await?
        .map(|row| row.try_get(0))
        .transpose()?
        .unwrap_or(0)
    } else {
        0
    };
    if version > SCHEMA_VERSION {
        return Err(OpError::Refused(format!(
            "schema {schema:?} has version {version}, newer than this build understands \
             ({SCHEMA_VERSION}); upgrade mcp-idem or use another schema"
        )));
    }
    if version < SCHEMA_VERSION {
        let schema_exists: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
                &[&schema],
            )
            .await?
            .try_get(0)?;
        if !schema_exists {
            tx.batch_execute(&format!("CREATE SCHEMA {quoted}")).await?;
        }
        let tables = if version == 1 {
            migrate_v1_ddl(quoted)
        } else {
            schema_ddl(quoted)
        };
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {version_table} (
                id      smallint PRIMARY KEY CHECK (id = 1),
                version integer  NOT NULL
            );
            {tables}"
        ))
        .await?;
        tx.execute(
            &format!(
                "INSERT INTO {version_table} (id, version) VALUES (1, $1)
                 ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version"
            ),
            &[&SCHEMA_VERSION],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// A 64-bit advisory lock key for `purpose` on `schema` (FNV-1a), so that stores in different
/// schemas do not wait for each other.
fn lock_key(purpose: &str, schema: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in "mcp-idem:"
        .bytes()
        .chain(purpose.bytes())
        .chain(std::iter::once(b':'))
        .chain(schema.bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// Schema names are limited to ASCII letters, digits and `_` (and quoted anyway), at most 63
/// bytes, PostgreSQL's identifier limit.
fn validate_schema_name(schema: &str) -> Result<(), String> {
    let valid = !schema.is_empty()
        && schema.len() <= 63
        && !schema.starts_with(|c: char| c.is_ascii_digit())
        && schema
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "invalid schema name {schema:?}: use 1 to 63 ASCII letters, digits and _, not starting with a digit"
        ))
    }
}

fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Removes a `schema=NAME` parameter (which tokio-postgres would reject) from a URL's query.
fn split_schema_param(url: &str) -> Result<(String, Option<String>), StoreError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut schema = None;
    let mut kept = Vec::new();
    for param in query.split('&') {
        match param.strip_prefix("schema=") {
            Some(name) => {
                if schema.replace(name.to_owned()).is_some() {
                    return Err(StoreError::InvalidUrl {
                        url: super::redact_password(url),
                        reason: "the schema parameter is given twice".into(),
                    });
                }
            }
            None => kept.push(param),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, schema))
}

/// `postgres://user@host:port/db` for the first host (and `+N` for more), without the password.
fn describe(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        #[cfg(unix)]
        Some(Host::Unix(path)) => path.display().to_string(),
        None => config
            .get_hostaddrs()
            .first()
            .map_or_else(|| "?".to_owned(), ToString::to_string),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config
        .get_user()
        .map(|user| format!("{user}@"))
        .unwrap_or_default();
    let db = config.get_dbname().or(config.get_user()).unwrap_or("");
    let more = config.get_hosts().len().max(config.get_hostaddrs().len());
    let more = if more > 1 {
        format!(" (+{} more hosts)", more - 1)
    } else {
        String::new()
    };
    format!("postgres://{user}{host}:{port}/{db}{more}")
}

fn sql_limit(limit: u64) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// The two counters a new record is counted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counter {
    Scope,
    Total,
}

/// Which counters a claim locks entirely (the exact path) instead of incrementing only the
/// record's shard when it has room.
#[derive(Clone, Copy, Debug, Default)]
struct Exact {
    scope: bool,
    total: bool,
}

/// What one run of the claim statement (or of the exact path) found.
enum Attempt {
    Done(ClaimOutcome),
    /// A concurrent claim of the key committed after this statement's snapshot, or the exact path
    /// found a live record: run the one-statement claim again.
    Raced,
    /// The record's shard of this counter had no room (or its capacities were computed for
    /// another limit): take the exact path for it.
    ShardFull(Counter),
    OverQuota(QuotaExceeded),
}

/// The counter shard of a record: FNV-1a over its scope and key, modulo [`SHARDS`]. Any choice
/// would be correct, since the shard is stored with the record; hashing spreads claims evenly and
/// sends retries of one claim to the same rows.
fn shard_of(id: &RecordId) -> i16 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    // 0xff never occurs in UTF-8, so it separates the parts unambiguously.
    for byte in id
        .scope
        .namespace()
        .bytes()
        .chain([0xff])
        .chain(id.scope.principal().bytes())
        .chain([0xff])
        .chain(id.key.as_str().bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    // Fold the high bits in: FNV's low bits mix poorly.
    let folded = hash ^ (hash >> 32);
    i16::try_from(folded % SHARDS as u64).expect("a shard number fits an i16")
}

/// New capacities of a counter whose shards hold `counts` (indexed by shard), once one more record
/// is counted in `shard` under `limit`; `None` if the counter has no room for it. Every shard gets
/// its count plus an equal part of the spare room, the remainder going one each to the lowest
/// shards: capacities are at least the counts and add up to `limit`. (Counts are never negative;
/// were one, it would be taken as 0, which only errs towards refusing.)
fn capacities(counts: &[i64], shard: usize, limit: i64) -> Option<Vec<i64>> {
    let counts: Vec<i128> = counts.iter().map(|&c| i128::from(c.max(0))).collect();
    let spare = i128::from(limit) - counts.iter().sum::<i128>() - 1;
    if spare < 0 {
        return None;
    }
    let n = counts.len() as i128;
    counts
        .iter()
        .enumerate()
        .map(|(i, &count)| {
            let own = count + i128::from(i == shard);
            let extra = spare / n + i128::from((i as i128) < spare % n);
            // Each is at most the sum of all, `limit`, so it fits.
            i64::try_from(own + extra).ok()
        })
        .collect()
}

/// The claim's columns as parameters `$1` to `$9` of the claim and insert statements.
fn claim_params<'a>(c: &'a ClaimColumns<'a>) -> Vec<&'a (dyn ToSql + Sync)> {
    vec![
        &c.namespace,
        &c.principal,
        &c.key,
        &c.fingerprint,
        &c.tool_name,
        &c.owner,
        &c.lease_expires_at,
        &c.now,
        &c.expires_at,
    ]
}

async fn claim_once(
    client: &ClientWrapper,
    sql: &Sql,
    req: &ClaimRequest,
    shard: i16,
) -> Result<Attempt, OpError> {
    let stmt = client.prepare_cached(&sql.claim).await?;
    let record = ClaimColumns::of(req);
    let limits = (
        sql_limit(req.limits.max_records_per_scope),
        sql_limit(req.limits.max_records_total),
    );
    let mut params = claim_params(&record);
    params.extend([&limits.0 as &(dyn ToSql + Sync), &limits.1, &shard]);
    let rows = match client.query(&stmt, &params).await {
        Ok(rows) => rows,
        Err(err) => {
            return match shard_refusal(&err) {
                Some(counter) => Ok(Attempt::ShardFull(counter)),
                None => Err(err.into()),
            }
        }
    };
    let Some(row) = rows.first() else {
        return Ok(Attempt::Raced);
    };
    let claimed: bool = row
        .try_get(0)
        .map_err(|_| CorruptRecord(format!("unreadable claim result for {:?}", req.id.key)))?;
    Ok(Attempt::Done(if claimed {
        ClaimOutcome::Claimed
    } else {
        ClaimOutcome::Existing(decode(&req.id, row, 1)?)
    }))
}

/// The exact path: one transaction that inserts the record, then counts it in each counter, either
/// in its shard if that has room (as the one-statement claim does) or, for the counters in
/// `exact`, after locking all of the counter's shard rows and checking their sum.
async fn claim_exact(
    client: &mut ClientWrapper,
    sql: &Sql,
    req: &ClaimRequest,
    shard: i16,
    exact: Exact,
) -> Result<Attempt, OpError> {
    let tx = client.transaction().await?;
    let stmt = tx.prepare_cached(&sql.insert_record).await?;
    let record = ClaimColumns::of(req);
    let mut params = claim_params(&record);
    params.push(&shard);
    let Some(row) = tx.query_opt(&stmt, &params).await? else {
        // A live record holds the key: the one-statement claim returns it.
        tx.rollback().await?;
        return Ok(Attempt::Raced);
    };
    let created: bool = row
        .try_get(0)
        .map_err(|_| CorruptRecord(format!("unreadable claim result for {:?}", req.id.key)))?;
    if !created {
        // An expired record was replaced: it stays counted where it was.
        tx.commit().await?;
        return Ok(Attempt::Done(ClaimOutcome::Claimed));
    }
    let (namespace, principal) = (req.id.scope.namespace(), req.id.scope.principal());
    let scope_limit = sql_limit(req.limits.max_records_per_scope);
    let total_limit = sql_limit(req.limits.max_records_total);

    // The scope counter, then the store's (the lock order).
    if exact.scope {
        let stmt = tx.prepare_cached(&sql.lock_scope).await?;
        let rows = tx.query(&stmt, &[&namespace, &principal]).await?;
        let Some(caps) = capacities(&shard_counts(&rows)?, shard_index(shard), scope_limit) else {
            tx.rollback().await?;
            return Ok(Attempt::OverQuota(QuotaExceeded::Scope {
                limit: req.limits.max_records_per_scope,
            }));
        };
        let stmt = tx.prepare_cached(&sql.set_scope).await?;
        tx.execute(
            &stmt,
            &[&namespace, &principal, &shard, &caps, &scope_limit],
        )
        .await?;
    } else {
        let stmt = tx.prepare_cached(&sql.bump_scope).await?;
        if tx
            .execute(&stmt, &[&namespace, &principal, &shard, &scope_limit])
            .await?
            == 0
        {
            // Rolled back before locking the whole counter: the failed update may hold the row.
            tx.rollback().await?;
            return Ok(Attempt::ShardFull(Counter::Scope));
        }
    }
    if exact.total {
        let stmt = tx.prepare_cached(&sql.lock_total).await?;
        let rows = tx.query(&stmt, &[]).await?;
        let Some(caps) = capacities(&shard_counts(&rows)?, shard_index(shard), total_limit) else {
            tx.rollback().await?;
            return Ok(Attempt::OverQuota(QuotaExceeded::Total {
                limit: req.limits.max_records_total,
            }));
        };
        let stmt = tx.prepare_cached(&sql.set_total).await?;
        tx.execute(&stmt, &[&shard, &caps, &total_limit]).await?;
    } else {
        let stmt = tx.prepare_cached(&sql.bump_total).await?;
        if tx.execute(&stmt, &[&shard, &total_limit]).await? == 0 {
            tx.rollback().await?;
            return Ok(Attempt::ShardFull(Counter::Total));
        }
    }
    tx.commit().await?;
    Ok(Attempt::Done(ClaimOutcome::Claimed))
}

fn shard_index(shard: i16) -> usize {
    usize::try_from(shard).unwrap_or(0)
}

/// The counts of all [`SHARDS`] rows of a counter, from `(shard, records)` rows.
fn shard_counts(rows: &[Row]) -> Result<Vec<i64>, OpError> {
    let mut counts = vec![0; SHARDS as usize];
    for row in rows {
        let (shard, records): (i16, i64) = row
            .try_get(0)
            .and_then(|shard| Ok((shard, row.try_get(1)?)))
            .map_err(|err| CorruptRecord(format!("unreadable counter: {}", explain(&err))))?;
        let slot = usize::try_from(shard)
            .ok()
            .and_then(|i| counts.get_mut(i))
            .ok_or_else(|| CorruptRecord(format!("counter shard {shard} out of range")))?;
        *slot = records;
    }
    Ok(counts)
}

/// Which counter's shard the claim statement's guard found without room, if that is what `err`
/// is.
fn shard_refusal(err: &tokio_postgres::Error) -> Option<Counter> {
    let db = err.as_db_error()?;
    if *db.code() != SqlState::CHECK_VIOLATION || db.table() != Some("idem_shard_guard") {
        return None;
    }
    match db.constraint()? {
        TOTAL_SHARD_FULL => Some(Counter::Total),
        SCOPE_SHARD_FULL => Some(Counter::Scope),
        _ => None,
    }
}

/// Deletes up to [`PURGE_BATCH`] expired records in one statement; returns how many.
async fn purge(client: &ClientWrapper, inner: &Inner, now: Timestamp) -> Result<u64, OpError> {
    query_count(
        client,
        &inner.sql.purge,
        &[
            &sql_time(now),
            &lock_key("purge", &inner.schema),
            &PURGE_BATCH,
        ],
    )
    .await
}

/// Runs a fenced `UPDATE` and reports whether it touched the record.
async fn fenced_update(
    client: &ClientWrapper,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Fenced, OpError> {
    let stmt = client.prepare_cached(sql).await?;
    let changed = client.execute(&stmt, params).await?;
    Ok(if changed == 1 {
        Fenced::Applied
    } else {
        Fenced::NotOwner
    })
}

/// Runs a statement that returns one count (or, for a plain `DELETE`, counts the rows it deleted).
async fn query_count(
    client: &ClientWrapper,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, OpError> {
    let stmt = client.prepare_cached(sql).await?;
    if stmt.columns().is_empty() {
        return Ok(client.execute(&stmt, params).await?);
    }
    let row = client.query_one(&stmt, params).await?;
    count(&row, 0)
}

fn count(row: &Row, i: usize) -> Result<u64, OpError> {
    let n: i64 = row
        .try_get(i)
        .map_err(|err| CorruptRecord(format!("unreadable count: {}", explain(&err))))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

async fn claim(
    client: &mut ClientWrapper,
    inner: &Inner,
    req: &ClaimRequest,
) -> Result<ClaimOutcome, OpError> {
    let shard = shard_of(&req.id);
    let mut exact = Exact::default();
    let mut purged = false;
    let mut races = 0;
    // Ends: `exact` only grows between races, a fully exact attempt never answers `ShardFull`,
    // and there is at most one purge and `MAX_CLAIM_ATTEMPTS` races.
    loop {
        let attempt = if exact.scope || exact.total {
            claim_exact(client, &inner.sql, req, shard, exact).await?
        } else {
            claim_once(client, &inner.sql, req, shard).await?
        };
        match attempt {
            Attempt::Done(outcome) => return Ok(outcome),
            Attempt::Raced => {
                races += 1;
                if races == MAX_CLAIM_ATTEMPTS {
                    return Err(OpError::KeptRacing);
                }
                exact = Exact::default();
            }
            Attempt::ShardFull(Counter::Scope) => exact.scope = true,
            Attempt::ShardFull(Counter::Total) => exact.total = true,
            Attempt::OverQuota(quota) => {
                if purged || purge(client, inner, req.now).await? == 0 {
                    return Ok(ClaimOutcome::QuotaExceeded(quota));
                }
                purged = true;
            }
        }
    }
}

impl Store for PostgresStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async move {
            run!(self, "claim", |client| claim(&mut client, &self.inner, req)
                .await)
        })
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        Box::pin(async move {
            let kind = req.outcome.kind().as_str();
            let body = req.outcome.body();
            run!(self, "complete", |client| {
                fenced_update(
                    &client,
                    &self.inner.sql.complete,
                    &[
                        &req.id.scope.namespace(),
                        &req.id.scope.principal(),
                        &req.id.key.as_str(),
                        &sql_token(req.owner),
                        &kind,
                        &body.as_ref(),
                        &sql_time(req.completed_at),
                        &sql_time(req.expires_at),
                    ],
                )
                .await
            })
        })
    }

    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            run!(self, "take-over", |client| {
                fenced_update(
                    &client,
                    &self.inner.sql.take_over,
                    &[
                        &req.id.scope.namespace(),
                        &req.id.scope.principal(),
                        &req.id.key.as_str(),
                        &sql_token(req.previous_owner),
                        &sql_token(req.new_owner),
                        &sql_time(req.lease_expires_at),
                        &sql_time(req.expires_at),
                        &sql_time(req.now),
                    ],
                )
                .await
            })
        })
    }

    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease_expires_at: Timestamp,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            run!(self, "renew", |client| {
                fenced_update(
                    &client,
                    &self.inner.sql.renew,
                    &[
                        &id.scope.namespace(),
                        &id.scope.principal(),
                        &id.key.as_str(),
                        &sql_token(owner),
                        &sql_time(lease_expires_at),
                    ],
                )
                .await
            })
        })
    }

    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            run!(self, "release", |client| {
                let released = query_count(
                    &client,
                    &self.inner.sql.release,
                    &[
                        &id.scope.namespace(),
                        &id.scope.principal(),
                        &id.key.as_str(),
                        &sql_token(owner),
                    ],
                )
                .await;
                released.map(|n| {
                    if n == 1 {
                        Fenced::Applied
                    } else {
                        Fenced::NotOwner
                    }
                })
            })
        })
    }

    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            run!(self, "get", |client| get(&client, &self.inner.sql, id, now)
                .await)
        })
    }

    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            // In batches, each its own statement, so that a large backlog neither holds locks
            // for long nor runs into the operation timeout.
            let mut purged = 0;
            loop {
                let batch = run!(self, "purge", |client| purge(&client, &self.inner, now)
                    .await)?;
                purged += batch;
                if batch < PURGE_BATCH as u64 {
                    break;
                }
            }
            // Scopes left without records (by purges or by releases) lose their counter row; a
            // claim recreates it.
            run!(self, "purge", |client| {
                query_count(&client, &self.inner.sql.drop_empty_scopes, &[]).await
            })?;
            Ok(purged)
        })
    }

    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        Box::pin(async move {
            run!(self, "stats", |client| stats(&client, &self.inner.sql, now)
                .await)
        })
    }

    fn list<'a>(
        &'a self,
        filter: &'a ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Record>> {
        Box::pin(async move {
            let select = sql_row::listed_select(&self.inner.sql.records);
            let (text, params) = list_query(&select, filter, now, limit, |n| format!("${n}"));
            let params: Params = params
                .into_iter()
                .map(|param| -> Box<dyn ToSql + Sync + Send> {
                    match param {
                        SqlParam::Text(text) => Box::new(text),
                        SqlParam::Integer(n) => Box::new(n),
                    }
                })
                .collect();
            run!(self, "list", |client| list(&client, &text, &params).await)
        })
    }

    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            run!(self, "delete", |client| {
                query_count(
                    &client,
                    &self.inner.sql.delete,
                    &[
                        &id.scope.namespace(),
                        &id.scope.principal(),
                        &id.key.as_str(),
                    ],
                )
                .await
                .map(|deleted| deleted == 1)
            })
        })
    }
}

async fn list(client: &ClientWrapper, text: &str, params: &Params) -> Result<Vec<Record>, OpError> {
    let stmt = client.prepare_cached(text).await?;
    let params: Vec<&(dyn ToSql + Sync)> = params
        .iter()
        .map(|param| &**param as &(dyn ToSql + Sync))
        .collect();
    let rows = client.query(&stmt, &params).await?;
    let records: Result<Vec<Record>, CorruptRecord> =
        rows.iter().map(sql_row::decode_listed).collect();
    Ok(records?)
}

async fn get(
    client: &ClientWrapper,
    sql: &Sql,
    id: &RecordId,
    now: Timestamp,
) -> Result<Option<Record>, OpError> {
    let stmt = client.prepare_cached(&sql.get).await?;
    let row = client
        .query_opt(
            &stmt,
            &[
                &id.scope.namespace(),
                &id.scope.principal(),
                &id.key.as_str(),
                &sql_time(now),
            ],
        )
        .await?;
    Ok(row.map(|row| decode(id, &row, 0)).transpose()?)
}

async fn stats(client: &ClientWrapper, sql: &Sql, now: Timestamp) -> Result<StoreStats, OpError> {
    let stmt = client.prepare_cached(&sql.stats).await?;
    let row = client.query_one(&stmt, &[&sql_time(now)]).await?;
    Ok(StoreStats {
        in_progress: count(&row, 0)?,
        completed: count(&row, 1)?,
        expired: count(&row, 2)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Scope;

    /// The store shows URLs through the one redactor, [`super::super::redact_password`].
    #[test]
    fn redacts_passwords() {
        for (url, shown) in [
            (
                "postgres://me:s3cret@db:5432/app",
                "postgres://me:***@db:5432/app",
            ),
            (
                "postgres://me:p@ss@db/app?x=1",
                "postgres://me:***@db/app?x=1",
            ),
            (
                "postgres://db/app?user=me&password=s3cret&x=1",
                "postgres://db/app?user=me&password=***&x=1",
            ),
            ("postgres://me@db/app", "postgres://me@db/app"),
        ] {
            assert_eq!(super::super::redact_password(url), shown);
        }
    }

    #[test]
    fn splits_the_schema_parameter() {
        assert_eq!(
            split_schema_param("postgres://h/db?schema=s1&connect_timeout=2").unwrap(),
            (
                "postgres://h/db?connect_timeout=2".to_owned(),
                Some("s1".to_owned())
            )
        );
        assert_eq!(
            split_schema_param("postgres://h/db?schema=s1").unwrap(),
            ("postgres://h/db".to_owned(), Some("s1".to_owned()))
        );
        assert_eq!(
            split_schema_param("postgres://h/db").unwrap(),
            ("postgres://h/db".to_owned(), None)
        );
        assert!(split_schema_param("postgres://h/db?schema=a&schema=b").is_err());
    }

    #[test]
    fn validates_schema_names() {
        for good in ["public", "idem_test_01", "_x", "A"] {
            assert!(validate_schema_name(good).is_ok(), "{good}");
        }
        for bad in ["", "1abc", "a-b", "a\"b", "a b", "é", &"x".repeat(64)] {
            assert!(validate_schema_name(bad).is_err(), "{bad}");
        }
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn describes_without_password() {
        let config: tokio_postgres::Config =
            "postgres://me:s3cret@db.example:6543/app".parse().unwrap();
        assert_eq!(describe(&config), "postgres://me@db.example:6543/app");
    }

    #[test]
    fn capacities_add_up_to_the_limit_and_cover_the_counts() {
        let n = SHARDS as usize;
        let mut counts = vec![0; n];
        counts[3] = 5;
        counts[7] = 2;
        for limit in [8, 9, 16, 17, 100, 10_000, i64::MAX] {
            let caps = capacities(&counts, 7, limit).unwrap();
            assert_eq!(
                caps.iter().map(|&c| i128::from(c)).sum::<i128>(),
                limit.into()
            );
            for (i, (&cap, &count)) in caps.iter().zip(&counts).enumerate() {
                assert!(cap >= count + i64::from(i == 7), "{limit}: shard {i}");
                assert!(cap <= count + i64::from(i == 7) + (limit - 8) / 16 + 1);
            }
        }
        // 7 held, room for exactly one more under a limit of 8.
        assert_eq!(capacities(&counts, 0, 7), None);
        assert!(capacities(&counts, 0, 8).is_some());
        // A limit of 0 refuses everything; tiny limits work on any shard.
        assert_eq!(capacities(&vec![0; n], 5, 0), None);
        let caps = capacities(&vec![0; n], 15, 1).unwrap();
        assert_eq!(caps[15], 1);
        assert_eq!(caps.iter().sum::<i64>(), 1);
        // Negative counts (never written) are taken as 0.
        let mut odd = vec![0; n];
        odd[0] = -5;
        assert_eq!(capacities(&odd, 1, 1).unwrap().iter().sum::<i64>(), 1);
    }

    #[test]
    fn shards_are_stable_and_spread() {
        let scope = Scope::new("ns", "principal");
        let id = |key: &str| RecordId {
            scope: scope.clone(),
            key: crate::key::IdempotencyKey::new(key, 1024).unwrap(),
        };
        let mut used = [0_u32; SHARDS as usize];
        for i in 0..1600 {
            let shard = shard_of(&id(&format!("key-{i}")));
            assert_eq!(shard, shard_of(&id(&format!("key-{i}"))));
            used[shard_index(shard)] += 1;
        }
        assert!(used.iter().all(|&n| (50..=150).contains(&n)), "{used:?}");
    }

    #[test]
    fn lock_keys_differ_by_purpose_and_schema() {
        assert_ne!(lock_key("purge", "a"), lock_key("migrate", "a"));
        assert_ne!(lock_key("purge", "a"), lock_key("purge", "b"));
        assert_eq!(lock_key("purge", "a"), lock_key("purge", "a"));
    }
}
