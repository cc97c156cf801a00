//! Group commit: claims and completions that wait at the same time share one statement, and so one
//! transaction, one round trip and one commit. The queue and the leader are the shared ones of
//! `store::batch`; this module runs a batch as one call of the batch function
//! ([`BATCH_FUNCTION`](super::sql::BATCH_FUNCTION)).
//!
//! Each operation keeps its own answer and its guarantees:
//!
//! * an operation answers only once the statement that ran it committed: a claim is durable
//!   before its call runs, an outcome before its answer is sent;
//! * a claim the batch cannot decide (its counter shard has no room, it raced a concurrent claim
//!   of its key, or it shares its key with a claim the batch refused) is left unchanged by the
//!   batch and runs again alone, on the exact path if need be, so quotas stay exact;
//! * when the batch fails with an answer from the server, nothing of it was committed, and each
//!   operation runs again alone to get its own answer; when the server could not be reached or
//!   did not answer, each gets [`StoreError::Unavailable`], as a lone operation would.
//!
//! The batch takes its locks in the store's global order (records sorted by key, then scope
//! counter rows, then the store's), so batches of several processes do not deadlock each other or
//! the lone operations (the one exception, with a purge, is in the `sql` module's documentation).

use tokio_postgres::Row;

use super::params::params;
use super::pool::{run, OpError};
use super::quota::{shard_of, sql_limit};
use super::PostgresStore;
use crate::record::CorruptRecord;
use crate::store::batch::{Answer, Batcher, Grouped, Job};
use crate::store::sql_row::{decode, sql_time, sql_token, ClaimColumns};
use crate::store::{ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, StoreError, StoreFuture};

impl Grouped for PostgresStore {
    const NAME: &'static str = "PostgreSQL";

    fn batcher(&self) -> &Batcher {
        &self.inner.batcher
    }

    fn claim_alone<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(self.claim_alone(req))
    }

    fn complete_alone<'a>(&'a self, req: &'a CompleteRequest) -> StoreFuture<'a, Fenced> {
        Box::pin(self.complete_alone(req))
    }

    fn run_together<'a>(&'a self, jobs: &'a [Job]) -> StoreFuture<'a, Vec<Answer>> {
        Box::pin(self.batch(jobs))
    }
}

