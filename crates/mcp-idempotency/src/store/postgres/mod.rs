//! The PostgreSQL store: records shared by every gateway instance that points at one database.
//!
//! Four tables live in one schema (`public` unless the URL says `?schema=NAME` or the store is
//! opened with [`PostgresStore::open_in_schema`]), plus a version table: the records, one per
//! `(namespace, principal, key)`, and the counters that enforce the quotas, split over 16 rows
//! ("shards") per scope and 16 for the store so that claims of distinct keys neither wait for
//! each other nor for each other's commit. Times are the caller's milliseconds, never the
//! database clock; records are encoded as in SQLite ([`sql_row`]).
//!
//! Claims run under READ COMMITTED; the common case is one statement (one round trip), and
//! claims and completions that wait at the same time share one (the `batch` module). A claim
//! whose counter shard has no room (near a limit, for the first claim of a scope, or under another
//! limit than the one the shards' capacities were computed for) takes the exact path instead, one
//! transaction that locks the whole counter. Quotas are therefore exact: a claim is refused if and
//! only if the counter holds as many records as its limit. Every statement and transaction takes
//! row locks in one global order (and purges take turns on an advisory lock), so they cannot
//! deadlock each other.
//!
//! | module | holds |
//! | --- | --- |
//! | `schema` | the tables, their invariants, creating them and migrating version 1 |
//! | `shards` | how many rows each counter is split over, and the constraints that say a shard is full |
//! | `quota` | claims: the counter shards and their capacities, the one-statement and exact paths, why quotas are exact, what it costs |
//! | `sql` | every statement, the two server-side functions for claims and completions, and the lock order that keeps them from deadlocking |
//! | `params` | statement parameters with their types: every statement is unnamed (PgBouncer) |
//! | `batch` | group commit: claims and completions that wait at the same time, in one statement |
//! | `pool` | the connection pool, timeouts, retries, and errors |
//! | `config` | the URL: the `schema` parameter, schema names, timeouts, the description errors show |
//! | this file | [`PostgresStore`] and its [`Store`] operations |

mod batch;
mod config;
mod params;
mod pool;
mod quota;
mod schema;
mod shards;
mod sql;
mod tls;

use std::fmt;
use std::sync::Arc;

use deadpool_postgres::{ClientWrapper, Pool};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use self::params::{params, Typed};
use self::pool::{explain, run, OpError};
use self::schema::lock_key;
use self::sql::Sql;
use super::sql_list::{list_query, SqlParam};
use super::sql_row::{self, decode, sql_time, sql_token};
use super::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, Store, StoreError,
    StoreFuture, StoreStats, TakeOverRequest,
};
use crate::record::{CorruptRecord, FencingToken, Record, RecordId};
use crate::store::batch::{self as queue, Batcher};
use crate::time::Timestamp;

/// Most records one purge statement deletes.
const PURGE_BATCH: i64 = 10_000;

/// Records in a PostgreSQL database, through a pool of connections.
///
/// Every operation is a single statement (or, for a claim near a quota limit, one transaction),
/// atomic on its own, so any number of processes and machines may share the database. Claims and
/// completions that wait at the same time share one statement, and so one commit; each still
/// answers only once that commit is done. Operations fail with [`StoreError::Unavailable`] within
/// a bounded time when the server cannot be reached (the connect timeout, 5 s unless the URL sets
/// `connect_timeout`, to open a connection; 10 s for a statement or to wait for a busy pool), and
/// the pool reconnects by itself once it is back.
///
/// A statement the client gave up on may still complete on the server. For a claim whose answer
/// is lost this way, the [`Deduplicator`](crate::Deduplicator) releases the record, fenced by the
/// claim's token, once the store answers again; but a claim the server carries out only after
/// that (stuck behind a lock for longer than the timeout) stays in progress until its lease runs
/// out. To have the server abort such statements too, set a `statement_timeout` for the role or
/// database, or in the URL with `options=-c%20statement_timeout%3D10000`.
///
/// Quotas are exact, as with the other stores: a claim that would create a record is refused if
/// and only if its scope (or the store) already holds as many records as the limit it carries.
/// Counters are split in 16 shards so that claims of distinct keys do not wait for each other;
/// near a limit (or for the first claim of a scope) claims lock the whole counter instead (see
/// the module documentation).
///
/// Open one with [`PostgresStore::open`] (`postgres://user:password@host:port/db`, optionally
/// `?schema=NAME` and the parameters tokio-postgres takes, such as `connect_timeout` in seconds)
/// or [`PostgresStore::open_in_schema`]. TLS (rustls) as libpq's `sslmode=prefer|require|verify-ca|verify-full`
/// and `sslrootcert=FILE` (PEM CA certificates) say; without `sslmode`, no TLS.
///
/// The store works through PgBouncer in transaction pooling mode: every statement is sent
/// unnamed, with its parameter types, in one round trip (no named prepared statement has to
/// survive on a server connection), the only lock outside a row (schema migration, purges) is a
/// transaction-level advisory lock, and no session setting is ever changed. PgBouncer before 1.20
/// refuses the `options` startup parameter, so set a `statement_timeout` for the role there
/// instead of in the URL.
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
    batcher: Batcher,
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
        let (url, schema) = config::split_schema_param(url)?;
        Self::connect(&url, schema.as_deref().unwrap_or(config::DEFAULT_SCHEMA)).await
    }

    /// Like [`PostgresStore::open`], with the tables in `schema` (created if missing), which wins
    /// over a `schema` URL parameter. Separate schemas keep separate sets of records in one
    /// database, e.g. one per test.
    pub async fn open_in_schema(url: &str, schema: &str) -> Result<Self, StoreError> {
        let (url, _) = config::split_schema_param(url)?;
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
        let (url, tls_options) = tls::split_tls_params(url).map_err(invalid)?;
        let (mut config, connect_timeout) = config::connection_config(&url, schema)?;
        config.ssl_mode(tls_options.mode.ssl_mode());
        let connector = tls::RustlsConnect::new(&tls_options).map_err(invalid)?;
        let target = config::describe(&config);
        let pool = pool::build(config, connector, connect_timeout, &target)?;
        let quoted = config::quote_ident(schema);
        let sql = Sql::new(&quoted);
        schema::prepare(&pool, schema, &quoted, &sql.functions, &target).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                target,
                schema: schema.to_owned(),
                sql,
                batcher: Batcher::default(),
            }),
        })
    }
}

