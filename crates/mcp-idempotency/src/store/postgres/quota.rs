//! Claims, and the counters that make quotas exact without serializing claims.
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

use deadpool_postgres::ClientWrapper;
use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

use super::params::{params, typed, Typed};
use super::pool::{explain, OpError, MAX_CLAIM_ATTEMPTS};
use super::shards::{SCOPE_SHARD_FULL, SHARDS, TOTAL_SHARD_FULL};
use super::sql::Sql;
use super::{purge, Inner};
use crate::record::{CorruptRecord, RecordId};
use crate::store::sql_row::{decode, ClaimColumns};
use crate::store::{ClaimOutcome, ClaimRequest, QuotaExceeded};

/// Claims `req.id`: the one-statement path, the exact path for the counters whose shard had no
/// room, one purge of expired records before a refusal, and a re-run after a race.
pub(super) async fn claim(
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
pub(super) fn shard_of(id: &RecordId) -> i16 {
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
fn claim_params<'a>(c: &'a ClaimColumns<'a>) -> Vec<Typed<'a>> {
    params![
        c.namespace,
        c.principal,
        c.key,
        c.fingerprint,
        c.tool_name,
        c.owner,
        c.lease_expires_at,
        c.now,
        c.expires_at,
    ]
    .into()
}

async fn claim_once(
    client: &ClientWrapper,
    sql: &Sql,
    req: &ClaimRequest,
    shard: i16,
) -> Result<Attempt, OpError> {
    let record = ClaimColumns::of(req);
    let limits = (
        sql_limit(req.limits.max_records_per_scope),
        sql_limit(req.limits.max_records_total),
    );
    let mut params = claim_params(&record);
    params.extend(params![limits.0, limits.1, shard, record.trace]);
    let rows = match client.query_typed(&sql.claim, &params).await {
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
        ClaimOutcome::found(req, decode(&req.id, row, 1)?)
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
    let record = ClaimColumns::of(req);
    let mut params = claim_params(&record);
    params.push(typed(&shard));
    params.push(typed(&record.trace));
    let Some(row) = tx.query_typed_opt(&sql.insert_record, &params).await? else {
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
        let rows = tx
            .query_typed(&sql.lock_scope, &params![namespace, principal])
            .await?;
        let Some(caps) = capacities(&shard_counts(&rows)?, shard_index(shard), scope_limit) else {
            tx.rollback().await?;
            return Ok(Attempt::OverQuota(QuotaExceeded::Scope {
                limit: req.limits.max_records_per_scope,
            }));
        };
        tx.execute_typed(
            &sql.set_scope,
            &params![namespace, principal, shard, caps, scope_limit],
        )
        .await?;
    } else {
        if tx
            .execute_typed(
                &sql.bump_scope,
                &params![namespace, principal, shard, scope_limit],
            )
            .await?
            == 0
        {
            // Rolled back before locking the whole counter: the failed update may hold the row.
            tx.rollback().await?;
            return Ok(Attempt::ShardFull(Counter::Scope));
        }
    }
    if exact.total {
        let rows = tx.query_typed(&sql.lock_total, &[]).await?;
        let Some(caps) = capacities(&shard_counts(&rows)?, shard_index(shard), total_limit) else {
            tx.rollback().await?;
            return Ok(Attempt::OverQuota(QuotaExceeded::Total {
                limit: req.limits.max_records_total,
            }));
        };
        tx.execute_typed(&sql.set_total, &params![shard, caps, total_limit])
            .await?;
    } else {
        if tx
            .execute_typed(&sql.bump_total, &params![shard, total_limit])
            .await?
            == 0
        {
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

/// Limits are `u64`; stored as `bigint`, clamped.
pub(super) fn sql_limit(limit: u64) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Scope;

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
}
