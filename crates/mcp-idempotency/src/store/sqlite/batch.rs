//! Group commit: every operation joins one queue, and one party at a time, the leader, runs what
//! is queued in one write transaction. Under concurrency one commit (SQLite's locks, the WAL
//! frames of the pages the operations share, their system calls) serves many. An operation learns
//! its result only once the transaction it ran in committed.
//!
//! The operation that finds no leader becomes it. It first lets the tasks that are ready to run
//! add their operations (it yields once), then runs one transaction on its own thread, without
//! waiting for SQLite's write lock. Whatever is queued after that, or met another connection's
//! lock, is left to a leader on Tokio's blocking pool, which waits for locks and runs transactions
//! until the queue is empty.
//!
//! A leader that yielded is started by its caller's next poll. A caller that holds its future
//! without polling it (a driver awaiting something else meanwhile) would stall every operation
//! queued behind it: an operation that has waited [`LEADER_STALL`] for a leader that has not
//! started takes the role over and hands the queue to the blocking pool.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::task::Poll;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::connection::{is_lock_conflict, sql_error, wait_for_locks};
use crate::store::{StoreError, StoreFuture};

/// Most operations one transaction runs: bounds how long it holds the write lock (tens of
/// microseconds per operation).
const MAX_BATCH: usize = 64;

/// How long an operation waits for a leader that has not started before it takes the role over.
/// A leader starts within one turn of the runtime when its caller polls it.
const LEADER_STALL: Duration = Duration::from_millis(100);

/// The connection, and the operations waiting for it.
pub(super) struct Writer {
    conn: Mutex<Connection>,
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Box<dyn Job>>,
    /// Whether a leader will run the queued jobs. It stops being one only when it finds the
    /// queue empty, under this lock: a job queued later finds no leader and becomes it.
    led: bool,
    /// Whether the leader has yet to start (it lets ready tasks queue first). Whoever clears it
    /// starts leading: the leader when its caller polls it again, or an operation that waited
    /// [`LEADER_STALL`] for it.
    starting: bool,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

impl Writer {
    pub(super) fn new(conn: Connection) -> Arc<Self> {
        Arc::new(Self {
            conn: Mutex::new(conn),
            queue: Mutex::default(),
        })
    }

    /// Runs `op` inside a write transaction (`BEGIN IMMEDIATE`), with the other operations queued
    /// at the same time, and answers once that transaction committed. `op` may run more than once:
    /// when another operation of its transaction fails, the transaction is rolled back and each
    /// of its operations runs again alone, so that each gets its own answer. Once queued, `op`
    /// runs even if the caller stops waiting.
    pub(super) fn run<T, F>(self: &Arc<Self>, op: F) -> StoreFuture<'static, T>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let writer = Arc::clone(self);
        Box::pin(async move { writer.queue(op).await })
    }

    /// Answers with what `read` finds, when the connection is free: `read` runs at once, outside
    /// any write transaction, so it takes no write lock. When it finds nothing, or the connection
    /// is taken, [`Writer::run`]s `op`. A retry finds its record this way.
    pub(super) fn read_or_run<T, R, F>(self: &Arc<Self>, read: R, op: F) -> StoreFuture<'static, T>
    where
        T: Send + 'static,
        R: FnOnce(&Connection) -> Result<Option<T>, StoreError> + Send + 'static,
        F: Fn(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let writer = Arc::clone(self);
        Box::pin(async move {
            match writer.read_if_free(read) {
                Some(found) => found,
                None => writer.queue(op).await,
            }
        })
    }

