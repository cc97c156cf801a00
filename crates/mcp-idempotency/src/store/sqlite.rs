//! The SQLite store: the embedded default, kept in one file that survives restarts.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use rusqlite::{
    params, Connection, ErrorCode, OptionalExtension, Transaction, TransactionBehavior,
};

use super::sql_list::{list_query, SqlParam};
use super::sql_row::{self, decode, record_columns, sql_time, sql_token, ClaimColumns};
use super::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, QuotaExceeded, Store,
    StoreError, StoreFuture, StoreStats, TakeOverRequest,
};
use crate::record::{FencingToken, Record, RecordId, Scope};
use crate::time::Timestamp;

const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idem_records (
    namespace        TEXT    NOT NULL,
    principal        TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    fingerprint      BLOB    NOT NULL,
    tool_name        TEXT    NOT NULL,
    owner            INTEGER,
    lease_expires_at INTEGER,
    outcome_kind     TEXT,
    outcome_body     TEXT,
    completed_at     INTEGER,
    created_at       INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    PRIMARY KEY (namespace, principal, key),
    CHECK ((owner IS NULL) = (outcome_kind IS NOT NULL))
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at);
CREATE TABLE IF NOT EXISTS idem_scope_counts (
    namespace TEXT    NOT NULL,
    principal TEXT    NOT NULL,
    records   INTEGER NOT NULL,
    PRIMARY KEY (namespace, principal)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idem_totals (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    records INTEGER NOT NULL
);
INSERT OR IGNORE INTO idem_totals (id, records) VALUES (1, 0);
";

const SELECT_RECORD: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM idem_records WHERE namespace = ?1 AND principal = ?2 AND key = ?3"
);

/// Records in a SQLite file (WAL mode, one transaction per claim).
///
/// Several processes may share the file: claims take SQLite's write lock, so they are atomic across
/// processes too. Commits use `synchronous=NORMAL`, which survives a crash of the process (the case
/// that matters when a client restarts its server) but may lose the last commits on power loss.
/// An operation runs on the calling thread when it can take SQLite's write lock at once, and on
/// Tokio's blocking pool when it has to wait for another connection.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`, with its parent directory and schema.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_owned();
        run_blocking(move || Self::open_blocking(&path)).await
    }

    /// [`SqliteStore::open`] for callers outside an async runtime.
    pub fn open_blocking(path: &Path) -> Result<Self, StoreError> {
        let cannot_open = |err: rusqlite::Error| {
            StoreError::unavailable(format!("cannot open SQLite store {}", path.display()), err)
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|err| {
                StoreError::unavailable(
                    format!("cannot create directory {}", parent.display()),
                    err,
                )
            })?;
        }
        let mut conn = Connection::open(path).map_err(cannot_open)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(cannot_open)?;
        enable_wal(&conn).map_err(cannot_open)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(cannot_open)?;
        // Checkpoints (the only step that fsyncs in WAL mode) run on a background thread instead
        // of inside whichever commit crosses the threshold.
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(cannot_open)?;
        conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT_BYTES)
            .map_err(cannot_open)?;
        migrate(&mut conn).map_err(|err| StoreError::Unavailable {
            message: format!("cannot prepare SQLite store {}: {err}", path.display()),
            source: Some(Box::new(err)),
        })?;
        let inner = Arc::new(Inner {
            path: path.to_owned(),
            conn: Mutex::new(conn),
        });
        spawn_checkpointer(Arc::downgrade(&inner));
        Ok(Self { inner })
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `op` on the connection. When the connection is free and SQLite's write lock can be
    /// taken without waiting, `op` runs right away on the calling thread: a write transaction costs
    /// tens of microseconds, less than handing it to another thread. Otherwise (another task of this
    /// process holds the connection, or another process holds the write lock) it runs on Tokio's
    /// blocking pool, where waiting up to [`BUSY_TIMEOUT`] for the lock blocks no async task.
    fn with_conn<T: Send + 'static>(
        &self,
        op: impl Fn(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> StoreFuture<'static, T> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            if let Some(result) = run_without_waiting(&inner.conn, &op) {
                return result;
            }
            run_blocking(move || {
                // A panic mid-transaction rolls the transaction back when it is dropped, so the
                // connection stays consistent even if the lock was poisoned.
                let mut conn = inner.conn.lock().unwrap_or_else(PoisonError::into_inner);
                op(&mut conn)
            })
            .await
        })
    }
}

