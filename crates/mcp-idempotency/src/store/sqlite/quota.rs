//! Claims, and the counters that make quotas exact: in one write transaction a claim reads the record,
//! checks the scope's and the store's counts, and inserts the record and counts it, or refuses
//! (after purging expired records once).

use rusqlite::{params, Connection, OptionalExtension};

use super::connection::sql_error;
use super::read_record;
use crate::record::Scope;
use crate::store::sql_row::{sql_time, ClaimColumns};
use crate::store::{ClaimOutcome, ClaimRequest, QuotaExceeded, StoreError};
use crate::time::Timestamp;

/// Claims `req.id` in the write transaction `tx`: reads the record, checks the quotas, and inserts
/// and counts the record (an expired record is replaced in place and stays counted).
pub(super) fn claim(tx: &Connection, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
    let scope = &req.id.scope;
    let existing = read_record(tx, &req.id)?;
    if let Some(record) = existing.as_ref().filter(|r| !r.is_expired(req.now)) {
        return Ok(ClaimOutcome::found(req, record.clone()));
    }
    if existing.is_none() {
        if let Some(quota) = over_quota(tx, req)? {
            if !has_expired(tx, req.now)? {
                return Ok(ClaimOutcome::QuotaExceeded(quota));
            }
            purge(tx, req.now)?;
            if let Some(quota) = over_quota(tx, req)? {
                return Ok(ClaimOutcome::QuotaExceeded(quota));
            }
        }
        adjust_counts(tx, scope, 1)?;
    }
    tx.prepare_cached(
        "INSERT OR REPLACE INTO idem_records (namespace, principal, key, fingerprint, tool_name, \
         owner, lease_expires_at, outcome_kind, outcome_body, completed_at, created_at, expires_at, \
         trace) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, NULL, NULL, ?8, ?9, ?10)",
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
            c.trace,
        ])
    })
    .map_err(sql_error)?;
    Ok(ClaimOutcome::Claimed)
}

fn over_quota(tx: &Connection, req: &ClaimRequest) -> Result<Option<QuotaExceeded>, StoreError> {
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

fn has_expired(tx: &Connection, now: Timestamp) -> Result<bool, StoreError> {
    tx.prepare_cached("SELECT EXISTS (SELECT 1 FROM idem_records WHERE expires_at <= ?1)")
        .and_then(|mut stmt| stmt.query_row([sql_time(now)], |row| row.get(0)))
        .map_err(sql_error)
}

/// Adds `delta` to the scope's and the store's record counts.
pub(super) fn adjust_counts(tx: &Connection, scope: &Scope, delta: i64) -> Result<(), StoreError> {
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

/// Deletes every record whose retention ended by `now`, uncounting them; returns how many.
pub(super) fn purge(tx: &Connection, now: Timestamp) -> Result<u64, StoreError> {
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