    /// `read`'s answer, unless the connection is taken, `read` found nothing, or it met another
    /// connection's lock.
    fn read_if_free<T>(
        &self,
        read: impl FnOnce(&Connection) -> Result<Option<T>, StoreError>,
    ) -> Option<Result<T, StoreError>> {
        let conn = match self.conn.try_lock() {
            Ok(conn) => conn,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        conn.busy_handler(None).ok()?;
        match read(&conn) {
            Ok(Some(found)) => Some(Ok(found)),
            Ok(None) => None,
            Err(err) if is_lock_conflict(&err) => None,
            Err(err) => Some(Err(err)),
        }
    }

    async fn queue<T, F>(self: Arc<Self>, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let leads = {
            let mut queue = self.lock_queue();
            queue.jobs.push_back(Box::new(Queued {
                op,
                result: None,
                reply,
            }));
            let leads = !std::mem::replace(&mut queue.led, true);
            queue.starting |= leads;
            leads
        };
        if leads {
            let leader = Leader(Some(Arc::clone(&self)));
            yield_to_ready_tasks().await;
            leader.lead_here();
        }
        self.answer(answer).await
    }

    /// Waits for `answer`; after [`LEADER_STALL`], starts a leader that has not started.
    async fn answer<T>(
        self: &Arc<Self>,
        mut answer: oneshot::Receiver<Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        // A leader that ran its own transaction has its answer: no timer for it. Outside a
        // runtime there is no timer either: the caller drives everything itself.
        match answer.try_recv() {
            Ok(answered) => return answered,
            Err(oneshot::error::TryRecvError::Closed) => return Err(stopped()),
            Err(oneshot::error::TryRecvError::Empty) => {}
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            if let Ok(answered) = tokio::time::timeout(LEADER_STALL, &mut answer).await {
                return answered.unwrap_or_else(|_| Err(stopped()));
            }
            if self.start_leading() {
                tracing::debug!(
                    "SQLite: a group commit's leader was not polled for {LEADER_STALL:?}; its queue runs on the blocking pool"
                );
                self.drain_elsewhere();
            }
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Whether the caller is the one to start the leader that has yet to start.
    fn start_leading(&self) -> bool {
        std::mem::take(&mut self.lock_queue().starting)
    }

    /// As the leader: runs one transaction on this thread, telling SQLite not to wait for locks,
    /// and leaves what is still queued to a leader that may wait.
    fn lead_here(self: &Arc<Self>) {
        // Only a read (it never waits for a lock) or a leader that just found the queue empty can
        // hold the connection now; either lets it go within microseconds.
        let conn = self.lock_conn();
        if conn.busy_handler(None).is_ok() {
            let batch = self.take_batch();
            if batch.is_empty() {
                return;
            }
            let left = run_batch(&conn, batch, Waits::No);
            // Back at the head of the queue, in their order.
            let mut queue = self.lock_queue();
            for job in left.into_iter().rev() {
                queue.jobs.push_front(job);
            }
        }
        drop(conn);
        if !self.stop_leading_if_empty() {
            self.drain_elsewhere();
        }
    }

    /// Hands the leader's role to [`Writer::drain`] on Tokio's blocking pool (here, outside a
    /// runtime).
    fn drain_elsewhere(self: &Arc<Self>) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let writer = Arc::clone(self);
                drop(runtime.spawn_blocking(move || writer.drain()));
            }
            Err(_) => self.drain(),
        }
    }

    /// As the leader: runs transactions until the queue is empty, waiting for SQLite's write lock
    /// (up to [`BUSY_TIMEOUT`](super::connection::BUSY_TIMEOUT)).
    fn drain(&self) {
        let conn = self.lock_conn();
        let waits = wait_for_locks(&conn);
        loop {
            let batch = self.take_batch();
            if batch.is_empty() {
                return;
            }
            match &waits {
                Ok(()) => {
                    // A connection that waits gives back no operation.
                    let left = run_batch(&conn, batch, Waits::Yes);
                    debug_assert!(left.is_empty());
                }
                Err(err) => {
                    for job in batch {
                        job.fail(StoreError::Backend {
                            message: format!("SQLite cannot wait for locks: {err}"),
                            source: None,
                        });
                    }
                }
            }
        }
    }

    /// The next jobs to run together; none, and no leader any more, when the queue is empty.
    fn take_batch(&self) -> Vec<Box<dyn Job>> {
        let mut queue = self.lock_queue();
        let n = queue.jobs.len().min(MAX_BATCH);
        queue.led = n > 0;
        queue.jobs.drain(..n).collect()
    }

    /// Whether the queue is empty; if so the leader stops being one.
    fn stop_leading_if_empty(&self) -> bool {
        let mut queue = self.lock_queue();
        queue.led = !queue.jobs.is_empty();
        !queue.led
    }

    fn lock_conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Why an operation got no answer.
fn stopped() -> StoreError {
    StoreError::Backend {
        message: "SQLite operation stopped before it answered".into(),
        source: None,
    }
}

/// Lets the tasks that are ready to run go first, so that they queue their operations for the
/// leader's transaction: the task wakes itself, which puts it back at the end of the runtime's
/// queue. `tokio::task::yield_now` would also make the runtime poll for I/O first: one
/// `epoll_wait` more per transaction (docs/benchmarks.md, fifth round of issue 16).
async fn yield_to_ready_tasks() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
}

/// The leader's role, held by the operation that found no leader while it lets other tasks queue
/// theirs. Dropped unused (the caller stopped waiting), it hands the role on, so that what is
/// queued still runs. It does nothing when an operation that waited too long took the role over.
struct Leader(Option<Arc<Writer>>);

impl Leader {
    fn lead_here(mut self) {
        if let Some(writer) = self.0.take() {
            if writer.start_leading() {
                writer.lead_here();
            }
        }
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        if let Some(writer) = self.0.take() {
            if writer.start_leading() {
                writer.drain_elsewhere();
            }
        }
    }
}