impl PostgresStore {
    /// Runs `jobs` as one call of the batch function; the answers are in the order of `jobs`.
    async fn batch(&self, jobs: &[Job]) -> Result<Vec<Answer>, StoreError> {
        let mut claims = Vec::new();
        let mut completions = Vec::new();
        for job in jobs {
            match job {
                Job::Claim { req, .. } => claims.push(req),
                Job::Complete { req, .. } => completions.push(req),
            }
        }
        let c: Vec<ClaimColumns<'_>> = claims.iter().map(|req| ClaimColumns::of(req)).collect();
        let c_namespace: Vec<&str> = c.iter().map(|c| c.namespace).collect();
        let c_principal: Vec<&str> = c.iter().map(|c| c.principal).collect();
        let c_key: Vec<&str> = c.iter().map(|c| c.key).collect();
        let c_fingerprint: Vec<&[u8]> = c.iter().map(|c| c.fingerprint).collect();
        let c_tool_name: Vec<&str> = c.iter().map(|c| c.tool_name).collect();
        let c_owner: Vec<i64> = c.iter().map(|c| c.owner).collect();
        let c_lease: Vec<i64> = c.iter().map(|c| c.lease_expires_at).collect();
        let c_now: Vec<i64> = c.iter().map(|c| c.now).collect();
        let c_expires: Vec<i64> = c.iter().map(|c| c.expires_at).collect();
        let c_scope_limit: Vec<i64> = claims
            .iter()
            .map(|req| sql_limit(req.limits.max_records_per_scope))
            .collect();
        let c_total_limit: Vec<i64> = claims
            .iter()
            .map(|req| sql_limit(req.limits.max_records_total))
            .collect();
        let c_shard: Vec<i16> = claims.iter().map(|req| shard_of(&req.id)).collect();
        let c_trace: Vec<Option<&str>> = c.iter().map(|c| c.trace.as_deref()).collect();
        let bodies: Vec<_> = completions.iter().map(|req| req.outcome.body()).collect();
        let d_namespace: Vec<&str> = completions.iter().map(|r| r.id.scope.namespace()).collect();
        let d_principal: Vec<&str> = completions.iter().map(|r| r.id.scope.principal()).collect();
        let d_key: Vec<&str> = completions.iter().map(|r| r.id.key.as_str()).collect();
        let d_owner: Vec<i64> = completions.iter().map(|r| sql_token(r.owner)).collect();
        let d_kind: Vec<&str> = completions
            .iter()
            .map(|r| r.outcome.kind().as_str())
            .collect();
        let d_body: Vec<&str> = bodies.iter().map(|body| &**body).collect();
        let d_completed: Vec<i64> = completions
            .iter()
            .map(|r| sql_time(r.completed_at))
            .collect();
        let d_expires: Vec<i64> = completions.iter().map(|r| sql_time(r.expires_at)).collect();
        let rows = run!(self, "batch", |client| {
            Ok::<_, OpError>(
                client
                    .query_typed(
                        &self.inner.sql.batch,
                        &params![
                            c_namespace,
                            c_principal,
                            c_key,
                            c_fingerprint,
                            c_tool_name,
                            c_owner,
                            c_lease,
                            c_now,
                            c_expires,
                            c_scope_limit,
                            c_total_limit,
                            c_shard,
                            c_trace,
                            d_namespace,
                            d_principal,
                            d_key,
                            d_owner,
                            d_kind,
                            d_body,
                            d_completed,
                            d_expires,
                        ],
                    )
                    .await?,
            )
        })?;
        let mut claim_answers: Vec<Option<Answer>> = claims.iter().map(|_| None).collect();
        let mut completion_answers: Vec<Option<Answer>> =
            completions.iter().map(|_| None).collect();
        for row in &rows {
            let (item, state) = item_and_state(row)?;
            let (answers, index) = match item {
                1.. => (&mut claim_answers, item - 1),
                ..=-1 => (&mut completion_answers, -item - 1),
                0 => return Err(corrupt_batch(item, state)),
            };
            let index = usize::try_from(index)
                .ok()
                .filter(|&i| i < answers.len())
                .ok_or_else(|| corrupt_batch(item, state))?;
            answers[index] = Some(match (item > 0, state) {
                (true, 0) => Answer::Claim(ClaimOutcome::Claimed),
                (true, 1) => match decode(&claims[index].id, row, 2) {
                    Ok(record) => Answer::Claim(ClaimOutcome::found(claims[index], record)),
                    Err(corrupt) => Answer::Failed(corrupt.into()),
                },
                (true, _) => Answer::Alone,
                (false, 1) => Answer::Complete(Fenced::Applied),
                (false, _) => Answer::Complete(Fenced::NotOwner),
            });
        }
        // In the order of `jobs`. An operation the function did not answer (it answers every
        // one) runs again alone.
        let mut claim_answers = claim_answers.into_iter();
        let mut completion_answers = completion_answers.into_iter();
        Ok(jobs
            .iter()
            .map(|job| {
                let answer = match job {
                    Job::Claim { .. } => claim_answers.next(),
                    Job::Complete { .. } => completion_answers.next(),
                };
                answer.flatten().unwrap_or(Answer::Alone)
            })
            .collect())
    }
}

fn item_and_state(row: &Row) -> Result<(i32, i16), StoreError> {
    let item: i32 = row
        .try_get(0)
        .map_err(|_| CorruptRecord("unreadable batch item".into()))?;
    let state: i16 = row
        .try_get(1)
        .map_err(|_| CorruptRecord("unreadable batch state".into()))?;
    Ok((item, state))
}

fn corrupt_batch(item: i32, state: i16) -> StoreError {
    StoreError::Corrupt(CorruptRecord(format!(
        "the batch function answered item {item} (state {state}), which it was not given"
    )))
}