/// Runs `op` if the connection is free, with SQLite told not to wait for locks; `None` when the
/// connection is taken or `op` found SQLite's write lock held, in which case nothing was written:
/// every operation takes the write lock before its first change.
fn run_without_waiting<T>(
    conn: &Mutex<Connection>,
    op: &impl Fn(&mut Connection) -> Result<T, StoreError>,
) -> Option<Result<T, StoreError>> {
    let mut conn = match conn.try_lock() {
        Ok(conn) => conn,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => return None,
    };
    if conn.busy_timeout(Duration::ZERO).is_err() {
        return None;
    }
    let result = op(&mut conn);
    if let Err(err) = conn.busy_timeout(BUSY_TIMEOUT) {
        return Some(Err(sql_error(err)));
    }
    match &result {
        Err(err) if is_lock_conflict(err) => None,
        _ => Some(result),
    }
}

/// Whether `err` is SQLite reporting a lock held by another connection.
fn is_lock_conflict(err: &StoreError) -> bool {
    let StoreError::Unavailable {
        source: Some(source),
        ..
    } = err
    else {
        return false;
    };
    source
        .downcast_ref::<rusqlite::Error>()
        .and_then(rusqlite::Error::sqlite_error_code)
        .is_some_and(|code| matches!(code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
}

/// How often the WAL is checkpointed into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// Checkpoints the WAL every [`CHECKPOINT_EVERY`] on a connection of its own, until the store is
/// dropped. PASSIVE checkpoints never block writers; a failed one is retried on the next tick.
fn spawn_checkpointer(store: std::sync::Weak<Inner>) {
    let spawned = std::thread::Builder::new()
        .name("mcp-idem-sqlite-checkpoint".into())
        .spawn(move || {
            let Some(path) = store.upgrade().map(|inner| inner.path.clone()) else {
                return;
            };
            let conn = match Connection::open(&path) {
                Ok(conn) => conn,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot open a checkpoint connection; the WAL will grow");
                    return;
                }
            };
            // A RESTART checkpoint may wait this long for a transaction to end.
            let _ = conn.busy_timeout(Duration::from_millis(200));
            let _ = conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT_BYTES);
            while store.strong_count() > 0 {
                std::thread::sleep(CHECKPOINT_EVERY);
                checkpoint(&conn);
            }
        });
    if let Err(err) = spawned {
        tracing::warn!(error = %err, "cannot start the checkpoint thread; the WAL will grow");
    }
}

/// WAL size (in pages) past which a checkpoint makes the next writer start the log afresh.
const WAL_RESTART_PAGES: i64 = 4096;

/// Largest WAL file kept once the log restarts (SQLite truncates it to this).
const WAL_SIZE_LIMIT_BYTES: i64 = 16 << 20;

/// Copies the WAL into the database without blocking anyone (PASSIVE). Under sustained writes a
/// PASSIVE checkpoint never sees the log idle, so SQLite never starts it afresh and the file grows
/// with the number of writes; past [`WAL_RESTART_PAGES`] a RESTART checkpoint waits briefly for
/// the current transaction so that the next writer starts the log from the beginning.
fn checkpoint(conn: &Connection) {
    let passive = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
    });
    match passive {
        Ok((log_pages, _)) if log_pages > WAL_RESTART_PAGES => {
            if let Err(err) = conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(())) {
                tracing::debug!(error = %err, "WAL restart checkpoint failed; retrying later");
            }
        }
        Ok(_) => {}
        Err(err) => tracing::debug!(error = %err, "WAL checkpoint failed; retrying later"),
    }
}

/// How long a statement waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// `PRAGMA journal_mode = WAL`. Switching a new file to WAL takes an exclusive lock, and when
/// several processes create the store at once SQLite answers SQLITE_BUSY at once instead of calling
/// the busy handler (waiting could deadlock), so retry for up to [`BUSY_TIMEOUT`].
fn enable_wal(conn: &Connection) -> rusqlite::Result<()> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Err(err)
                if err.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

