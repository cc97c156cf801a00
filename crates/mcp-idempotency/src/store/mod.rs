//! Where records live: the [`Store`] trait and its implementations.
//!
//! Every store offers the same few atomic operations. A claim is one atomic step (a mutex-guarded map
//! update, one SQL transaction, one server-side script): either the key was free and is now owned by
//! the caller, or the existing record is returned. Every store passes the same test suite,
//! `testsuite` (feature `testsuite`).
//!
//! | URL | store |
//! | --- | --- |
//! | `memory` | [`MemoryStore`]: in-process, sharded, bounded; lost on exit |
//! | `sqlite:PATH` | [`SqliteStore`] (feature `sqlite`, default): a file; survives restarts |
//! | `redis://…` | `RedisStore` (feature `redis`): shared between instances; one script per operation |
//! | `postgres://…` | `PostgresStore` (feature `postgres`): shared by every instance; one SQL statement per operation |
//!
//! Expired records count as absent everywhere: a claim overwrites them and `get` does not return them.

#[cfg(any(feature = "postgres", feature = "redis"))]
mod batch;
mod error;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql_list;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql_row;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "testsuite")]
pub mod testsuite;
mod url;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

#[cfg(feature = "redis")]
pub use self::redis::RedisStore;
pub use crate::config::RecordLimits;
pub use error::StoreError;
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
pub use url::{open, redact_password, StoreUrl};

use crate::fingerprint::Fingerprint;
#[cfg(doc)]
use crate::key::IdempotencyKey;
use crate::policy::KeySource;
use crate::record::{FencingToken, Outcome, Record, RecordId, RecordState, TraceLink};
use crate::time::Timestamp;

/// The future every store operation returns: boxed so that `dyn Store` works, since the store is
/// chosen from a URL at run time.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Ask to own `id`, unless a live record already holds it.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// The record to claim.
    pub id: RecordId,
    /// Fingerprint of the call's tool name and arguments.
    pub fingerprint: Fingerprint,
    /// The tool being called.
    pub tool_name: Arc<str>,
    /// The token that will prove ownership.
    pub owner: FencingToken,
    /// The current time.
    pub now: Timestamp,
    /// Initial lease deadline.
    pub lease_expires_at: Timestamp,
    /// End of the retention window.
    pub expires_at: Timestamp,
    /// Quotas to enforce if this claim creates a record.
    pub limits: RecordLimits,
    /// The claiming call's trace, kept in the record ([`Record::trace`]) when tracing is on.
    pub trace: Option<TraceLink>,
}

/// What a claim found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key was free (absent or expired); the caller now owns an in-progress record.
    Claimed,
    /// A live record holds the key; here it is, as it was at the time of the claim.
    Existing(Record),
    /// Creating the record would break a quota; nothing was written.
    QuotaExceeded(QuotaExceeded),
}

impl ClaimOutcome {
    /// What a claim answers when a live record already holds its key: [`ClaimOutcome::Claimed`]
    /// if the record is the claimant's own (in progress under `req.owner`, with `req.fingerprint`
    /// and a lease that has not run out by `req.now`), that is, this claim was sent before and
    /// applied, and its answer was lost; else [`ClaimOutcome::Existing`]. Every store answers a
    /// claim it finds applied this way, so that a claim re-sent after an I/O error is recognised
    /// as its owner's and changes nothing.
    ///
    /// A lease that ran out is not recognised: another instance may be taking the record over,
    /// and the claimant would run the call on a lease the store no longer grants.
    ///
    /// Public for stores implemented outside this crate (the simulator's model store), so that
    /// every store answers a claim sent twice by this one rule.
    pub fn found(req: &ClaimRequest, record: Record) -> Self {
        match record.state {
            RecordState::InProgress {
                owner,
                lease_expires_at,
            } if owner == req.owner
                && record.fingerprint == req.fingerprint
                && lease_expires_at > req.now =>
            {
                Self::Claimed
            }
            _ => Self::Existing(record),
        }
    }
}

/// Which quota a refused claim would have broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuotaExceeded {
    /// The scope already holds `limit` live records.
    Scope {
        /// The per-scope limit.
        limit: u64,
    },
    /// The store already holds `limit` live records.
    Total {
        /// The store-wide limit.
        limit: u64,
    },
}

