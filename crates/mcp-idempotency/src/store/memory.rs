use std::collections::hash_map::Entry as MapEntry;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, QuotaExceeded, RecordLimits,
    Store, StoreFuture, StoreStats, TakeOverRequest,
};
use crate::fingerprint::Fingerprint;
use crate::record::{FencingToken, Record, RecordId, RecordState, Scope, TraceLink};
use crate::time::Timestamp;

/// foldhash with a per-store random seed: fast, and resistant to precomputed collisions.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

const DEFAULT_SHARDS: usize = 16;

/// Records in this process's memory: fast, bounded, and gone when the process exits.
///
/// Records are spread over mutex-guarded shards by a hash of `(scope, key)`. The store never drops a
/// live record to make room: when a quota is reached it purges expired records, and if that frees
/// nothing the claim is refused with [`ClaimOutcome::QuotaExceeded`].
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    counts: Mutex<HashMap<Scope, u64>>,
    total: AtomicU64,
    /// A lower bound on every record's `expires_at`: no purge can free anything before then.
    earliest_expiry: AtomicU64,
}

#[derive(Debug, Default)]
struct Shard {
    records: HashMap<RecordId, Entry>,
}

/// A record without its id, which is the map key.
#[derive(Debug)]
struct Entry {
    fingerprint: Fingerprint,
    tool_name: Arc<str>,
    state: RecordState,
    created_at: Timestamp,
    expires_at: Timestamp,
    trace: Option<TraceLink>,
}

