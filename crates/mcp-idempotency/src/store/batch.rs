//! Operations that wait at the same time share one exchange with the server: the queue and the
//! leader's role, shared by the stores that send claims and completions over a network
//! (PostgreSQL: one statement, transaction and commit; Redis: one script call).
//!
//! The operation that finds nobody running one runs alone, as the store always did: a call at a
//! time costs what it did. While it runs it is the leader, and the claims and completions that
//! come meanwhile queue. When it is done (or its caller stops waiting, or it panics) it hands the
//! queue on to a task, which runs what is queued, at most [`MAX_BATCH`] at a time, with
//! [`Grouped::run_together`], until the queue is empty. Under load each exchange, with the
//! server's fixed cost per request, then serves many calls.
//!
//! Each operation keeps its own answer: the store answers each job of a batch on its own
//! ([`Answer`]), and may leave one to run again alone. An operation whose caller stopped waiting
//! before its batch started is not run. [`after_failure`] is what each job of a batch that failed
//! as a whole gets.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use super::{ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, StoreError, StoreFuture};

/// Most operations one batch runs: bounds the exchange's size and how long it holds the server
/// (tens of microseconds of server time per operation).
pub(super) const MAX_BATCH: usize = 64;

/// A store that groups its claims and completions. Cloning is cheap and shares the store.
pub(super) trait Grouped: Clone + Send + Sync + 'static {
    /// The store's name, for messages.
    const NAME: &'static str;

    /// The queue of the store (or of the part of it that `self` stands for).
    fn batcher(&self) -> &Batcher;

    /// Claims `req` in an exchange of its own.
    fn claim_alone<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome>;

    /// Records `req`'s outcome in an exchange of its own.
    fn complete_alone<'a>(&'a self, req: &'a CompleteRequest) -> StoreFuture<'a, Fenced>;

    /// Runs two or more `jobs` in one exchange; one answer per job, in the order of `jobs`, or
    /// the error that failed the exchange as a whole (see [`after_failure`]).
    fn run_together<'a>(&'a self, jobs: &'a [Job]) -> StoreFuture<'a, Vec<Answer>>;
}

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
pub(super) enum Job {
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

/// What a batch answered for one of its jobs.
pub(super) enum Answer {
    /// The claim's outcome (for a claim job).
    Claim(ClaimOutcome),
    /// The completion's outcome (for a completion job).
    Complete(Fenced),
    /// The job's own error.
    Failed(StoreError),
    /// Run it again alone.
    Alone,
}

/// What each of `jobs` gets when their batch failed with `err` as a whole: when the server could
/// not be reached or did not answer, each gets [`StoreError::Unavailable`], as a lone operation
/// would ("may have applied": a resent claim or completion changes nothing if it did); when the
/// server answered with an error, each runs again alone to get its own answer.
fn after_failure(name: &str, jobs: &[Job], err: StoreError) -> Vec<Answer> {
    match err {
        StoreError::Unavailable { message, .. } => jobs
            .iter()
            .map(|_| {
                Answer::Failed(StoreError::Unavailable {
                    message: message.clone(),
                    source: None,
                })
            })
            .collect(),
        err => {
            tracing::debug!(error = %err, operations = jobs.len(), "{name} batch failed; running its operations alone");
            jobs.iter().map(|_| Answer::Alone).collect()
        }
    }
}

/// The leader's role, held by a caller running its own operation or by a task running the queue.
/// Dropped in any way (done, cancelled, or unwinding), it hands the queue on.
struct Lead<S: Grouped>(S);

impl<S: Grouped> Drop for Lead<S> {
    fn drop(&mut self) {
        hand_on(&self.0);
    }
}

/// Why a queued operation got no answer.
fn stopped(name: &str) -> StoreError {
    StoreError::Backend {
        message: format!("{name} operation stopped before it answered"),
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

/// Claims `req` on `store`, alone or in a batch (see the module documentation).
pub(super) async fn claim<S: Grouped>(
    store: &S,
    req: &ClaimRequest,
) -> Result<ClaimOutcome, StoreError> {
    let wrap = |req: &ClaimRequest, reply| Job::Claim {
        req: req.clone(),
        reply,
    };
    match store.batcher().join(req, wrap) {
        Ok(answer) => answer.await.unwrap_or_else(|_| Err(stopped(S::NAME))),
        Err(req) => {
            let _lead = Lead(store.clone());
            store.claim_alone(req).await
        }
    }
}

/// Records `req`'s outcome on `store`, alone or in a batch (see the module documentation).
pub(super) async fn complete<S: Grouped>(
    store: &S,
    req: CompleteRequest,
) -> Result<Fenced, StoreError> {
    let wrap = |req, reply| Job::Complete { req, reply };
    match store.batcher().join(req, wrap) {
        Ok(answer) => answer.await.unwrap_or_else(|_| Err(stopped(S::NAME))),
        Err(req) => {
            let _lead = Lead(store.clone());
            store.complete_alone(&req).await
        }
    }
}

/// As the leader stepping down: gives the role up if nothing is queued, otherwise hands it to a
/// task that runs the queue.
fn hand_on<S: Grouped>(store: &S) {
    let mut queue = store.batcher().lock();
    if queue.jobs.is_empty() {
        queue.led = false;
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            drop(queue);
            runtime.spawn(run_queue(store.clone()));
        }
        Err(_) => {
            // No runtime left to run them (the process is ending): their callers get `stopped`.
            queue.led = false;
            queue.jobs.clear();
        }
    }
}

/// Runs the queue as the leader until it is empty.
async fn run_queue<S: Grouped>(store: S) {
    let _lead = Lead(store.clone());
    loop {
        let jobs = store.batcher().take();
        if jobs.is_empty() {
            return;
        }
        run_batch(&store, jobs).await;
    }
}

/// Runs `jobs`: one alone as it is, several together.
async fn run_batch<S: Grouped>(store: &S, jobs: Vec<Job>) {
    if jobs.len() == 1 {
        for job in jobs {
            run_alone(store, job).await;
        }
        return;
    }
    let answers = match store.run_together(&jobs).await {
        Ok(answers) => answers,
        Err(err) => after_failure(S::NAME, &jobs, err),
    };
    let mut answers = answers.into_iter();
    for job in jobs {
        // A job the store did not answer (it answers every one) runs again alone.
        deliver(store, job, answers.next().unwrap_or(Answer::Alone));
    }
}

/// Sends `job` the batch's `answer`, or runs it alone (in a task of its own, so that the queue
/// moves on) when the batch left it to that or answered it as another kind of job.
fn deliver<S: Grouped>(store: &S, job: Job, answer: Answer) {
    let job = match (job, answer) {
        (Job::Claim { reply, .. }, Answer::Claim(outcome)) => {
            let _ = reply.send(Ok(outcome));
            return;
        }
        (Job::Complete { reply, .. }, Answer::Complete(fenced)) => {
            let _ = reply.send(Ok(fenced));
            return;
        }
        (job, Answer::Failed(err)) => {
            job.fail(err);
            return;
        }
        (job, _) => job,
    };
    tokio::spawn({
        let store = store.clone();
        async move { run_alone(&store, job).await }
    });
}

async fn run_alone<S: Grouped>(store: &S, job: Job) {
    // A caller that stopped waiting needs no answer.
    match job {
        Job::Claim { req, reply } => drop(reply.send(store.claim_alone(&req).await)),
        Job::Complete { req, reply } => drop(reply.send(store.complete_alone(&req).await)),
    }
}
