//! The model store: what the real stores promise, kept in memory, with the faults of a real one.
//!
//! [`ModelStore`] implements every operation of the library's [`Store`] trait as one atomic step
//! on a map of records, with the trait's semantics: fencing tokens, the caller's `now` (never a
//! clock of its own), expired records counting as absent, exact quotas over live records, and
//! every row of the trait's "sent twice" table. What it adds is durability as a real store has
//! it: each write gets a place in a log ([`WriteSeq`]), becomes durable when the store answers it
//! ([`ModelStore::acknowledge`]), and a [`restart`](ModelStore::restart) undoes every write that
//! is not durable, or, as an opt-in fault, the last acknowledged ones too. `docs/reliability.md`
//! ("The simulator's store model") says which behaviour of each real store this stands for.
//!
//! Everything is deterministic: records are kept in key order, and nothing depends on a clock,
//! a hash seed or randomness.

mod durability;
mod state;
#[cfg(test)]
mod tests;

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, Store, StoreFuture,
    StoreStats, TakeOverRequest,
};
use mcp_idempotency::{FencingToken, Record, RecordId, Timestamp};

use self::durability::UndoLog;
use self::state::{key_of, Records};

/// One store operation, as the [`Store`] trait's methods take them.
#[derive(Clone, Debug)]
pub enum Op {
    /// [`Store::claim`].
    Claim(ClaimRequest),
    /// [`Store::complete`].
    Complete(CompleteRequest),
    /// [`Store::take_over`].
    TakeOver(TakeOverRequest),
    /// [`Store::renew`].
    Renew {
        /// The record.
        id: RecordId,
        /// The token that must own it.
        owner: FencingToken,
        /// The new lease deadline.
        lease_expires_at: Timestamp,
    },
    /// [`Store::release`].
    Release {
        /// The record.
        id: RecordId,
        /// The token that must own it.
        owner: FencingToken,
    },
    /// [`Store::get`].
    Get {
        /// The record.
        id: RecordId,
        /// The caller's time.
        now: Timestamp,
    },
    /// [`Store::purge_expired`].
    PurgeExpired {
        /// The caller's time.
        now: Timestamp,
    },
    /// [`Store::stats`].
    Stats {
        /// The caller's time.
        now: Timestamp,
    },
    /// [`Store::list`].
    List {
        /// Which records.
        filter: ListFilter,
        /// The caller's time.
        now: Timestamp,
        /// At most this many.
        limit: usize,
    },
    /// [`Store::delete`].
    Delete {
        /// The record.
        id: RecordId,
    },
}

/// The answer to an [`Op`]: the value its [`Store`] method returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// To [`Op::Claim`].
    Claim(ClaimOutcome),
    /// To [`Op::Complete`], [`Op::TakeOver`], [`Op::Renew`] and [`Op::Release`].
    Fenced(Fenced),
    /// To [`Op::Get`].
    Record(Option<Record>),
    /// To [`Op::PurgeExpired`]: how many records it deleted.
    Count(u64),
    /// To [`Op::Stats`].
    Stats(StoreStats),
    /// To [`Op::List`].
    Records(Vec<Record>),
    /// To [`Op::Delete`]: whether there was a record.
    Deleted(bool),
}

/// A write's place in the store's log (operations that changed nothing have none). Later writes
/// have greater numbers; numbers are never reused, not even after a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct WriteSeq(u64);

/// A model of a shared store: every operation atomic, every time the caller's, every write
/// durable only once acknowledged. `Send + Sync`: the simulation's tasks share it.
#[derive(Debug, Default)]
pub struct ModelStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    records: Records,
    log: UndoLog,
}

impl Inner {
    fn apply(&mut self, op: &Op) -> (Answer, Option<WriteSeq>) {
        let (answer, before) = self.records.apply(op);
        let seq = (!before.is_empty()).then(|| self.log.push(before));
        (answer, seq)
    }
}