/// Record the outcome of an owned call.
#[derive(Clone, Debug)]
pub struct CompleteRequest {
    /// The record.
    pub id: RecordId,
    /// The token the claim returned.
    pub owner: FencingToken,
    /// What happened.
    pub outcome: Outcome,
    /// When it was recorded.
    pub completed_at: Timestamp,
    /// New end of the retention window (it runs from completion).
    pub expires_at: Timestamp,
}

/// Replace the owner of an in-progress record whose lease ran out (policy `reexecute`).
#[derive(Clone, Debug)]
pub struct TakeOverRequest {
    /// The record.
    pub id: RecordId,
    /// The owner whose lease ran out, as seen by the caller.
    pub previous_owner: FencingToken,
    /// The new owner.
    pub new_owner: FencingToken,
    /// The current time: the take-over only happens if the lease has really run out by then.
    pub now: Timestamp,
    /// The new owner's lease deadline.
    pub lease_expires_at: Timestamp,
    /// New end of the retention window.
    pub expires_at: Timestamp,
    /// The new owner's trace, which replaces the record's ([`Record::trace`]); `None` keeps
    /// none.
    pub trace: Option<TraceLink>,
}

/// Whether a fenced write (complete, renew, release, take-over) happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fenced {
    /// The caller held the current token (or, for take-over, the expected dead one) and the write
    /// happened.
    Applied,
    /// The record is gone, completed, or owned by someone else; nothing was written.
    NotOwner,
}

/// Counts of what a store holds, for metrics and `inspect`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Unexpired records in progress.
    pub in_progress: u64,
    /// Unexpired completed records.
    pub completed: u64,
    /// Records past their retention window that have not been purged yet.
    pub expired: u64,
}

/// Which records [`Store::list`] returns: every condition that is set must hold.
///
/// The default filter matches every record, expired ones included.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only records of this namespace.
    pub namespace: Option<String>,
    /// Only records of this principal (as stored: for bearer scopes, the token's hash).
    pub principal: Option<String>,
    /// Only records with exactly this key, as the store holds it ([`IdempotencyKey::as_str`]:
    /// a derived key with its U+001F prefix; [`KeySource::stored_key`] makes it from the key as
    /// shown).
    pub key: Option<String>,
    /// Only records whose key came from one of these sources ([`IdempotencyKey::source`]); empty:
    /// any source.
    pub sources: Vec<KeySource>,
    /// Only records in this state at the `now` given to [`Store::list`].
    pub state: Option<StateFilter>,
    /// Only records created at or before this instant.
    pub created_at_or_before: Option<Timestamp>,
    /// Only records created after this instant.
    pub created_after: Option<Timestamp>,
}

/// A record's state as [`ListFilter::state`] tells them apart. A record is expired once its
/// retention window has ended, whatever it was before; the other two states are for live records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateFilter {
    /// Live and in progress.
    InProgress,
    /// Live and completed.
    Completed,
    /// Past its retention window, not purged yet.
    Expired,
}

impl StateFilter {
    /// Whether `record` is in this state at `now`.
    pub fn matches(self, record: &Record, now: Timestamp) -> bool {
        match (self, record.is_expired(now), &record.state) {
            (Self::Expired, expired, _) => expired,
            (_, true, _) => false,
            (Self::InProgress, false, state) => matches!(state, RecordState::InProgress { .. }),
            (Self::Completed, false, state) => matches!(state, RecordState::Completed { .. }),
        }
    }
}

impl ListFilter {
    /// Whether `record` passes every condition of this filter at `now`.
    pub fn matches(&self, record: &Record, now: Timestamp) -> bool {
        let scope = &record.id.scope;
        self.namespace
            .as_deref()
            .is_none_or(|ns| ns == scope.namespace())
            && self
                .principal
                .as_deref()
                .is_none_or(|p| p == scope.principal())
            && self
                .key
                .as_deref()
                .is_none_or(|k| k == record.id.key.as_str())
            && (self.sources.is_empty() || self.sources.contains(&record.id.key.source()))
            && self.state.is_none_or(|state| state.matches(record, now))
            && self
                .created_at_or_before
                .is_none_or(|t| record.created_at <= t)
            && self.created_after.is_none_or(|t| record.created_at > t)
    }
}

