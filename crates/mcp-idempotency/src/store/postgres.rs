//! The PostgreSQL store: records shared by every gateway instance that points at one database.
//!
//! # Schema
//!
//! Four tables live in one schema (`public` unless the URL says `?schema=NAME` or the store is
//! opened with [`PostgresStore::open_in_schema`]), plus a version table:
//!
//! * `idem_records`: one row per `(namespace, principal, key)` (the primary key, `COLLATE "C"` so
//!   keys compare byte for byte), with the fingerprint (`bytea`, 32 bytes), the owner token
//!   (`bigint`, the `u64` cast bitwise) and lease while in progress, or the outcome kind and body
//!   (`text`, kept byte for byte) once completed. Times are the caller's milliseconds since the
//!   epoch (`bigint`), never the database clock. An index on `expires_at` serves purges.
//! * `idem_scope_counts` and `idem_totals`: how many records (live or expired but not yet purged)
//!   each scope and the whole store hold, kept in step with `idem_records` by the same statements
//!   that insert and delete records, so quotas are checked without counting rows.
//! * `idem_quota_guard`: always empty. Its two `CHECK` constraints turn "a counter went past its
//!   limit" into an error that aborts the claiming statement (see below).
//!
//! # Claims
//!
//! A claim is one statement (one round trip in the common case) under READ COMMITTED:
//!
//! 1. `INSERT … ON CONFLICT (namespace, principal, key) DO UPDATE … WHERE <the existing record
//!    expired>`. PostgreSQL's arbiter index decides conflicts on the latest committed data (a
//!    concurrent inserter of the same key is waited for), so of N concurrent claims of one key
//!    exactly one inserts; the others either see its live row (no update, no row returned) or,
//!    when the row expired, lock it and replace it, again one at a time. `RETURNING (xmax = 0)`
//!    tells a fresh insert from the replacement of an expired record (a long-standing PostgreSQL
//!    behaviour rather than a documented one; the tests check the counters through replacements).
//! 2. Only for a fresh insert, the scope counter (an upsert) and then the total counter are
//!    incremented. Both are `DO UPDATE SET records = records + 1` upserts, which lock the counter
//!    row and add to its latest committed value, so concurrent claims serialize on the counters.
//! 3. If either new count exceeds its limit, a row is inserted into `idem_quota_guard`, whose
//!    `CHECK` fails: the whole statement aborts, the insert and increments vanish, and the error
//!    names the quota. Because the check reads the value the statement itself wrote under the row
//!    lock, two claims racing for the last slot cannot both pass: the second one waits for the
//!    first to commit and then sees its increment.
//! 4. The statement returns either "claimed" or the existing live record read from its snapshot.
//!    In the rare case the snapshot predates the conflicting row (a concurrent claim of the same
//!    key committed after this statement started), it returns nothing and the claim is re-run.
//!
//! Locks are always taken in the order record, scope counter, total counter (also by release and
//! purge), so these statements cannot deadlock each other. When a claim is over quota, expired
//! records are purged (a second statement) and the claim is tried once more.

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

use super::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, QuotaExceeded, RecordLimits, Store,
    StoreError, StoreFuture, StoreStats, TakeOverRequest,
};
use crate::fingerprint::Fingerprint;
use crate::record::{CorruptRecord, FencingToken, Outcome, Record, RecordId, RecordState};
use crate::time::Timestamp;

/// The schema version this build creates and understands.
const SCHEMA_VERSION: i32 = 1;

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

/// The constraints of `idem_quota_guard`.
const TOTAL_QUOTA_CONSTRAINT: &str = "idem_total_quota_exceeded";
const SCOPE_QUOTA_CONSTRAINT: &str = "idem_scope_quota_exceeded";

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
            url: redact_url(url),
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
            let $client = store.connection().await?;
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
    get: String,
    complete: String,
    take_over: String,
    renew: String,
    release: String,
    purge: String,
    drop_empty_scopes: String,
    stats: String,
}