/// Whether the connection waits for another connection's write lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waits {
    /// No: an operation that finds the lock held is given back, unchanged, to run again.
    No,
    Yes,
}

/// Runs `jobs` in one transaction and answers them; returns those to run again on a connection
/// that waits (only with [`Waits::No`], when the write lock was held: nothing was written).
fn run_batch(conn: &Connection, mut jobs: Vec<Box<dyn Job>>, waits: Waits) -> Vec<Box<dyn Job>> {
    if jobs.is_empty() {
        return jobs;
    }
    let err = match run_in_one_transaction(conn, &mut jobs) {
        Ok(()) => {
            for job in jobs {
                job.answer();
            }
            return Vec::new();
        }
        Err(err) => err,
    };
    if waits == Waits::No && is_lock_conflict(&err) {
        return jobs;
    }
    if jobs.len() == 1 {
        if let Some(job) = jobs.pop() {
            job.fail(err);
        }
        return Vec::new();
    }
    // One operation failed, or the commit did: the transaction kept nothing. Each runs again alone.
    tracing::debug!(error = %err, operations = jobs.len(), "SQLite: a grouped transaction failed; running its operations one by one");
    jobs.into_iter()
        .flat_map(|job| run_batch(conn, vec![job], waits))
        .collect()
}

fn run_in_one_transaction(conn: &Connection, jobs: &mut [Box<dyn Job>]) -> Result<(), StoreError> {
    let tx = Immediate::begin(conn)?;
    for job in jobs.iter_mut() {
        job.run(&tx)?;
    }
    tx.commit()
}

/// An operation in the queue, with the result of its last run.
trait Job: Send {
    /// Runs the operation in the current transaction and keeps its result.
    fn run(&mut self, tx: &Connection) -> Result<(), StoreError>;
    /// Sends the kept result: its transaction committed.
    fn answer(self: Box<Self>);
    /// Sends `err`: the operation failed, or its transaction did.
    fn fail(self: Box<Self>, err: StoreError);
}

struct Queued<T, F> {
    op: F,
    result: Option<T>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Job for Queued<T, F>
where
    T: Send,
    F: Fn(&Connection) -> Result<T, StoreError> + Send,
{
    fn run(&mut self, tx: &Connection) -> Result<(), StoreError> {
        // A panic fails this operation alone; the others of its transaction run again.
        let result = catch_unwind(AssertUnwindSafe(|| (self.op)(tx))).unwrap_or_else(|_| {
            Err(StoreError::Backend {
                message: "SQLite operation panicked".into(),
                source: None,
            })
        })?;
        self.result = Some(result);
        Ok(())
    }

    fn answer(self: Box<Self>) {
        let answer = self.result.ok_or_else(|| StoreError::Backend {
            message: "SQLite operation answered before it ran".into(),
            source: None,
        });
        // The caller may have stopped waiting; the operation stands all the same.
        let _ = self.reply.send(answer);
    }

    fn fail(self: Box<Self>, err: StoreError) {
        let _ = self.reply.send(Err(err));
    }
}

/// A write transaction that takes SQLite's write lock when it begins (`BEGIN IMMEDIATE`), rolled
/// back when dropped uncommitted. Its three statements are prepared once per connection:
/// rusqlite's own `Transaction` parses `BEGIN` and `COMMIT` anew on every use, which was a quarter
/// of the instructions of a claim and its completion.
struct Immediate<'c> {
    conn: &'c Connection,
}

impl<'c> Immediate<'c> {
    fn begin(conn: &'c Connection) -> Result<Self, StoreError> {
        run_cached(conn, "BEGIN IMMEDIATE")?;
        Ok(Self { conn })
    }

    fn commit(self) -> Result<(), StoreError> {
        // A failed COMMIT may leave the transaction open: the drop then rolls it back.
        run_cached(self.conn, "COMMIT")
    }
}

impl std::ops::Deref for Immediate<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Immediate<'_> {
    fn drop(&mut self) {
        if !self.conn.is_autocommit() {
            if let Err(err) = run_cached(self.conn, "ROLLBACK") {
                tracing::warn!(error = %err, "SQLite: cannot roll back a transaction");
            }
        }
    }
}