async fn run_blocking<T: Send + 'static>(
    op: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(op)
            .await
            .map_err(|err| StoreError::Backend {
                message: "SQLite task failed".into(),
                source: Some(Box::new(err)),
            })?,
        Err(_) => op(),
    }
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql_error)?;
    let version: i64 = tx
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(sql_error)?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::Backend {
            message: format!(
                "the file has schema version {version}, newer than this build understands ({SCHEMA_VERSION})"
            ),
            source: None,
        });
    }
    tx.execute_batch(SCHEMA).map_err(sql_error)?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(sql_error)?;
    tx.commit().map_err(sql_error)
}

fn sql_error(err: rusqlite::Error) -> StoreError {
    let unavailable = matches!(
        err.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::DiskFull
                | ErrorCode::ReadOnly
                | ErrorCode::CannotOpen
                | ErrorCode::SystemIoFailure
                | ErrorCode::PermissionDenied
        )
    );
    if unavailable {
        StoreError::unavailable("SQLite store cannot be written", err)
    } else {
        StoreError::backend("SQLite error", err)
    }
}

fn immediate(conn: &mut Connection) -> Result<Transaction<'_>, StoreError> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql_error)
}

fn read_record(tx: &Connection, id: &RecordId) -> Result<Option<Record>, StoreError> {
    let mut stmt = tx.prepare_cached(SELECT_RECORD).map_err(sql_error)?;
    let row = stmt
        .query_row(
            params![id.scope.namespace(), id.scope.principal(), id.key.as_str()],
            |row| Ok(decode(id, row, 0)),
        )
        .optional()
        .map_err(sql_error)?;
    row.transpose().map_err(StoreError::from)
}

fn claim(conn: &mut Connection, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
    // A retry finds its record with a plain read, which takes no write lock.
    if let Some(record) = read_record(conn, &req.id)?.filter(|r| !r.is_expired(req.now)) {
        return Ok(ClaimOutcome::Existing(record));
    }
    let tx = immediate(conn)?;
    let scope = &req.id.scope;
    let existing = read_record(&tx, &req.id)?;
    if let Some(record) = existing.as_ref().filter(|r| !r.is_expired(req.now)) {
        return Ok(ClaimOutcome::Existing(record.clone()));
    }
    if existing.is_none() {
        if let Some(quota) = over_quota(&tx, req)? {
            if !has_expired(&tx, req.now)? {
                return Ok(ClaimOutcome::QuotaExceeded(quota));
            }
            purge(&tx, req.now)?;
            if let Some(quota) = over_quota(&tx, req)? {
                return Ok(ClaimOutcome::QuotaExceeded(quota));
            }
        }
        adjust_counts(&tx, scope, 1)?;
    }
    tx.prepare_cached(
        "INSERT OR REPLACE INTO idem_records (namespace, principal, key, fingerprint, tool_name, \
         owner, lease_expires_at, outcome_kind, outcome_body, completed_at, created_at, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, NULL, NULL, ?8, ?9)",
    )
    .and_then(|mut stmt| {
        let c = ClaimColumns::of(req);
        stmt.execute(params![
            c.namespace,
            c.principal,
            c.key,
            c.fingerprint,
            c.tool_name,
            c.owner,
            c.lease_expires_at,
            c.now,
            c.expires_at,
        ])
    })
    .map_err(sql_error)?;
    tx.commit().map_err(sql_error)?;
    Ok(ClaimOutcome::Claimed)
}

fn over_quota(
    tx: &Transaction<'_>,
    req: &ClaimRequest,
) -> Result<Option<QuotaExceeded>, StoreError> {
    let total: i64 = tx
        .prepare_cached("SELECT records FROM idem_totals WHERE id = 1")
        .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
        .map_err(sql_error)?;
    if total as u64 >= req.limits.max_records_total {
        return Ok(Some(QuotaExceeded::Total {
            limit: req.limits.max_records_total,
        }));
    }
    let scoped: Option<i64> = tx
        .prepare_cached(
            "SELECT records FROM idem_scope_counts WHERE namespace = ?1 AND principal = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(
                params![req.id.scope.namespace(), req.id.scope.principal()],
                |row| row.get(0),
            )
            .optional()
        })
        .map_err(sql_error)?;
    if scoped.unwrap_or(0) as u64 >= req.limits.max_records_per_scope {
        return Ok(Some(QuotaExceeded::Scope {
            limit: req.limits.max_records_per_scope,
        }));
    }
    Ok(None)
}