/// Columns of a record, in the order [`decode`] reads them.
const RECORD_COLUMNS: &str = "fingerprint, tool_name, owner, lease_expires_at, outcome_kind, \
                              outcome_body, completed_at, created_at, expires_at";

impl Sql {
    fn new(s: &str) -> Self {
        let key = "namespace = $1 AND principal = $2 AND key = $3";
        Self {
            // $1 namespace, $2 principal, $3 key, $4 fingerprint, $5 tool, $6 owner,
            // $7 lease_expires_at, $8 now, $9 expires_at, $10 scope limit, $11 total limit.
            claim: format!(
                "WITH ins AS (
                    INSERT INTO {s}.idem_records AS r (namespace, principal, key, fingerprint,
                        tool_name, owner, lease_expires_at, outcome_kind, outcome_body,
                        completed_at, created_at, expires_at)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, NULL, NULL, $8, $9)
                    ON CONFLICT (namespace, principal, key) DO UPDATE SET
                        fingerprint = EXCLUDED.fingerprint, tool_name = EXCLUDED.tool_name,
                        owner = EXCLUDED.owner, lease_expires_at = EXCLUDED.lease_expires_at,
                        outcome_kind = NULL, outcome_body = NULL, completed_at = NULL,
                        created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
                    WHERE r.expires_at <= $8
                    RETURNING (r.xmax = 0) AS created
                ),
                scope_count AS (
                    INSERT INTO {s}.idem_scope_counts AS c (namespace, principal, records)
                    SELECT $1, $2, 1 FROM ins WHERE ins.created
                    ON CONFLICT (namespace, principal) DO UPDATE SET records = c.records + 1
                    RETURNING c.records
                ),
                total_count AS (
                    INSERT INTO {s}.idem_totals AS t (id, records)
                    SELECT 1, 1 FROM scope_count
                    ON CONFLICT (id) DO UPDATE SET records = t.records + 1
                    RETURNING t.records
                ),
                quota AS (
                    INSERT INTO {s}.idem_quota_guard (total_ok, scope_ok)
                    SELECT t.records <= $11::int8, s.records <= $10::int8 OR t.records > $11::int8
                    FROM scope_count AS s, total_count AS t
                    WHERE s.records > $10::int8 OR t.records > $11::int8
                )
                SELECT true AS claimed, NULL::bytea, NULL::text, NULL::int8, NULL::int8,
                    NULL::text, NULL::text, NULL::int8, NULL::int8, NULL::int8
                FROM ins
                UNION ALL
                SELECT false, {RECORD_COLUMNS} FROM {s}.idem_records
                WHERE {key} AND expires_at > $8 AND NOT EXISTS (SELECT 1 FROM ins)"
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
            // The totals update reads `scope_count` so that it runs (and locks) after it.
            release: format!(
                "WITH del AS (
                    DELETE FROM {s}.idem_records WHERE {key} AND owner = $4 RETURNING 1
                ),
                scope_count AS (
                    UPDATE {s}.idem_scope_counts AS c SET records = c.records - d.n
                    FROM (SELECT count(*) AS n FROM del) AS d
                    WHERE c.namespace = $1 AND c.principal = $2 AND d.n > 0
                    RETURNING c.records
                ),
                total_count AS (
                    UPDATE {s}.idem_totals AS t SET records = t.records - d.n
                    FROM (SELECT count(*) AS n FROM del) AS d,
                        (SELECT count(*) FROM scope_count) AS after_scopes
                    WHERE t.id = 1 AND d.n > 0
                )
                SELECT count(*) FROM del"
            ),
            // $1 now, $2 advisory lock key: purges of one schema take turns, so two of them never
            // delete the same rows in different orders and deadlock. $3: at most this many records.
            // delete the same rows in different orders and deadlock.
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
                    RETURNING r.namespace, r.principal
                ),
                per_scope AS (
                    SELECT namespace, principal, count(*) AS n FROM del GROUP BY namespace, principal
                ),
                scope_count AS (
                    UPDATE {s}.idem_scope_counts AS c SET records = c.records - p.n
                    FROM per_scope AS p
                    WHERE c.namespace = p.namespace AND c.principal = p.principal
                    RETURNING c.records
                ),
                total_count AS (
                    UPDATE {s}.idem_totals AS t SET records = t.records - d.n
                    FROM (SELECT count(*) AS n FROM del) AS d,
                        (SELECT count(*) FROM scope_count) AS after_scopes
                    WHERE t.id = 1 AND d.n > 0
                )
                SELECT count(*) FROM del"
            ),
            drop_empty_scopes: format!("DELETE FROM {s}.idem_scope_counts WHERE records <= 0"),
            stats: format!(
                "SELECT count(*) FILTER (WHERE expires_at > $1 AND owner IS NOT NULL),
                    count(*) FILTER (WHERE expires_at > $1 AND owner IS NULL),
                    count(*) FILTER (WHERE expires_at <= $1)
                 FROM {s}.idem_records"
            ),
        }
    }
}

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
            total_ok boolean CONSTRAINT {TOTAL_QUOTA_CONSTRAINT} CHECK (total_ok),
            scope_ok boolean CONSTRAINT {SCOPE_QUOTA_CONSTRAINT} CHECK (scope_ok)
        );"
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
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {version_table} (
                id      smallint PRIMARY KEY CHECK (id = 1),
                version integer  NOT NULL
            );
            {}",
            schema_ddl(quoted)
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
                        url: redact_url(url),
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