impl PostgresStore {
    /// Claims `req` in a statement (or, on the exact path, a transaction) of its own.
    async fn claim_alone(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        run!(self, "claim", |client| quota::claim(
            &mut client,
            &self.inner,
            req
        )
        .await)
    }

    /// Records `req`'s outcome in a statement of its own.
    async fn complete_alone(&self, req: &CompleteRequest) -> Result<Fenced, StoreError> {
        let kind = req.outcome.kind().as_str();
        let body = req.outcome.body();
        let body: &str = &body;
        run!(self, "complete", |client| {
            fenced_call(
                &client,
                &self.inner.sql.complete,
                &params![
                    req.id.scope.namespace(),
                    req.id.scope.principal(),
                    req.id.key.as_str(),
                    sql_token(req.owner),
                    kind,
                    body,
                    sql_time(req.completed_at),
                    sql_time(req.expires_at),
                ],
            )
            .await
        })
    }
}

impl Store for PostgresStore {
    fn system(&self) -> Option<&'static str> {
        Some("postgresql")
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(queue::claim(self, req))
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        Box::pin(queue::complete(self, req))
    }

    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            run!(self, "take-over", |client| {
                fenced_update(
                    &client,
                    &self.inner.sql.take_over,
                    &params![
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
                    &params![
                        id.scope.namespace(),
                        id.scope.principal(),
                        id.key.as_str(),
                        sql_token(owner),
                        sql_time(lease_expires_at),
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
                    &params![
                        id.scope.namespace(),
                        id.scope.principal(),
                        id.key.as_str(),
                        sql_token(owner),
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
                Ok::<_, OpError>(
                    client
                        .execute_typed(&self.inner.sql.drop_empty_scopes, &[])
                        .await?,
                )
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
                .map(|param| -> (Box<dyn ToSql + Sync + Send>, Type) {
                    match param {
                        SqlParam::Text(text) => (Box::new(text), Type::TEXT),
                        SqlParam::Integer(n) => (Box::new(n), Type::INT8),
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
                    &params![id.scope.namespace(), id.scope.principal(), id.key.as_str()],
                )
                .await
                .map(|deleted| deleted == 1)
            })
        })
    }
}

async fn list(client: &ClientWrapper, text: &str, params: &Params) -> Result<Vec<Record>, OpError> {
    let params: Vec<Typed<'_>> = params
        .iter()
        .map(|(param, ty)| (&**param as &(dyn ToSql + Sync), ty.clone()))
        .collect();
    let rows = client.query_typed(text, &params).await?;
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
    let row = client
        .query_typed_opt(
            &sql.get,
            &params![
                id.scope.namespace(),
                id.scope.principal(),
                id.key.as_str(),
                sql_time(now),
            ],
        )
        .await?;
    Ok(row.map(|row| decode(id, &row, 0)).transpose()?)
}

async fn stats(client: &ClientWrapper, sql: &Sql, now: Timestamp) -> Result<StoreStats, OpError> {
    let row = client
        .query_typed_one(&sql.stats, &params![sql_time(now)])
        .await?;
    Ok(StoreStats {
        in_progress: count(&row, 0)?,
        completed: count(&row, 1)?,
        expired: count(&row, 2)?,
    })
}

/// Deletes up to [`PURGE_BATCH`] expired records in one statement; returns how many.
async fn purge(client: &ClientWrapper, inner: &Inner, now: Timestamp) -> Result<u64, OpError> {
    query_count(
        client,
        &inner.sql.purge,
        &params![sql_time(now), lock_key("purge", &inner.schema), PURGE_BATCH],
    )
    .await
}

/// Runs a fenced `UPDATE` and reports whether it touched the record.
async fn fenced_update(
    client: &ClientWrapper,
    sql: &str,
    params: &[Typed<'_>],
) -> Result<Fenced, OpError> {
    let changed = client.execute_typed(sql, params).await?;
    Ok(if changed == 1 {
        Fenced::Applied
    } else {
        Fenced::NotOwner
    })
}

/// Calls a fenced function, which answers how many records it changed, and reports whether it
/// touched the record.
async fn fenced_call(
    client: &ClientWrapper,
    sql: &str,
    params: &[Typed<'_>],
) -> Result<Fenced, OpError> {
    Ok(if query_count(client, sql, params).await? == 1 {
        Fenced::Applied
    } else {
        Fenced::NotOwner
    })
}

/// Runs a statement that returns one count.
async fn query_count(
    client: &ClientWrapper,
    sql: &str,
    params: &[Typed<'_>],
) -> Result<u64, OpError> {
    let row = client.query_typed_one(sql, params).await?;
    count(&row, 0)
}

fn count(row: &Row, i: usize) -> Result<u64, OpError> {
    let n: i64 = row
        .try_get(i)
        .map_err(|err| CorruptRecord(format!("unreadable count: {}", explain(&err))))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Parameters of a statement built at run time.
type Params = Vec<(Box<dyn ToSql + Sync + Send>, Type)>;
