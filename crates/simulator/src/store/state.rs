//! The records the model store holds, and what each operation does to them.
//!
//! Records live in a `BTreeMap` keyed by scope and stored key, so that every iteration (purge,
//! stats, list, the invariant checks) goes in one order, the same in every run. Quotas keep no
//! counters: a claim counts the records held when it needs to (the whole map for the store, one
//! range of it for a scope), so undoing a write can never leave a count behind.

use mcp_idempotency::simulation::{is_on, Mutant};
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, QuotaExceeded, StoreStats,
    TakeOverRequest,
};
use mcp_idempotency::{FencingToken, Record, RecordId, RecordState, Scope, Timestamp};

use super::{Answer, Op};

/// Where a record is kept: its scope and its key as stored ([`IdempotencyKey::as_str`]).
///
/// [`IdempotencyKey::as_str`]: mcp_idempotency::IdempotencyKey::as_str
pub(super) type Key = (Scope, String);

/// The map key of `id`.
pub(super) fn key_of(id: &RecordId) -> Key {
    (id.scope.clone(), id.key.as_str().to_owned())
}

/// Every record held, expired ones too (until a purge, a delete or a claim of their key).
#[derive(Debug, Default)]
pub(super) struct Records {
    map: BTreeMap<Key, Record>,
}

impl Records {
    /// Applies `op`; returns its answer and the records it changed, as they were before (empty
    /// when it changed nothing).
    pub(super) fn apply(&mut self, op: &Op) -> (Answer, Vec<(RecordId, Option<Record>)>) {
        let mut tx = Tx {
            map: &mut self.map,
            before: BTreeMap::new(),
        };
        let answer = match op {
            Op::Claim(req) => Answer::Claim(tx.claim(req)),
            Op::Complete(req) => Answer::Fenced(tx.complete(req)),
            Op::TakeOver(req) => Answer::Fenced(tx.take_over(req)),
            Op::Renew {
                id,
                owner,
                lease_expires_at,
            } => Answer::Fenced(tx.renew(id, *owner, *lease_expires_at)),
            Op::Release { id, owner } => Answer::Fenced(tx.release(id, *owner)),
            Op::Get { id, now } => Answer::Record(tx.live(id, *now).cloned()),
            Op::PurgeExpired { now } => Answer::Count(tx.purge(*now)),
            Op::Stats { now } => Answer::Stats(tx.stats(*now)),
            Op::List { filter, now, limit } => Answer::Records(tx.list(filter, *now, *limit)),
            Op::Delete { id } => Answer::Deleted(tx.remove(id).is_some()),
        };
        (answer, tx.changes())
    }

    /// Puts back the records a write changed, as they were before it.
    pub(super) fn undo(&mut self, before: Vec<(RecordId, Option<Record>)>) {
        for (id, record) in before {
            match record {
                Some(record) => self.map.insert(key_of(&id), record),
                None => self.map.remove(&key_of(&id)),
            };
        }
    }

    /// The record held for `key`, expired or not.
    pub(super) fn get(&self, key: &Key) -> Option<&Record> {
        self.map.get(key)
    }

    /// Every record held, in key order.
    pub(super) fn all(&self) -> Vec<Record> {
        self.map.values().cloned().collect()
    }
}

/// One operation under way: the map, and each record it changed as it was before (the first
/// value seen for each key).
struct Tx<'a> {
    map: &'a mut BTreeMap<Key, Record>,
    before: BTreeMap<Key, (RecordId, Option<Record>)>,
}

