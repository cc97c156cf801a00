//! The tables (version 1, with the `trace` column added in place), and creating them when a
//! store is opened.

use rusqlite::{Connection, TransactionBehavior};

use super::connection::sql_error;
use crate::store::StoreError;

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
    trace            TEXT,
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

/// Creates the tables if missing; refuses a file with a schema newer than this build.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
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
    add_trace_column(&tx)?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(sql_error)?;
    tx.commit().map_err(sql_error)
}

/// Adds the `trace` column to a file made before it existed. The schema version stays 1: a
/// release that does not know the column reads and writes the file as before (its statements name
/// their columns; a claim it makes replaces the row, leaving the column `NULL`).
fn add_trace_column(tx: &Connection) -> Result<(), StoreError> {
    let present: bool = tx
        .query_row(
            "SELECT count(*) > 0 FROM pragma_table_info('idem_records') WHERE name = 'trace'",
            [],
            |row| row.get(0),
        )
        .map_err(sql_error)?;
    if !present {
        tx.execute_batch("ALTER TABLE idem_records ADD COLUMN trace TEXT")
            .map_err(sql_error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file made before the `trace` column (by the previous release, version 1 too) gets it, and
    /// keeps its version and its rows.
    #[test]
    fn a_file_without_the_trace_column_gets_it_in_place() {
        let mut conn = Connection::open_in_memory().unwrap();
        let old_schema = SCHEMA.replace("    trace            TEXT,\n", "");
        assert_ne!(old_schema, SCHEMA);
        conn.execute_batch(&old_schema).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute(
            "INSERT INTO idem_records (namespace, principal, key, fingerprint, tool_name, owner, \
             lease_expires_at, created_at, expires_at) VALUES ('n', 'p', 'k', x'00', 't', 1, 2, 3, 4)",
            [],
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let (rows, traces): (i64, i64) = conn
            .query_row(
                "SELECT count(*), count(trace) FROM idem_records",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!((rows, traces), (1, 0));
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(version, 1);
        // Opening it again changes nothing.
        migrate(&mut conn).unwrap();
    }
}
