//! The tables, and creating or migrating them when a store is opened.
//!
//! # Schema
//!
//! Four tables live in one schema (`public` unless the URL says `?schema=NAME` or the store is
//! opened with [`PostgresStore::open_in_schema`](super::PostgresStore::open_in_schema)), plus a
//! version table (version 2):
//!
//! * `idem_records`: one row per `(namespace, principal, key)` (the primary key, `COLLATE "C"` so
//!   keys compare byte for byte), with the fingerprint (`bytea`, 32 bytes), the owner token
//!   (`bigint`, the `u64` cast bitwise) and lease while in progress, or the outcome kind and body
//!   (`text`, kept byte for byte) once completed, and the counter shard the record is counted in
//!   (`shard`, `0..16`), and the claiming call's trace (`trace`, `text`, see
//!   [`TraceLink::stored`](crate::TraceLink::stored); added in place to version 2 tables, with no
//!   version change). Times are the caller's milliseconds since the epoch (`bigint`), never the
//!   database clock. An index on `expires_at` serves purges.
//! * `idem_scope_shards` and `idem_total_shards`: how many records (live or expired but not yet
//!   purged) each scope and the whole store hold, split over 16 counter rows ("shards") per scope
//!   and 16 for the store, kept in step with `idem_records` by the same statements that insert and
//!   delete records, so quotas are checked without counting rows. A record is counted in the shard
//!   with the number stored in its row (for both counters), chosen when it is first inserted from a
//!   hash of its scope and key; releases, purges and replacements of expired records use the stored
//!   number, so decrements always hit the row that was incremented.
//! * `idem_shard_guard`: always empty. Its two `CHECK` constraints turn "a counter shard has no
//!   room" into an error that aborts the claiming statement (see the `quota` module).
//!
//! Three PL/pgSQL functions run the statements of every executed call, so that the server plans
//! them once per connection (see [`CLAIM_FUNCTION`](super::sql::CLAIM_FUNCTION)):
//! `idem_claim_v2` and `idem_complete_v1`, and `idem_batch_v2`, which runs several of both in one
//! statement (see the `batch` module). Opening the store creates them when they are missing,
//! whatever the version; their names carry their own version, so builds with other bodies keep
//! calling theirs. A role that may not create them in the schema cannot open it until they exist.
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

use deadpool_postgres::{Object, Pool};

use super::params::params;
use super::pool::{explain, is_connection_error, pool_error, OpError, OPERATION_TIMEOUT};
use super::shards::{SCOPE_SHARD_FULL, SHARDS, TOTAL_SHARD_FULL};
use super::sql::{
    batch_args, BATCH_FUNCTION, CLAIM_ARGS, CLAIM_FUNCTION, COMPLETE_ARGS, COMPLETE_FUNCTION,
};
use crate::store::StoreError;

/// The schema version this build creates and understands.
const SCHEMA_VERSION: i32 = 2;

/// Creates or migrates the tables in `schema` (`quoted` as an identifier) on a connection of
/// `pool`, and creates the store's functions with `functions` when they are missing, within
/// [`OPERATION_TIMEOUT`]; errors name the server as `target`.
pub(super) async fn prepare(
    pool: &Pool,
    schema: &str,
    quoted: &str,
    functions: &str,
    target: &str,
) -> Result<(), StoreError> {
    let mut client = pool.get().await.map_err(|err| pool_error(target, err))?;
    let migrated = tokio::time::timeout(
        OPERATION_TIMEOUT,
        migrate(&mut client, schema, quoted, functions),
    )
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
        other => other.into_store_error(target),
    })
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
            trace            text,
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
async fn migrate(
    client: &mut Object,
    schema: &str,
    quoted: &str,
    functions: &str,
) -> Result<(), OpError> {
    let tx = client.transaction().await?;
    tx.execute_typed(
        "SELECT pg_advisory_xact_lock($1)",
        &params![lock_key("migrate", schema)],
    )
    .await?;
    let encoding: String = tx
        .query_typed_one("SELECT current_setting('server_encoding')", &[])
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
        .query_typed_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &params![version_table],
        )
        .await?
        .try_get(0)?;
    let version: i32 = if has_version_table {
        tx.query_typed_opt(
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
            .query_typed_one(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
                &params![schema],
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
        tx.execute_typed(
            &format!(
                "INSERT INTO {version_table} (id, version) VALUES (1, $1)
                 ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version"
            ),
            &params![SCHEMA_VERSION],
        )
        .await?;
    }
    // The `trace` column came without a version change (a release that does not know it names
    // its columns, and reads and writes as before); a table made before it gets it here.
    let has_trace: bool = tx
        .query_typed_one(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                WHERE table_schema = $1 AND table_name = 'idem_records' AND column_name = 'trace')",
            &params![schema],
        )
        .await?
        .try_get(0)?;
    if !has_trace {
        tx.batch_execute(&format!(
            "ALTER TABLE {quoted}.idem_records ADD COLUMN IF NOT EXISTS trace text"
        ))
        .await?;
    }
    // The functions are looked for by name and argument types, so a schema whose tables are up
    // to date gets them without a version change, and builds calling other versions of them keep
    // theirs.
    let present: bool = tx
        .query_typed_one(
            "SELECT to_regprocedure($1) IS NOT NULL AND to_regprocedure($2) IS NOT NULL
                AND to_regprocedure($3) IS NOT NULL",
            &params![
                format!("{quoted}.{CLAIM_FUNCTION}({CLAIM_ARGS})"),
                format!("{quoted}.{COMPLETE_FUNCTION}({COMPLETE_ARGS})"),
                format!("{quoted}.{BATCH_FUNCTION}({})", batch_args()),
            ],
        )
        .await?
        .try_get(0)?;
    if !present {
        tx.batch_execute(functions).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// A 64-bit advisory lock key for `purpose` on `schema` (FNV-1a), so that stores in different
/// schemas do not wait for each other.
pub(super) fn lock_key(purpose: &str, schema: &str) -> i64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_differ_by_purpose_and_schema() {
        assert_ne!(lock_key("purge", "a"), lock_key("migrate", "a"));
        assert_ne!(lock_key("purge", "a"), lock_key("purge", "b"));
        assert_eq!(lock_key("purge", "a"), lock_key("purge", "a"));
    }
}