fn has_expired(tx: &Transaction<'_>, now: Timestamp) -> Result<bool, StoreError> {
    tx.prepare_cached("SELECT EXISTS (SELECT 1 FROM idem_records WHERE expires_at <= ?1)")
        .and_then(|mut stmt| stmt.query_row([sql_time(now)], |row| row.get(0)))
        .map_err(sql_error)
}

fn adjust_counts(tx: &Transaction<'_>, scope: &Scope, delta: i64) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO idem_scope_counts (namespace, principal, records) VALUES (?1, ?2, ?3) \
         ON CONFLICT (namespace, principal) DO UPDATE SET records = records + excluded.records",
    )
    .and_then(|mut stmt| stmt.execute(params![scope.namespace(), scope.principal(), delta]))
    .and_then(|_| {
        tx.prepare_cached("UPDATE idem_totals SET records = records + ?1 WHERE id = 1")?
            .execute([delta])
    })
    .map(drop)
    .map_err(sql_error)
}

fn purge(tx: &Transaction<'_>, now: Timestamp) -> Result<u64, StoreError> {
    let now = sql_time(now);
    let expired_per_scope: Vec<(String, String, i64)> = tx
        .prepare_cached(
            "SELECT namespace, principal, COUNT(*) FROM idem_records WHERE expires_at <= ?1 \
             GROUP BY namespace, principal",
        )
        .and_then(|mut stmt| {
            stmt.query_map([now], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
                .collect()
        })
        .map_err(sql_error)?;
    let mut purged = 0;
    for (namespace, principal, count) in expired_per_scope {
        adjust_counts(tx, &Scope::new(namespace, principal), -count)?;
        purged += count as u64;
    }
    tx.prepare_cached("DELETE FROM idem_records WHERE expires_at <= ?1")
        .and_then(|mut stmt| stmt.execute([now]))
        .and_then(|_| tx.execute("DELETE FROM idem_scope_counts WHERE records <= 0", []))
        .map_err(sql_error)?;
    Ok(purged)
}

fn list(
    conn: &Connection,
    filter: &ListFilter,
    now: Timestamp,
    limit: usize,
) -> Result<Vec<Record>, StoreError> {
    let select = sql_row::listed_select("idem_records");
    let (sql, params) = list_query(&select, filter, now, limit, |n| format!("?{n}"));
    let values = params.into_iter().map(|param| match param {
        SqlParam::Text(text) => rusqlite::types::Value::Text(text),
        SqlParam::Integer(n) => rusqlite::types::Value::Integer(n),
    });
    let mut stmt = conn.prepare(&sql).map_err(sql_error)?;
    let rows = stmt
        .query_map(rusqlite::params_from_iter(values), |row| {
            Ok(sql_row::decode_listed(row))
        })
        .map_err(sql_error)?;
    let mut records = Vec::new();
    for row in rows {
        records.push(row.map_err(sql_error)??);
    }
    Ok(records)
}

/// Runs one fenced `UPDATE`/`DELETE` and reports whether it touched the record.
fn fenced_write(
    conn: &Connection,
    sql: &'static str,
    params: &[&dyn rusqlite::ToSql],
) -> Result<Fenced, StoreError> {
    let changed = conn
        .prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute(params))
        .map_err(sql_error)?;
    Ok(if changed == 1 {
        Fenced::Applied
    } else {
        Fenced::NotOwner
    })
}