impl Entry {
    fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at <= now
    }

    fn to_record(&self, id: &RecordId) -> Record {
        Record {
            id: id.clone(),
            fingerprint: self.fingerprint,
            tool_name: self.tool_name.to_string(),
            state: self.state.clone(),
            created_at: self.created_at,
            expires_at: self.expires_at,
            trace: self.trace,
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store with the default number of shards.
    pub fn new() -> Self {
        Self::with_shards(DEFAULT_SHARDS)
    }

    /// An empty store with `shards` shards (at least one).
    pub fn with_shards(shards: usize) -> Self {
        Self {
            shards: (0..shards.max(1))
                .map(|_| Mutex::new(Shard::default()))
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
            counts: Mutex::new(HashMap::default()),
            total: AtomicU64::new(0),
            earliest_expiry: AtomicU64::new(u64::MAX),
        }
    }

    fn shard(&self, id: &RecordId) -> MutexGuard<'_, Shard> {
        let index = (self.hasher.hash_one(id) % self.shards.len() as u64) as usize;
        lock(&self.shards[index])
    }

    fn claim_now(&self, req: &ClaimRequest) -> Result<ClaimOutcome, QuotaExceeded> {
        let mut shard = self.shard(&req.id);
        let entry = Entry {
            fingerprint: req.fingerprint,
            tool_name: req.tool_name.clone(),
            state: RecordState::InProgress {
                owner: req.owner,
                lease_expires_at: req.lease_expires_at,
            },
            created_at: req.now,
            expires_at: req.expires_at,
            trace: req.trace,
        };
        match shard.records.entry(req.id.clone()) {
            MapEntry::Occupied(existing) if !existing.get().is_expired(req.now) => {
                return Ok(ClaimOutcome::found(
                    req,
                    existing.get().to_record(existing.key()),
                ))
            }
            MapEntry::Occupied(mut expired) => {
                expired.insert(entry);
            }
            MapEntry::Vacant(vacant) => {
                self.reserve(&req.id.scope, req.limits)?;
                vacant.insert(entry);
            }
        }
        self.earliest_expiry
            .fetch_min(req.expires_at.as_millis(), Ordering::Relaxed);
        Ok(ClaimOutcome::Claimed)
    }

    /// Counts one more record for `scope`, unless that breaks a limit.
    fn reserve(&self, scope: &Scope, limits: RecordLimits) -> Result<(), QuotaExceeded> {
        let mut counts = lock(&self.counts);
        if self.total.load(Ordering::Relaxed) >= limits.max_records_total {
            return Err(QuotaExceeded::Total {
                limit: limits.max_records_total,
            });
        }
        match counts.get_mut(scope) {
            Some(count) if *count >= limits.max_records_per_scope => {
                return Err(QuotaExceeded::Scope {
                    limit: limits.max_records_per_scope,
                })
            }
            Some(count) => *count += 1,
            None if limits.max_records_per_scope == 0 => {
                return Err(QuotaExceeded::Scope { limit: 0 })
            }
            None => {
                counts.insert(scope.clone(), 1);
            }
        }
        self.total.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn forget(&self, scope: &Scope, removed: u64) {
        if removed == 0 {
            return;
        }
        let mut counts = lock(&self.counts);
        if let Some(count) = counts.get_mut(scope) {
            *count = count.saturating_sub(removed);
            if *count == 0 {
                counts.remove(scope);
            }
        }
        self.total.fetch_sub(removed, Ordering::Relaxed);
    }

    fn purge_now(&self, now: Timestamp) -> u64 {
        if self.earliest_expiry.load(Ordering::Relaxed) > now.as_millis() {
            return 0;
        }
        // Reset the bound before scanning so that inserts racing the scan lower it again.
        self.earliest_expiry.store(u64::MAX, Ordering::Relaxed);
        let mut purged = 0;
        let mut earliest = u64::MAX;
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            let mut removed: HashMap<Scope, u64> = HashMap::default();
            shard.records.retain(|id, record| {
                if record.is_expired(now) {
                    *removed.entry(id.scope.clone()).or_insert(0) += 1;
                    false
                } else {
                    earliest = earliest.min(record.expires_at.as_millis());
                    true
                }
            });
            for (scope, count) in removed {
                purged += count;
                self.forget(&scope, count);
            }
        }
        self.earliest_expiry.fetch_min(earliest, Ordering::Relaxed);
        purged
    }

    /// Whether the record is completed exactly as `req` would complete it (`req` sent again).
    fn holds_completion(&self, req: &CompleteRequest) -> bool {
        let shard = self.shard(&req.id);
        matches!(
            shard.records.get(&req.id),
            Some(Entry {
                state: RecordState::Completed { outcome, completed_at },
                expires_at,
                ..
            }) if *outcome == req.outcome
                && *completed_at == req.completed_at
                && *expires_at == req.expires_at
        )
    }

    fn with_owned<T>(
        &self,
        id: &RecordId,
        owner: FencingToken,
        now: Option<Timestamp>,
        apply: impl FnOnce(&mut Entry) -> T,
    ) -> Option<T> {
        let mut shard = self.shard(id);
        let record = shard.records.get_mut(id)?;
        if now.is_some_and(|now| record.is_expired(now)) {
            return None;
        }
        match record.state {
            RecordState::InProgress { owner: current, .. } if current == owner => {
                Some(apply(record))
            }
            _ => None,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard lock cannot leave a record half-written (every update is a single
    // insert or assignment), so a poisoned lock is safe to keep using.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn fenced(applied: Option<()>) -> Fenced {
    match applied {
        Some(()) => Fenced::Applied,
        None => Fenced::NotOwner,
    }
}

impl Store for MemoryStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        let outcome = match self.claim_now(req) {
            Err(_) if self.purge_now(req.now) > 0 => self.claim_now(req),
            other => other,
        };
        Box::pin(std::future::ready(Ok(
            outcome.unwrap_or_else(ClaimOutcome::QuotaExceeded)
        )))
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        if self.holds_completion(&req) {
            return Box::pin(std::future::ready(Ok(Fenced::Applied)));
        }
        let applied = self.with_owned(&req.id, req.owner, None, |record| {
            record.state = RecordState::Completed {
                outcome: req.outcome,
                completed_at: req.completed_at,
            };
            record.expires_at = req.expires_at;
            self.earliest_expiry
                .fetch_min(req.expires_at.as_millis(), Ordering::Relaxed);
        });
        Box::pin(std::future::ready(Ok(fenced(applied))))
    }

    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        if self
            .with_owned(&req.id, req.new_owner, Some(req.now), |_| ())
            .is_some()
        {
            // This take-over, sent again.
            return Box::pin(std::future::ready(Ok(Fenced::Applied)));
        }
        let applied = self
            .with_owned(&req.id, req.previous_owner, Some(req.now), |record| {
                let RecordState::InProgress {
                    lease_expires_at, ..
                } = record.state
                else {
                    return None;
                };
                (lease_expires_at <= req.now).then(|| {
                    record.state = RecordState::InProgress {
                        owner: req.new_owner,
                        lease_expires_at: req.lease_expires_at,
                    };
                    record.expires_at = req.expires_at;
                    record.trace = req.trace;
                })
            })
            .flatten();
        Box::pin(std::future::ready(Ok(fenced(applied))))
    }

    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease_expires_at: Timestamp,
    ) -> StoreFuture<'a, Fenced> {
        let applied = self.with_owned(id, owner, None, |record| {
            record.state = RecordState::InProgress {
                owner,
                lease_expires_at,
            };
            record.expires_at = record.expires_at.max(lease_expires_at);
        });
        Box::pin(std::future::ready(Ok(fenced(applied))))
    }

    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        let released = {
            let mut shard = self.shard(id);
            let owned = matches!(
                shard.records.get(id),
                Some(Entry { state: RecordState::InProgress { owner: current, .. }, .. })
                    if *current == owner
            );
            owned && shard.records.remove(id).is_some()
        };
        if released {
            self.forget(&id.scope, 1);
        }
        Box::pin(std::future::ready(Ok(if released {
            Fenced::Applied
        } else {
            Fenced::NotOwner
        })))
    }

    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>> {
        let record = self
            .shard(id)
            .records
            .get(id)
            .filter(|entry| !entry.is_expired(now))
            .map(|entry| entry.to_record(id));
        Box::pin(std::future::ready(Ok(record)))
    }

    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64> {
        Box::pin(std::future::ready(Ok(self.purge_now(now))))
    }

    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        let mut stats = StoreStats::default();
        for shard in self.shards.iter() {
            for record in lock(shard).records.values() {
                match (&record.state, record.is_expired(now)) {
                    (_, true) => stats.expired += 1,
                    (RecordState::InProgress { .. }, false) => stats.in_progress += 1,
                    (RecordState::Completed { .. }, false) => stats.completed += 1,
                }
            }
        }
        Box::pin(std::future::ready(Ok(stats)))
    }

    fn list<'a>(
        &'a self,
        filter: &'a ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Record>> {
        let mut records = Vec::new();
        for shard in self.shards.iter() {
            records.extend(
                lock(shard)
                    .records
                    .iter()
                    .map(|(id, entry)| entry.to_record(id))
                    .filter(|record| filter.matches(record, now)),
            );
        }
        records.sort_by_key(|record| std::cmp::Reverse(record.expires_at));
        records.truncate(limit);
        Box::pin(std::future::ready(Ok(records)))
    }

    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        let deleted = self.shard(id).records.remove(id).is_some();
        if deleted {
            self.forget(&id.scope, 1);
        }
        Box::pin(std::future::ready(Ok(deleted)))
    }
}
