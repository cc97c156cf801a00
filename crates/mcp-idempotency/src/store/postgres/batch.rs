//! Group commit: claims and completions that wait at the same time share one statement, and so one
//! transaction, one round trip and one commit.
//!
//! The operation that finds nobody running one runs alone, as the store always did (the
//! one-statement claim, the completion function): a call at a time costs what it did. While it
//! runs it is the leader, and the claims and completions that come meanwhile queue. When it is
//! done (or its caller stops waiting, or it panics) it hands the queue on to a task, which runs
//! what is queued, at most [`MAX_BATCH`] at a time, as one call of the batch function
//! ([`BATCH_FUNCTION`](super::sql::BATCH_FUNCTION)), until the queue is empty. Under load each
//! commit, with the backend's statement overhead, then serves many calls.
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
//!   did not answer, each gets [`StoreError::Unavailable`], as a lone operation would ("may have
//!   applied": the caller's resend of a claim or completion changes nothing if it did);
//! * an operation whose caller stopped waiting before its batch started is not run.
//!
//! The batch takes its locks in the store's global order (records sorted by key, then scope
//! counter rows, then the store's), so batches of several processes do not deadlock each other or
//! the lone operations (the one exception, with a purge, is in the `sql` module's documentation).

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;
use tokio_postgres::Row;

use super::params::params;
use super::pool::{run, OpError};
use super::quota::{shard_of, sql_limit};
use super::PostgresStore;
use crate::record::{CorruptRecord, Record};
use crate::store::sql_row::{decode, sql_time, sql_token, ClaimColumns};
use crate::store::{ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, StoreError};

/// Most operations one batch runs: bounds the statement's size and how long it holds its locks
/// (tens of microseconds of server time per operation).
const MAX_BATCH: usize = 64;

/// The operations waiting for the leader.
#[derive(Default)]
pub(super) struct Batcher {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    jobs: Vec<Job>,
    /// Whether a leader will run the queued jobs. It stops being one only when it finds the
    /// queue empty, under this lock: an operation that comes later finds no leader and becomes it.
    led: bool,
}

/// An operation waiting in the queue, with where its answer goes.
enum Job {
    Claim {
        req: ClaimRequest,
        reply: oneshot::Sender<Result<ClaimOutcome, StoreError>>,
    },
    Complete {
        req: CompleteRequest,
        reply: oneshot::Sender<Result<Fenced, StoreError>>,
    },
}

impl Job {
    /// Answers with `err`; a caller that stopped waiting needs no answer.
    fn fail(self, err: StoreError) {
        match self {
            Self::Claim { reply, .. } => drop(reply.send(Err(err))),
            Self::Complete { reply, .. } => drop(reply.send(Err(err))),
        }
    }

    /// Whether nobody waits for the answer any more.
    fn abandoned(&self) -> bool {
        match self {
            Self::Claim { reply, .. } => reply.is_closed(),
            Self::Complete { reply, .. } => reply.is_closed(),
        }
    }
}

/// What the batch function answered for one operation.
enum Answer {
    Claimed,
    Found(Result<Record, CorruptRecord>),
    /// Run it again alone.
    Alone,
    Completed(Fenced),
}

/// The leader's role, held by a caller running its own operation or by a task running the queue.
/// Dropped in any way (done, cancelled, or unwinding), it hands the queue on.
struct Lead(PostgresStore);

impl Drop for Lead {
    fn drop(&mut self) {
        self.0.hand_on();
    }
}

/// Why a queued operation got no answer.
fn stopped() -> StoreError {
    StoreError::Backend {
        message: "PostgreSQL operation stopped before it answered".into(),
        source: None,
    }
}

impl Batcher {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue is consistent at every unlock: a panic elsewhere cannot leave it half-changed.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues the [`Job`] that `wrap` makes of `req` when a leader is running (`Ok`: where the
    /// answer will come), or makes the caller the leader and gives `req` back (`Err`).
    fn join<R, T>(
        &self,
        req: R,
        wrap: impl FnOnce(R, oneshot::Sender<Result<T, StoreError>>) -> Job,
    ) -> Result<oneshot::Receiver<Result<T, StoreError>>, R> {
        let mut queue = self.lock();
        if !queue.led {
            queue.led = true;
            return Err(req);
        }
        let (reply, answer) = oneshot::channel();
        queue.jobs.push(wrap(req, reply));
        Ok(answer)
    }

    /// Up to [`MAX_BATCH`] queued jobs whose callers still wait, oldest first.
    fn take(&self) -> Vec<Job> {
        let mut queue = self.lock();
        queue.jobs.retain(|job| !job.abandoned());
        let n = queue.jobs.len().min(MAX_BATCH);
        queue.jobs.drain(..n).collect()
    }
}

impl PostgresStore {
    /// Claims `req`, alone or in a batch (see the module documentation).
    pub(super) async fn claim_grouped(
        &self,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        let wrap = |req: &ClaimRequest, reply| Job::Claim {
            req: req.clone(),
            reply,
        };
        match self.inner.batcher.join(req, wrap) {
            Ok(answer) => answer.await.unwrap_or_else(|_| Err(stopped())),
            Err(req) => {
                let _lead = Lead(self.clone());
                self.claim_alone(req).await
            }
        }
    }