impl Store for SqliteStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        let req = req.clone();
        self.with_conn(move |conn| claim(conn, &req))
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        self.with_conn(move |conn| {
            let (kind, body) = (req.outcome.kind().as_str(), req.outcome.body());
            fenced_write(
                conn,
                "UPDATE idem_records SET owner = NULL, lease_expires_at = NULL, outcome_kind = ?5, \
                 outcome_body = ?6, completed_at = ?7, expires_at = ?8 WHERE namespace = ?1 AND principal = ?2 AND key = ?3 AND owner = ?4",
                params![
                    req.id.scope.namespace(),
                    req.id.scope.principal(),
                    req.id.key.as_str(),
                    sql_token(req.owner),
                    kind,
                    body.as_ref(),
                    sql_time(req.completed_at),
                    sql_time(req.expires_at),
                ],
            )
        })
    }

    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        let req = req.clone();
        self.with_conn(move |conn| {
            fenced_write(
                conn,
                "UPDATE idem_records SET owner = ?5, lease_expires_at = ?6, expires_at = ?7 \
                 WHERE namespace = ?1 AND principal = ?2 AND key = ?3 AND owner = ?4 \
                 AND lease_expires_at <= ?8 AND expires_at > ?8",
                params![
                    req.id.scope.namespace(),
                    req.id.scope.principal(),
                    req.id.key.as_str(),
                    sql_token(req.previous_owner),
                    sql_token(req.new_owner),
                    sql_time(req.lease_expires_at),
                    sql_time(req.expires_at),
                    sql_time(req.now),
                ],
            )
        })
    }

    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease_expires_at: Timestamp,
    ) -> StoreFuture<'a, Fenced> {
        let id = id.clone();
        self.with_conn(move |conn| {
            fenced_write(
                conn,
                "UPDATE idem_records SET lease_expires_at = ?5, expires_at = MAX(expires_at, ?5) \
                 WHERE namespace = ?1 AND principal = ?2 AND key = ?3 AND owner = ?4",
                params![
                    id.scope.namespace(),
                    id.scope.principal(),
                    id.key.as_str(),
                    sql_token(owner),
                    sql_time(lease_expires_at),
                ],
            )
        })
    }

    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        let id = id.clone();
        self.with_conn(move |conn| {
            let tx = immediate(conn)?;
            let fenced = fenced_write(
                &tx,
                "DELETE FROM idem_records \
                 WHERE namespace = ?1 AND principal = ?2 AND key = ?3 AND owner = ?4",
                params![
                    id.scope.namespace(),
                    id.scope.principal(),
                    id.key.as_str(),
                    sql_token(owner)
                ],
            )?;
            if fenced == Fenced::Applied {
                adjust_counts(&tx, &id.scope, -1)?;
            }
            tx.commit().map_err(sql_error)?;
            Ok(fenced)
        })
    }

    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>> {
        let id = id.clone();
        self.with_conn(move |conn| {
            Ok(read_record(conn, &id)?.filter(|record| !record.is_expired(now)))
        })
    }

    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64> {
        self.with_conn(move |conn| {
            let tx = immediate(conn)?;
            let purged = purge(&tx, now)?;
            tx.commit().map_err(sql_error)?;
            Ok(purged)
        })
    }

    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        self.with_conn(move |conn| {
            conn.query_row(
                "SELECT \
                   COALESCE(SUM(expires_at > ?1 AND owner IS NOT NULL), 0), \
                   COALESCE(SUM(expires_at > ?1 AND owner IS NULL), 0), \
                   COALESCE(SUM(expires_at <= ?1), 0) \
                 FROM idem_records",
                [sql_time(now)],
                |row| {
                    Ok(StoreStats {
                        in_progress: row.get::<_, i64>(0)? as u64,
                        completed: row.get::<_, i64>(1)? as u64,
                        expired: row.get::<_, i64>(2)? as u64,
                    })
                },
            )
            .map_err(sql_error)
        })
    }

    fn list<'a>(
        &'a self,
        filter: &'a ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Record>> {
        let filter = filter.clone();
        self.with_conn(move |conn| list(conn, &filter, now, limit))
    }

    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        let id = id.clone();
        self.with_conn(move |conn| {
            let tx = immediate(conn)?;
            let deleted = tx
                .prepare_cached(
                    "DELETE FROM idem_records WHERE namespace = ?1 AND principal = ?2 AND key = ?3",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![
                        id.scope.namespace(),
                        id.scope.principal(),
                        id.key.as_str()
                    ])
                })
                .map_err(sql_error)?
                == 1;
            if deleted {
                adjust_counts(&tx, &id.scope, -1)?;
            }
            tx.commit().map_err(sql_error)?;
            Ok(deleted)
        })
    }
}
