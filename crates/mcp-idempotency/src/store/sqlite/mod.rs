//! The SQLite store: the embedded default, kept in one file that survives restarts.
//!
//! | module | holds |
//! | --- | --- |
//! | `schema` | the tables, and creating them |
//! | `quota` | claims, and the counters that make quotas exact |
//! | `batch` | group commit: the operations waiting for the connection run in one transaction |
//! | `connection` | waiting for SQLite's locks, WAL mode and its checkpoints, errors |
//! | this file | [`SqliteStore`] and its [`Store`] operations |
//!
//! Records are encoded as in PostgreSQL ([`sql_row`]).

mod batch;
mod connection;
mod quota;
mod schema;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};

use self::batch::Writer;
use self::connection::{
    enable_wal, run_blocking, spawn_checkpointer, sql_error, wait_for_locks, WAL_SIZE_LIMIT_BYTES,
};
use self::quota::{adjust_counts, claim, purge};
use self::schema::migrate;
use super::sql_list::{list_query, SqlParam};
use super::sql_row::{self, decode, record_columns, sql_time, sql_token};
use super::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, Store, StoreError,
    StoreFuture, StoreStats, TakeOverRequest,
};
use crate::record::{FencingToken, Record, RecordId};
use crate::time::Timestamp;

/// The record `?1, ?2, ?3`, expired or not.
const SELECT_RECORD: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM idem_records WHERE namespace = ?1 AND principal = ?2 AND key = ?3"
);

/// Records in a SQLite file (WAL mode, every operation in a write transaction).
///
/// Several processes may share the file: operations take SQLite's write lock, so they are atomic
/// across processes too. Commits use `synchronous=NORMAL`, which survives a crash of the process
/// (the case that matters when a client restarts its server) but may lose the last commits on
/// power loss. Operations that wait for the connection at the same time share one transaction
/// (group commit), and each answers only once it committed. An operation runs on the calling
/// thread when it can take SQLite's write lock at once, and on Tokio's blocking pool when it has
/// to wait for another connection. Run it on a Tokio runtime with its timer
/// (`enable_time`, as `enable_all` does), as the claims' leases need: an operation that waits
/// 100 ms for a transaction whose leader is not polled runs the queue itself.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    writer: Arc<Writer>,
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
        wait_for_locks(&conn).map_err(cannot_open)?;
        enable_wal(&conn).map_err(cannot_open)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(cannot_open)?;
        // Checkpoints (the only step that fsyncs in WAL mode) run on a background thread instead
        // of inside whichever commit crosses the threshold.
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(cannot_open)?;
        conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT_BYTES)
            .map_err(cannot_open)?;
        // Every statement the store runs stays prepared (rusqlite keeps 16 by default, fewer
        // than the store has: the least recent would be parsed again and again).
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        migrate(&mut conn).map_err(|err| StoreError::Unavailable {
            message: format!("cannot prepare SQLite store {}: {err}", path.display()),
            source: Some(Box::new(err)),
        })?;
        let inner = Arc::new(Inner {
            path: path.to_owned(),
            writer: Writer::new(conn),
        });
        spawn_checkpointer(Arc::downgrade(&inner));
        Ok(Self { inner })
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `op` in a write transaction ([`Writer::run`]).
    fn write<T: Send + 'static>(
        &self,
        op: impl Fn(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> StoreFuture<'static, T> {
        self.inner.writer.run(op)
    }

    /// Runs the read `op` outside any write transaction when the connection is free, so that it
    /// takes no write lock; in the next write transaction otherwise ([`Writer::read_or_run`]).
    fn read<T: Send + 'static>(
        &self,
        op: impl Fn(&Connection) -> Result<T, StoreError> + Clone + Send + 'static,
    ) -> StoreFuture<'static, T> {
        let at_once = op.clone();
        self.inner
            .writer
            .read_or_run(move |conn| at_once(conn).map(Some), op)
    }
}

/// Prepared statements kept per connection: more than the store has.
const STATEMENT_CACHE: usize = 64;

/// The record `id`, expired or not.
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
    fn system(&self) -> Option<&'static str> {
        Some("sqlite")
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        // One copy of the request, for both the read and the write.
        let req = Arc::new(req.clone());
        let retried = Arc::clone(&req);
        self.inner.writer.read_or_run(
            // A retry finds its record with a plain read, which takes no write lock.
            move |conn| {
                let found = read_record(conn, &retried.id)?;
                let live = found.filter(|record| !record.is_expired(retried.now));
                Ok(live.map(|record| ClaimOutcome::found(&retried, record)))
            },
            move |tx| claim(tx, &req),
        )
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        self.write(move |conn| {
            let (kind, body) = (req.outcome.kind().as_str(), req.outcome.body());
            fenced_write(
                conn,
                // The second branch finds this completion sent again, and rewrites the same values.
                "UPDATE idem_records SET owner = NULL, lease_expires_at = NULL, outcome_kind = ?5, \
                 outcome_body = ?6, completed_at = ?7, expires_at = ?8 \
                 WHERE namespace = ?1 AND principal = ?2 AND key = ?3 AND (owner = ?4 \
                 OR (owner IS NULL AND outcome_kind = ?5 AND outcome_body = ?6 \
                 AND completed_at = ?7 AND expires_at = ?8))",
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
        self.write(move |conn| {
            fenced_write(
                conn,
                // The second branch finds this take-over sent again, and changes nothing.
                "UPDATE idem_records SET owner = ?5, \
                 lease_expires_at = CASE WHEN owner = ?5 THEN lease_expires_at ELSE ?6 END, \
                 expires_at = CASE WHEN owner = ?5 THEN expires_at ELSE ?7 END, \
                 trace = CASE WHEN owner = ?5 THEN trace ELSE ?9 || ' ' || created_at END \
                 WHERE namespace = ?1 AND principal = ?2 AND key = ?3 AND expires_at > ?8 \
                 AND ((owner = ?4 AND lease_expires_at <= ?8) OR owner = ?5)",
                params![
                    req.id.scope.namespace(),
                    req.id.scope.principal(),
                    req.id.key.as_str(),
                    sql_token(req.previous_owner),
                    sql_token(req.new_owner),
                    sql_time(req.lease_expires_at),
                    sql_time(req.expires_at),
                    sql_time(req.now),
                    req.trace.map(|trace| trace.to_traceparent()),
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
        self.write(move |conn| {
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
        self.write(move |tx| {
            let fenced = fenced_write(
                tx,
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
                adjust_counts(tx, &id.scope, -1)?;
            }
            Ok(fenced)
        })
    }

    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>> {
        let id = id.clone();
        self.read(move |conn| Ok(read_record(conn, &id)?.filter(|record| !record.is_expired(now))))
    }

    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64> {
        self.write(move |tx| purge(tx, now))
    }

    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        self.read(move |conn| {
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
        self.read(move |conn| list(conn, &filter, now, limit))
    }

    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        let id = id.clone();
        self.write(move |tx| {
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
                adjust_counts(tx, &id.scope, -1)?;
            }
            Ok(deleted)
        })
    }
}