impl ModelStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every operation runs to its end under the lock or panics before writing (a panic here
        // is a bug the simulation reports anyway), so a poisoned lock is kept in use.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `op` atomically; returns its answer and, if it changed anything, its [`WriteSeq`].
    /// The write is not durable until [acknowledged](Self::acknowledge).
    pub fn apply(&self, op: &Op) -> (Answer, Option<WriteSeq>) {
        self.lock().apply(op)
    }

    /// The store answered write `seq`: it is durable, and so is every earlier write (a log
    /// flushed in order, as PostgreSQL's WAL with `synchronous_commit = on`).
    pub fn acknowledge(&self, seq: WriteSeq) {
        self.lock().log.acknowledge(seq);
    }

    /// A restart: every write not acknowledged is undone, newest first; with
    /// `lose_acknowledged = n` (the opt-in fault: a Redis failover without `WAIT`) the last `n`
    /// acknowledged writes are undone too, as far as the log still remembers them (the last 64).
    /// Returns the ids of the records whose state changed, in key order (scope, then key).
    pub fn restart(&self, lose_acknowledged: usize) -> Vec<RecordId> {
        let mut inner = self.lock();
        let lost = inner.log.take_lost(lose_acknowledged);
        // Each touched record as it was before the restart.
        let mut touched = BTreeMap::new();
        for write in &lost {
            for (id, _) in &write.before {
                if let Entry::Vacant(slot) = touched.entry(key_of(id)) {
                    let held = inner.records.get(slot.key()).cloned();
                    slot.insert((id.clone(), held));
                }
            }
        }
        for write in lost {
            debug_assert!(!write.before.is_empty(), "write {:?} is logged", write.seq);
            inner.records.undo(write.before);
        }
        touched
            .into_iter()
            .filter(|(key, (_, held))| inner.records.get(key) != held.as_ref())
            .map(|(_, (id, _))| id)
            .collect()
    }

    /// Every record held, expired ones too, in key order (scope, then key): for the invariant
    /// checks.
    pub fn records(&self) -> Vec<Record> {
        self.lock().records.all()
    }

    /// Applies `op` and acknowledges it at once: the [`Store`] trait's operations, on a store
    /// that never loses an answer.
    fn run(&self, op: Op) -> Answer {
        let mut inner = self.lock();
        let (answer, seq) = inner.apply(&op);
        if let Some(seq) = seq {
            inner.log.acknowledge(seq);
        }
        answer
    }
}

/// A finished future of `value`.
fn ready<'a, T: Send + 'a>(value: T) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(Ok(value)))
}

/// Panics: `op` answered with another kind of [`Answer`] than its own, which `Records::apply`
/// never does.
fn wrong_answer(op: &str, answer: Answer) -> ! {
    unreachable!("{op} answers its own kind of Answer, not {answer:?}")
}

impl Store for ModelStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        match self.run(Op::Claim(req.clone())) {
            Answer::Claim(outcome) => ready(outcome),
            other => wrong_answer("claim", other),
        }
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        match self.run(Op::Complete(req)) {
            Answer::Fenced(fenced) => ready(fenced),
            other => wrong_answer("complete", other),
        }
    }

    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        match self.run(Op::TakeOver(req.clone())) {
            Answer::Fenced(fenced) => ready(fenced),
            other => wrong_answer("take_over", other),
        }
    }

    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease_expires_at: Timestamp,
    ) -> StoreFuture<'a, Fenced> {
        let op = Op::Renew {
            id: id.clone(),
            owner,
            lease_expires_at,
        };
        match self.run(op) {
            Answer::Fenced(fenced) => ready(fenced),
            other => wrong_answer("renew", other),
        }
    }

    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        let op = Op::Release {
            id: id.clone(),
            owner,
        };
        match self.run(op) {
            Answer::Fenced(fenced) => ready(fenced),
            other => wrong_answer("release", other),
        }
    }

    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>> {
        match self.run(Op::Get {
            id: id.clone(),
            now,
        }) {
            Answer::Record(record) => ready(record),
            other => wrong_answer("get", other),
        }
    }

    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64> {
        match self.run(Op::PurgeExpired { now }) {
            Answer::Count(purged) => ready(purged),
            other => wrong_answer("purge_expired", other),
        }
    }

    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        match self.run(Op::Stats { now }) {
            Answer::Stats(stats) => ready(stats),
            other => wrong_answer("stats", other),
        }
    }

    fn list<'a>(
        &'a self,
        filter: &'a ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Record>> {
        let op = Op::List {
            filter: filter.clone(),
            now,
            limit,
        };
        match self.run(op) {
            Answer::Records(records) => ready(records),
            other => wrong_answer("list", other),
        }
    }

    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        match self.run(Op::Delete { id: id.clone() }) {
            Answer::Deleted(deleted) => ready(deleted),
            other => wrong_answer("delete", other),
        }
    }
}