/// The URL with any password replaced by `***`: for error messages. Errs on the side of hiding
/// too much when the URL is malformed.
fn redact_url(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(scheme_end) = out.find("://").map(|i| i + 3) {
        let rest = &out[scheme_end..];
        if let (Some(colon), Some(at)) = (rest.find(':'), rest.rfind('@')) {
            if colon < at {
                out.replace_range(scheme_end + colon + 1..scheme_end + at, "***");
            }
        }
    }
    let mut search_from = 0;
    while let Some(found) = out[search_from..].find("password=") {
        let start = search_from + found + "password=".len();
        let end = out[start..].find('&').map_or(out.len(), |i| start + i);
        out.replace_range(start..end, "***");
        search_from = start + 3;
    }
    out
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

/// Times are stored as signed milliseconds; instants past year 292 million are clamped.
fn sql_time(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

fn sql_limit(limit: u64) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Tokens are `u64`; stored as `bigint`, bit for bit.
fn sql_token(token: FencingToken) -> i64 {
    i64::from_ne_bytes(token.as_u64().to_ne_bytes())
}

/// Reads a record from `row`'s columns `at..at + 9` ([`RECORD_COLUMNS`]).
fn decode(id: &RecordId, row: &Row, at: usize) -> Result<Record, CorruptRecord> {
    let corrupt = |what: &str| CorruptRecord(format!("{what} of {:?}", id.key));
    let fingerprint: &[u8] = row
        .try_get::<_, Option<&[u8]>>(at)
        .ok()
        .flatten()
        .ok_or_else(|| corrupt("unreadable fingerprint"))?;
    let fingerprint = Fingerprint::from_bytes(
        fingerprint
            .try_into()
            .map_err(|_| corrupt("fingerprint length"))?,
    );
    let text = |i: usize| -> Result<Option<String>, CorruptRecord> {
        row.try_get(at + i)
            .map_err(|_| corrupt("unreadable text column"))
    };
    let int = |i: usize| -> Result<Option<i64>, CorruptRecord> {
        row.try_get(at + i)
            .map_err(|_| corrupt("unreadable integer column"))
    };
    let time = |i: usize| -> Result<Timestamp, CorruptRecord> {
        let millis = int(i)?.ok_or_else(|| corrupt("missing time"))?;
        u64::try_from(millis)
            .map(Timestamp::from_millis)
            .map_err(|_| corrupt("negative time"))
    };
    let state = match (int(2)?, text(4)?) {
        (Some(owner), None) => RecordState::InProgress {
            owner: FencingToken::from_u64(u64::from_ne_bytes(owner.to_ne_bytes())),
            lease_expires_at: time(3)?,
        },
        (None, Some(kind)) => RecordState::Completed {
            outcome: Outcome::from_parts(
                kind.parse()?,
                text(5)?.ok_or_else(|| corrupt("missing outcome body"))?,
            )?,
            completed_at: time(6)?,
        },
        _ => return Err(corrupt("state columns")),
    };
    Ok(Record {
        id: id.clone(),
        fingerprint,
        tool_name: text(1)?.ok_or_else(|| corrupt("missing tool name"))?,
        state,
        created_at: time(7)?,
        expires_at: time(8)?,
    })
}

/// What one run of the claim statement found.
enum Attempt {
    Done(ClaimOutcome),
    /// A concurrent claim of the key committed after this statement's snapshot: run it again.
    Raced,
    OverQuota(QuotaExceeded),
}

async fn claim_once(
    client: &ClientWrapper,
    sql: &Sql,
    req: &ClaimRequest,
) -> Result<Attempt, OpError> {
    let stmt = client.prepare_cached(&sql.claim).await?;
    let params: [&(dyn ToSql + Sync); 11] = [
        &req.id.scope.namespace(),
        &req.id.scope.principal(),
        &req.id.key.as_str(),
        &&req.fingerprint.as_bytes()[..],
        &&*req.tool_name,
        &sql_token(req.owner),
        &sql_time(req.lease_expires_at),
        &sql_time(req.now),
        &sql_time(req.expires_at),
        &sql_limit(req.limits.max_records_per_scope),
        &sql_limit(req.limits.max_records_total),
    ];
    let rows = match client.query(&stmt, &params).await {
        Ok(rows) => rows,
        Err(err) => {
            return match quota_violation(&err, req.limits) {
                Some(quota) => Ok(Attempt::OverQuota(quota)),
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

/// Which quota the claim statement's guard refused, if that is what `err` is.
fn quota_violation(err: &tokio_postgres::Error, limits: RecordLimits) -> Option<QuotaExceeded> {
    let db = err.as_db_error()?;
    if *db.code() != SqlState::CHECK_VIOLATION || db.table() != Some("idem_quota_guard") {
        return None;
    }
    match db.constraint()? {
        TOTAL_QUOTA_CONSTRAINT => Some(QuotaExceeded::Total {
            limit: limits.max_records_total,
        }),
        SCOPE_QUOTA_CONSTRAINT => Some(QuotaExceeded::Scope {
            limit: limits.max_records_per_scope,
        }),
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
    client: &ClientWrapper,
    inner: &Inner,
    req: &ClaimRequest,
) -> Result<ClaimOutcome, OpError> {
    let mut purged = false;
    for _ in 0..MAX_CLAIM_ATTEMPTS {
        match claim_once(client, &inner.sql, req).await? {
            Attempt::Done(outcome) => return Ok(outcome),
            Attempt::Raced => {}
            Attempt::OverQuota(quota) => {
                if purged || purge(client, inner, req.now).await? == 0 {
                    return Ok(ClaimOutcome::QuotaExceeded(quota));
                }
                purged = true;
            }
        }
    }
    Err(OpError::KeptRacing)
}

impl Store for PostgresStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async move {
            run!(self, "claim", |client| claim(&client, &self.inner, req)
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
            assert_eq!(redact_url(url), shown);
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
    fn lock_keys_differ_by_purpose_and_schema() {
        assert_ne!(lock_key("purge", "a"), lock_key("migrate", "a"));
        assert_ne!(lock_key("purge", "a"), lock_key("purge", "b"));
        assert_eq!(lock_key("purge", "a"), lock_key("purge", "a"));
    }
}