fn run_cached(conn: &Connection, sql: &str) -> Result<(), StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute([]))
        .map(drop)
        .map_err(sql_error)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// A writer on a fresh file with a table `t (n)`, and the number of commits SQLite made on it.
    fn writer() -> (tempfile::TempDir, Arc<Writer>, Arc<AtomicUsize>) {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("batch.sqlite3")).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (n INTEGER NOT NULL)")
            .unwrap();
        let commits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&commits);
        conn.commit_hook(Some(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            false
        }));
        (dir, Writer::new(conn), commits)
    }

    type Op = dyn Fn(&Connection) -> Result<i64, StoreError> + Send;

    fn insert(n: i64) -> impl Fn(&Connection) -> Result<i64, StoreError> + Send + 'static {
        move |tx| {
            tx.execute("INSERT INTO t (n) VALUES (?1)", [n])
                .map_err(sql_error)?;
            Ok(n)
        }
    }

    fn rows(writer: &Writer) -> Vec<i64> {
        let conn = writer.conn.lock().unwrap();
        let mut stmt = conn.prepare("SELECT n FROM t ORDER BY n").unwrap();
        let rows = stmt.query_map([], |row| row.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    /// Runs `ops` while another operation holds the connection, so that they all wait in the
    /// queue; that operation's leader then runs them.
    async fn run_queued<F>(writer: &Arc<Writer>, ops: Vec<F>) -> Vec<Result<i64, StoreError>>
    where
        F: Fn(&Connection) -> Result<i64, StoreError> + Send + 'static,
    {
        let (started, has_started) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let busy = tokio::spawn(writer.run(move |_| {
            let _ = started.send(());
            let _ = released.recv_timeout(Duration::from_secs(10));
            Ok(0)
        }));
        tokio::task::spawn_blocking(move || has_started.recv().unwrap())
            .await
            .unwrap();
        let count = ops.len();
        let running: Vec<_> = ops
            .into_iter()
            .map(|op| tokio::spawn(writer.run(op)))
            .collect();
        while writer.lock_queue().jobs.len() < count {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        release.send(()).unwrap();
        assert_eq!(busy.await.unwrap().unwrap(), 0);
        let mut answers = Vec::new();
        for op in running {
            answers.push(op.await.unwrap());
        }
        answers
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn operations_that_wait_for_the_connection_share_one_commit() {
        let (_dir, writer, commits) = writer();
        let count = MAX_BATCH as i64 + 6;
        let answers = run_queued(&writer, (0..count).map(insert).collect()).await;
        let answers: Vec<i64> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(answers, (0..count).collect::<Vec<_>>());
        assert_eq!(rows(&writer), (0..count).collect::<Vec<_>>());
        // The busy operation's, then MAX_BATCH operations', then the last six's.
        assert_eq!(commits.load(Ordering::SeqCst), 3);
    }

    /// A driver that holds a leader's future without polling it again (it awaits something else
    /// meanwhile) does not stall the operations queued behind it: one of them takes the role over
    /// after [`LEADER_STALL`]. The held operation still runs once, and its caller gets its answer
    /// when it polls again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_its_caller_stops_polling_does_not_stall_the_operations_behind_it() {
        let (_dir, writer, _) = writer();
        let mut held = writer.run(insert(1));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(
            held.as_mut().poll(&mut cx).is_pending(),
            "the leader yields first"
        );

        let started = std::time::Instant::now();
        let behind =
            tokio::time::timeout(Duration::from_secs(10), tokio::spawn(writer.run(insert(2))))
                .await
                .expect("the operation behind the held leader is answered")
                .unwrap();
        assert_eq!(behind.unwrap(), 2);
        assert!(started.elapsed() >= LEADER_STALL, "{:?}", started.elapsed());
        assert_eq!(rows(&writer), [1, 2]);

        assert_eq!(held.await.unwrap(), 1);
        assert_eq!(rows(&writer), [1, 2], "the held operation ran once");
        assert!(!writer.lock_queue().led, "no leader is left");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_operation_that_fails_or_panics_fails_alone_and_the_others_of_its_transaction_commit(
    ) {
        let (_dir, writer, commits) = writer();
        let ops: Vec<Box<Op>> = vec![
            Box::new(insert(1)),
            Box::new(|tx: &Connection| {
                insert(2)(tx)?;
                Err(StoreError::Backend {
                    message: "refused".into(),
                    source: None,
                })
            }),
            Box::new(insert(3)),
            Box::new(|tx: &Connection| {
                insert(4)(tx)?;
                panic!("an operation panics")
            }),
            Box::new(insert(5)),
        ];
        let answers = run_queued(&writer, ops).await;
        let described: Vec<String> = answers
            .iter()
            .map(|answer| match answer {
                Ok(n) => n.to_string(),
                Err(err) => err.to_string(),
            })
            .collect();
        assert_eq!(
            described,
            [
                "1",
                "store error: refused",
                "3",
                "store error: SQLite operation panicked",
                "5"
            ]
        );
        // What the failed ones wrote was rolled back with them.
        assert_eq!(rows(&writer), [1, 3, 5]);
        // The busy operation's, then one for each operation that succeeded alone.
        assert_eq!(commits.load(Ordering::SeqCst), 4);
    }
}
