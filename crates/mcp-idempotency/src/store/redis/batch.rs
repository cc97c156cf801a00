//! On one server (one shard) with `replicas=N`, claims and completions that wait at the same time
//! share one script call: one `EVALSHA` and one `WAIT` for several operations. The queue and the
//! leader are the shared ones of `store::batch`.
//!
//! Why only then: `WAIT` blocks the connection it is sent on until the replicas acknowledge, and
//! one server means one connection, so writes that wait for replicas went one at a time, each
//! paying the replicas' round trip; a batch pays it once for many. Without `replicas`, the
//! connection already carries the operations in flight together (the `redis` crate pipelines
//! them) and the server's work is the scripts' own: batches measured no cheaper. On a cluster,
//! the calls in flight spread over eight shards leave one or two operations per shard's queue, so
//! batches seldom form and an operation that queues waits for the one in flight instead of going
//! out beside it: measured dearer, with replicas or not (docs/benchmarks.md, seventh round).
//!
//! The batch script (`batch.lua`) runs each operation with the function its own script runs
//! (`writes.lua`), one after the other, so each sees the writes of those before it: a key claimed
//! twice in one batch is claimed once, and quotas stay exact. Each operation gets what its own
//! script would have answered. A batch that fails as a whole (a script error, such as a key of
//! the wrong type) may have applied the operations before the failing one; each then runs again
//! alone, and each is safe to run twice (a resent claim finds its own owner, a resent completion
//! finds its own outcome). A batch the server did not answer, or that fewer than `N` replicas
//! acknowledged in time, answers each `Unavailable`, as a lone operation would.

use redis::{FromRedisValue, Value};

use super::server::{ScriptCall, ARG_ROOM, SCRIPTS};
use super::{claim_bytes, claim_outcome, complete_bytes, RedisStore};
use crate::store::batch::{Answer, Batcher, Grouped, Job};
use crate::store::{ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, StoreError, StoreFuture};

impl Grouped for RedisStore {
    const NAME: &'static str = "Redis";

    fn batcher(&self) -> &Batcher {
        &self.batcher
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

impl RedisStore {
    /// Runs `jobs` (all of the store's one shard) as one call of the batch script; the answers
    /// are in the order of `jobs`.
    async fn batch(&self, jobs: &[Job]) -> Result<Vec<Answer>, StoreError> {
        let records: Vec<_> = jobs
            .iter()
            .map(|job| match job {
                Job::Claim { req, .. } => self.keys.of_record(&req.id),
                Job::Complete { req, .. } => self.keys.of_record(&req.id),
            })
            .collect();
        let Some(shard) = records.first().map(|record| record.shard) else {
            return Ok(Vec::new());
        };
        let mut keys: Vec<&str> = Vec::with_capacity(2 + 2 * jobs.len());
        keys.extend([shard.all.as_str(), shard.running.as_str()]);
        for record in &records {
            keys.extend([record.record.as_str(), record.scope.as_str()]);
        }
        // Each operation: its letter, its member, its arguments.
        let bytes: usize = jobs
            .iter()
            .zip(&records)
            .map(|(job, record)| {
                let more = match job {
                    Job::Claim { req, .. } => claim_bytes(req),
                    Job::Complete { req, .. } => complete_bytes(req),
                };
                1 + record.member.len() + ARG_ROOM + more
            })
            .sum();
        let mut call = ScriptCall::new(&SCRIPTS.batch, &keys, bytes);
        for (job, record) in jobs.iter().zip(&records) {
            match job {
                Job::Claim { req, .. } => {
                    call.arg("c").arg(&record.member);
                    self.claim_args(&mut call, req, shard);
                }
                Job::Complete { req, .. } => {
                    call.arg("d").arg(&record.member);
                    self.complete_args(&mut call, req);
                }
            }
        }
        let replies: Vec<Value> = self.invoke_write("batch", shard, &call).await?;
        if replies.len() != jobs.len() {
            return Err(StoreError::Backend {
                message: format!(
                    "the Redis batch script answered {} of {} operations",
                    replies.len(),
                    jobs.len()
                ),
                source: None,
            });
        }
        Ok(jobs
            .iter()
            .zip(replies)
            .map(|(job, reply)| match job {
                Job::Claim { req, .. } => match Vec::<Option<Vec<u8>>>::from_redis_value(reply) {
                    Ok(reply) => match claim_outcome(req, reply) {
                        Ok(outcome) => Answer::Claim(outcome),
                        Err(err) => Answer::Failed(err),
                    },
                    Err(_) => Answer::Alone,
                },
                Job::Complete { .. } => match i64::from_redis_value(reply) {
                    Ok(1) => Answer::Complete(Fenced::Applied),
                    Ok(_) => Answer::Complete(Fenced::NotOwner),
                    Err(_) => Answer::Alone,
                },
            })
            .collect())
    }
}
