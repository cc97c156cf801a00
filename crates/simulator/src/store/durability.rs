//! The model store's log of writes: which are durable, and how to undo the others at a restart.
//!
//! Each write keeps the records it changed as they were before it (its undo entry). A write is
//! durable once it, or any later write, is acknowledged: the log is flushed in order, as
//! PostgreSQL's WAL with `synchronous_commit = on`. A restart undoes every write that is not
//! durable, newest first; the opt-in fault of losing acknowledged writes (a Redis failover without
//! `WAIT`) undoes the newest durable ones too, as far as the log still holds them.

use std::collections::VecDeque;

use mcp_idempotency::{Record, RecordId};

use super::WriteSeq;

/// How many durable writes the log keeps, for a restart that loses acknowledged writes. Older
/// ones can no longer be undone.
pub(super) const DURABLE_HISTORY: usize = 64;

/// One write: each record it changed, as it was before (`None`: absent), one entry per record.
#[derive(Debug)]
pub(super) struct Write {
    pub(super) seq: WriteSeq,
    pub(super) before: Vec<(RecordId, Option<Record>)>,
}

/// The writes a restart may undo, oldest first.
#[derive(Debug, Default)]
pub(super) struct UndoLog {
    /// The last sequence number given out (0: none yet). Numbers are never reused, not even
    /// those of undone writes, so a late acknowledgement cannot name a newer write.
    last_seq: u64,
    /// Every write up to this number is durable (0: none).
    durable: u64,
    /// The writes that are not durable, and up to [`DURABLE_HISTORY`] durable ones before them.
    writes: VecDeque<Write>,
}

impl UndoLog {
    /// Logs a write that changed the records in `before` (not empty); returns its number.
    pub(super) fn push(&mut self, before: Vec<(RecordId, Option<Record>)>) -> WriteSeq {
        self.last_seq += 1;
        let seq = WriteSeq(self.last_seq);
        self.writes.push_back(Write { seq, before });
        seq
    }

    /// Makes `seq` and every earlier write durable.
    pub(super) fn acknowledge(&mut self, seq: WriteSeq) {
        self.durable = self.durable.max(seq.0);
        // The durable writes are the oldest ones: a prefix of the log.
        let durable = self
            .writes
            .iter()
            .take_while(|write| write.seq.0 <= self.durable)
            .count();
        for _ in DURABLE_HISTORY..durable {
            self.writes.pop_front();
        }
    }

    /// Takes out of the log the writes a restart undoes, newest first: every write that is not
    /// durable, then the newest `lose_acknowledged` durable ones the log still holds.
    pub(super) fn take_lost(&mut self, lose_acknowledged: usize) -> Vec<Write> {
        let mut lost = Vec::new();
        while let Some(write) = self.writes.pop_back() {
            if write.seq.0 <= self.durable {
                self.writes.push_back(write);
                break;
            }
            lost.push(write);
        }
        for _ in 0..lose_acknowledged {
            match self.writes.pop_back() {
                Some(write) => lost.push(write),
                None => break,
            }
        }
        lost
    }
}