    /// Records `req`'s outcome, alone or in a batch (see the module documentation).
    pub(super) async fn complete_grouped(
        &self,
        req: CompleteRequest,
    ) -> Result<Fenced, StoreError> {
        let wrap = |req, reply| Job::Complete { req, reply };
        match self.inner.batcher.join(req, wrap) {
            Ok(answer) => answer.await.unwrap_or_else(|_| Err(stopped())),
            Err(req) => {
                let _lead = Lead(self.clone());
                self.complete_alone(&req).await
            }
        }
    }

    /// As the leader stepping down: gives the role up if nothing is queued, otherwise hands it to
    /// a task that runs the queue.
    fn hand_on(&self) {
        let mut queue = self.inner.batcher.lock();
        if queue.jobs.is_empty() {
            queue.led = false;
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                drop(queue);
                runtime.spawn(run_queue(self.clone()));
            }
            Err(_) => {
                // No runtime left to run them (the process is ending): their callers get
                // `stopped()`.
                queue.led = false;
                queue.jobs.clear();
            }
        }
    }

    /// Runs `jobs`: one alone as it is, several in one statement.
    async fn run_batch(&self, jobs: Vec<Job>) {
        if jobs.len() == 1 {
            for job in jobs {
                self.run_alone(job).await;
            }
            return;
        }
        match self.batch(&jobs).await {
            Ok(answers) => {
                for (job, answer) in jobs.into_iter().zip(answers) {
                    self.deliver(job, answer);
                }
            }
            Err(StoreError::Unavailable { message, .. }) => {
                for job in jobs {
                    job.fail(StoreError::Unavailable {
                        message: message.clone(),
                        source: None,
                    });
                }
            }
            Err(err) => {
                tracing::debug!(error = %err, operations = jobs.len(), "PostgreSQL batch failed; running its operations alone");
                for job in jobs {
                    self.deliver(job, Answer::Alone);
                }
            }
        }
    }

    /// Sends `job` the batch's `answer`, or runs it alone (in a task of its own, so that the
    /// queue moves on) when the batch left it to that.
    fn deliver(&self, job: Job, answer: Answer) {
        let job = match (job, answer) {
            (Job::Claim { reply, .. }, Answer::Claimed) => {
                let _ = reply.send(Ok(ClaimOutcome::Claimed));
                return;
            }
            (Job::Claim { req, reply }, Answer::Found(found)) => {
                let _ = reply.send(
                    found
                        .map(|record| ClaimOutcome::found(&req, record))
                        .map_err(StoreError::Corrupt),
                );
                return;
            }
            (Job::Complete { reply, .. }, Answer::Completed(fenced)) => {
                let _ = reply.send(Ok(fenced));
                return;
            }
            (job, _) => job,
        };
        tokio::spawn({
            let store = self.clone();
            async move { store.run_alone(job).await }
        });
    }

    async fn run_alone(&self, job: Job) {
        // A caller that stopped waiting needs no answer.
        match job {
            Job::Claim { req, reply } => drop(reply.send(self.claim_alone(&req).await)),
            Job::Complete { req, reply } => drop(reply.send(self.complete_alone(&req).await)),
        }
    }

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
                (true, 0) => Answer::Claimed,
                (true, 1) => Answer::Found(decode(&claims[index].id, row, 2)),
                (true, _) => Answer::Alone,
                (false, 1) => Answer::Completed(Fenced::Applied),
                (false, _) => Answer::Completed(Fenced::NotOwner),
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

/// Runs the queue as the leader until it is empty.
async fn run_queue(store: PostgresStore) {
    let _lead = Lead(store.clone());
    loop {
        let jobs = store.inner.batcher.take();
        if jobs.is_empty() {
            return;
        }
        store.run_batch(jobs).await;
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
