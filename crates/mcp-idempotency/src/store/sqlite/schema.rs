//! The tables (version 1), and creating them when a store is opened.

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
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(sql_error)?;
    tx.commit().map_err(sql_error)
}