/// A place to keep idempotency records. All operations are atomic with respect to each other, also
/// across processes or machines for stores shared between them.
///
/// # Sent twice
///
/// The answer to an operation can be lost after the store applied it (a timeout, a connection
/// reset after the command was sent), and the caller, or its client library, may send it again.
/// Every operation is therefore safe to send twice, and the second time answers as if the first
/// had been answered:
///
/// | operation sent again | answers | changes |
/// | --- | --- | --- |
/// | claim, by the owner of the in-progress record it created | [`ClaimOutcome::Claimed`] | nothing (no second quota place) |
/// | complete, after it was applied | [`Fenced::Applied`] | nothing |
/// | take-over, by the new owner it installed | [`Fenced::Applied`] | nothing |
/// | renew | [`Fenced::Applied`] | nothing more |
/// | release, after it was applied | [`Fenced::NotOwner`] (the record is gone) | nothing |
///
/// The store suite (`testsuite`, feature `testsuite`) checks all of these for every store.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Creates an in-progress record owned by `req.owner` if no live record holds `req.id`, or
    /// returns the live record. Enforces `req.limits` when it creates a record.
    ///
    /// A live in-progress record owned by `req.owner` with `req.fingerprint`, whose lease has not
    /// run out by `req.now`, is this claim sent a second time: it answers
    /// [`ClaimOutcome::Claimed`] and changes nothing.
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome>;

    /// Records the outcome, if `req.owner` still owns the in-progress record.
    ///
    /// A record already completed with exactly `req.outcome`, `req.completed_at` and
    /// `req.expires_at` is this completion sent a second time: it answers [`Fenced::Applied`]
    /// and changes nothing.
    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced>;

    /// Moves an in-progress record whose lease ran out before `req.now` from `req.previous_owner`
    /// to `req.new_owner`.
    ///
    /// A live in-progress record already owned by `req.new_owner` is this take-over sent a second
    /// time: it answers [`Fenced::Applied`] and changes nothing.
    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced>;

    /// Extends the lease of an in-progress record owned by `owner`, and its retention window to at
    /// least the new lease deadline: a call that is still running never expires.
    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease_expires_at: Timestamp,
    ) -> StoreFuture<'a, Fenced>;

    /// Deletes an in-progress record owned by `owner`, so a retry may run the call (used when the
    /// call was certainly not executed, e.g. the upstream was unreachable, or when the answer to
    /// its claim was lost). A record that is absent, completed or owned by another token is left
    /// alone ([`Fenced::NotOwner`]).
    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced>;

    /// The live record for `id`, if any.
    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>>;

    /// Deletes every record whose retention window ended by `now`; returns how many.
    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64>;

    /// Counts records.
    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats>;

    /// Up to `limit` records that match `filter` at `now`, expired ones included unless the filter
    /// excludes them, for inspection. (A store that drops expired records by itself, as Redis does
    /// a few minutes after their retention ends, lists only those it still holds.)
    ///
    /// Records come latest `expires_at` first (with a uniform retention: the most recently
    /// claimed or completed first); the order of records with equal `expires_at` is unspecified.
    /// The list is read in batches, not as one snapshot: records written while it is read may or
    /// may not appear. Its cost grows with the records the store scans to find matches (a
    /// namespace and principal narrow the scan to that scope), not only with `limit`.
    fn list<'a>(
        &'a self,
        filter: &'a ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Record>>;

    /// Deletes the record for `id` whatever its state (in progress, completed, or expired and not
    /// purged yet), freeing its place in the quotas; returns whether there was one.
    ///
    /// This is the operator's override: a retry with the key then runs the call again. An owner
    /// whose in-progress record was deleted finds it gone (its complete, renew and release answer
    /// [`Fenced::NotOwner`]).
    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool>;

    /// The database behind the store as OpenTelemetry's `db.system.name` names it (`redis`,
    /// `postgresql`, `sqlite`), for the spans of its operations; `None` (the default) for a
    /// store that is no database. A store that wraps another answers for it.
    fn system(&self) -> Option<&'static str> {
        None
    }
}