impl Tx<'_> {
    /// The records this operation changed, as they were before; a record written back as it was
    /// (a renewal to the same deadline) is no change.
    fn changes(self) -> Vec<(RecordId, Option<Record>)> {
        let map = self.map;
        self.before
            .into_iter()
            .filter(|(key, (_, before))| map.get(key) != before.as_ref())
            .map(|(_, change)| change)
            .collect()
    }

    fn remember(&mut self, id: &RecordId, key: &Key) {
        if let Entry::Vacant(slot) = self.before.entry(key.clone()) {
            slot.insert((id.clone(), self.map.get(key).cloned()));
        }
    }

    fn put(&mut self, record: Record) {
        let key = key_of(&record.id);
        self.remember(&record.id, &key);
        self.map.insert(key, record);
    }

    fn remove(&mut self, id: &RecordId) -> Option<Record> {
        let key = key_of(id);
        self.remember(id, &key);
        self.map.remove(&key)
    }

    fn held(&self, id: &RecordId) -> Option<&Record> {
        self.map.get(&key_of(id))
    }

    fn live(&self, id: &RecordId, now: Timestamp) -> Option<&Record> {
        self.held(id).filter(|record| !record.is_expired(now))
    }

    /// The in-progress record of `id` if `owner` holds it, expired or not (as every real store:
    /// complete, renew and release check the token, not the time).
    fn owned(&self, id: &RecordId, owner: FencingToken) -> Option<&Record> {
        self.held(id).filter(|record| {
            matches!(record.state, RecordState::InProgress { owner: current, .. } if current == owner)
        })
    }

    fn claim(&mut self, req: &ClaimRequest) -> ClaimOutcome {
        match self.held(&req.id) {
            Some(record) if !record.is_expired(req.now) => {
                return ClaimOutcome::found(req, record.clone())
            }
            // An expired record is replaced in place and keeps its place in the quotas (as in
            // the memory, SQLite and PostgreSQL stores).
            Some(_) => {}
            None => {
                if let Some(quota) = self.over_quota(req) {
                    // Purge once, then count again: only live records count.
                    if self.purge(req.now) == 0 {
                        return ClaimOutcome::QuotaExceeded(quota);
                    }
                    if let Some(quota) = self.over_quota(req) {
                        return ClaimOutcome::QuotaExceeded(quota);
                    }
                }
            }
        }
        self.put(Record {
            trace: req.trace,
            id: req.id.clone(),
            fingerprint: req.fingerprint,
            tool_name: req.tool_name.to_string(),
            state: RecordState::InProgress {
                owner: req.owner,
                lease_expires_at: req.lease_expires_at,
            },
            created_at: req.now,
            expires_at: req.expires_at,
        });
        ClaimOutcome::Claimed
    }

    /// The quota one more record would break, counting every record held (the store's first,
    /// then the scope's, as every real store checks them).
    fn over_quota(&self, req: &ClaimRequest) -> Option<QuotaExceeded> {
        let limits = req.limits;
        if self.map.len() as u64 >= limits.max_records_total {
            return Some(QuotaExceeded::Total {
                limit: limits.max_records_total,
            });
        }
        let scope = &req.id.scope;
        let in_scope = self
            .map
            .range((scope.clone(), String::new())..)
            .take_while(|((held, _), _)| held == scope)
            .count() as u64;
        (in_scope >= limits.max_records_per_scope).then_some(QuotaExceeded::Scope {
            limit: limits.max_records_per_scope,
        })
    }

    fn complete(&mut self, req: &CompleteRequest) -> Fenced {
        let Some(record) = self.held(&req.id) else {
            return Fenced::NotOwner;
        };
        let sent_again = matches!(
            &record.state,
            RecordState::Completed { outcome, completed_at }
                if *outcome == req.outcome
                    && *completed_at == req.completed_at
                    && record.expires_at == req.expires_at
        );
        if sent_again {
            return Fenced::Applied;
        }
        let owned = if is_on(Mutant::CompleteUnfenced) {
            self.held(&req.id)
        } else {
            self.owned(&req.id, req.owner)
        };
        let Some(record) = owned else {
            return Fenced::NotOwner;
        };
        let completed = Record {
            state: RecordState::Completed {
                outcome: req.outcome.clone(),
                completed_at: req.completed_at,
            },
            expires_at: req.expires_at,
            ..record.clone()
        };
        self.put(completed);
        Fenced::Applied
    }

    fn take_over(&mut self, req: &TakeOverRequest) -> Fenced {
        let Some(record) = self.live(&req.id, req.now) else {
            return Fenced::NotOwner;
        };
        match record.state {
            // This take-over, sent again: nothing changes (not even a lease renewed since).
            RecordState::InProgress { owner, .. } if owner == req.new_owner => Fenced::Applied,
            RecordState::InProgress {
                owner,
                lease_expires_at,
            } if owner == req.previous_owner && lease_expires_at <= req.now => {
                let taken = Record {
                    state: RecordState::InProgress {
                        owner: req.new_owner,
                        lease_expires_at: req.lease_expires_at,
                    },
                    expires_at: req.expires_at,
                    trace: req.trace,
                    ..record.clone()
                };
                self.put(taken);
                Fenced::Applied
            }
            _ => Fenced::NotOwner,
        }
    }

    fn renew(&mut self, id: &RecordId, owner: FencingToken, lease_expires_at: Timestamp) -> Fenced {
        let Some(record) = self.owned(id, owner) else {
            return Fenced::NotOwner;
        };
        let renewed = Record {
            state: RecordState::InProgress {
                owner,
                lease_expires_at,
            },
            expires_at: record.expires_at.max(lease_expires_at),
            ..record.clone()
        };
        self.put(renewed);
        Fenced::Applied
    }

    fn release(&mut self, id: &RecordId, owner: FencingToken) -> Fenced {
        if self.owned(id, owner).is_none() {
            return Fenced::NotOwner;
        }
        self.remove(id);
        Fenced::Applied
    }

    fn purge(&mut self, now: Timestamp) -> u64 {
        let expired: Vec<RecordId> = self
            .map
            .values()
            .filter(|record| record.is_expired(now))
            .map(|record| record.id.clone())
            .collect();
        for id in &expired {
            self.remove(id);
        }
        expired.len() as u64
    }

    fn stats(&self, now: Timestamp) -> StoreStats {
        let mut stats = StoreStats::default();
        for record in self.map.values() {
            match (&record.state, record.is_expired(now)) {
                (_, true) => stats.expired += 1,
                (RecordState::InProgress { .. }, false) => stats.in_progress += 1,
                (RecordState::Completed { .. }, false) => stats.completed += 1,
            }
        }
        stats
    }

    /// Latest `expires_at` first; records with equal ones in key order (the sort is stable).
    fn list(&self, filter: &ListFilter, now: Timestamp, limit: usize) -> Vec<Record> {
        let mut records: Vec<Record> = self
            .map
            .values()
            .filter(|record| filter.matches(record, now))
            .cloned()
            .collect();
        records.sort_by_key(|record| std::cmp::Reverse(record.expires_at));
        records.truncate(limit);
        records
    }
}
