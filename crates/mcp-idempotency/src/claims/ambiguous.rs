//! Claims whose store answer was lost: [`AmbiguousClaims`], what the deduplicator remembers of
//! them and when it releases them. Sans-IO: the clock is passed in, the store is the caller's.
//!
//! A claim (or a take-over) that fails with an error after it was sent may have been applied: the
//! store may hold an in-progress record under its token while the gateway answered
//! `idempotency_store_unavailable` and ran nothing. Nobody would ever complete that record, so a
//! retry would get `idempotency_key_in_progress` until the lease ran out, then
//! `idempotency_outcome_unknown` for the rest of the retention window, for a call that never ran.
//! The same holds for a claim whose release failed (its call was certainly not run).
//!
//! The deduplicator therefore remembers `(record, token)` of each such claim here and gets rid of
//! it in one of two ways, whichever comes first:
//!
//! - **The retry's claim** ([`AmbiguousClaims::on_claim_answer`]): any answer of the store to a
//!   claim of the same key says whether the token holds the record. If it does (an in-progress
//!   record under a remembered token), the caller releases it, fenced by the token, and claims
//!   again ([`AfterClaim::Release`]); otherwise the token holds nothing and is forgotten. An answer
//!   the store gave before the release task released the token shows the record still held by
//!   it: a released token is remembered for [`RELEASED_KEPT`], and such an answer is followed by
//!   the claim sent again ([`AfterClaim::ClaimAgain`]), not by `idempotency_key_in_progress`.
//! - **The release queue** ([`AmbiguousClaims::poll_release`]): a background task releases each
//!   remembered token once the store answers again, one at a time, backing off from
//!   [`MIN_BACKOFF`] to [`MAX_BACKOFF`] while releases fail, and at once when any claim of this
//!   process gets an answer ([`AmbiguousClaims::store_answered`]). This serves retries that reach
//!   another instance, which cannot know the token.
//!
//! The queue is bounded ([`MAX_AMBIGUOUS_CLAIMS`]); a claim that does not fit, or whose retention
//! window ends before it could be released, is left to its lease as before. A crash of the process
//! loses the queue: those records, too, wait for their leases.

use std::time::Duration;

use crate::record::{FencingToken, RecordId, RecordState};
use crate::store::{ClaimOutcome, StoreError};
use crate::time::{backoff, Timestamp};

/// Most claims remembered at once (per deduplicator).
pub(super) const MAX_AMBIGUOUS_CLAIMS: usize = 1024;
/// Wait before the first release, and after the first failed one (the bounds of the
/// [`backoff`] of releases, and of the completions sent again, `completion.rs`).
pub(super) const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between two release attempts while the store fails.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long a released token is remembered: longer than any store operation may take (the network
/// stores give up on one after 10 s), so that the answer to a claim the store read before the
/// release still finds it.
pub(super) const RELEASED_KEPT: Duration = Duration::from_secs(60);

/// One claim that may hold its record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Ambiguous {
    /// The record the claim was for.
    pub(super) id: RecordId,
    /// The claim's token.
    pub(super) owner: FencingToken,
    /// When the record, if it exists, ends its retention window: no need to release it after.
    pub(super) give_up_at: Timestamp,
}

/// Whether [`AmbiguousClaims::remember`] kept a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(super) enum Remembered {
    /// Queued for release (or already queued).
    Queued,
    /// The queue is full: the claim is left to its lease.
    Full,
}

/// What to do after the store answered a claim, as [`AmbiguousClaims::on_claim_answer`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub(super) enum AfterClaim {
    /// Nothing: no remembered claim of this record is concerned.
    Nothing,
    /// The answer shows that these remembered claims of the record hold nothing; they are
    /// forgotten.
    Forgotten(usize),
    /// The record is held by this remembered token, whose call never ran: release it, fenced by
    /// the token, report with [`AmbiguousClaims::on_released`], then send the claim again.
    Release(FencingToken),
    /// The record was held by a token released since the store read it: send the claim again.
    ClaimAgain,
}

/// A token released lately, and until when it is remembered.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Released {
    id: RecordId,
    owner: FencingToken,
    until: Timestamp,
}

/// The ambiguous claims of one deduplicator, and the backoff of their releases.
#[derive(Debug)]
pub(super) struct AmbiguousClaims {
    claims: Vec<Ambiguous>,
    /// Tokens released in the last [`RELEASED_KEPT`], oldest first, at most `capacity`.
    released: Vec<Released>,
    capacity: usize,
    /// Releases that failed in a row since the store last answered.
    failures: u32,
    /// No release is attempted before this.
    resume_at: Timestamp,
}

impl AmbiguousClaims {
    /// An empty set holding at most `capacity` claims.
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            claims: Vec::new(),
            released: Vec::new(),
            capacity,
            failures: 0,
            resume_at: Timestamp::from_millis(0),
        }
    }

    /// How many claims are remembered.
    pub(super) fn len(&self) -> usize {
        self.claims.len()
    }

    /// Whether a claim's answer must be read here ([`on_claim_answer`](Self::on_claim_answer)):
    /// a claim is remembered, or a token was released lately.
    pub(super) fn is_watching(&self) -> bool {
        !self.claims.is_empty() || !self.released.is_empty()
    }

    /// Remembers a claim whose answer was lost, to be released from [`MIN_BACKOFF`] after `now`
    /// (or later, while the store keeps failing).
    pub(super) fn remember(&mut self, claim: Ambiguous, now: Timestamp) -> Remembered {
        if self
            .claims
            .iter()
            .any(|c| c.id == claim.id && c.owner == claim.owner)
        {
            return Remembered::Queued;
        }
        if self.claims.len() >= self.capacity {
            return Remembered::Full;
        }
        if self.claims.is_empty() {
            self.failures = 0;
            self.resume_at = now.saturating_add(MIN_BACKOFF);
        }
        self.claims.push(claim);
        Remembered::Queued
    }

    /// Reads the store's answer at `now` to a claim of `id`: whether a remembered claim of the
    /// record holds it (release it and claim again), a token released since holds it (claim
    /// again), or none does (they are forgotten). An error tells nothing.
    pub(super) fn on_claim_answer(
        &mut self,
        id: &RecordId,
        answer: &Result<ClaimOutcome, StoreError>,
        now: Timestamp,
    ) -> AfterClaim {
        self.released.retain(|r| r.until > now);
        if !self.is_watching() {
            return AfterClaim::Nothing;
        }
        let holder = match answer {
            Err(_) => return AfterClaim::Nothing,
            Ok(ClaimOutcome::Existing(record)) => match record.state {
                RecordState::InProgress { owner, .. } => Some(owner),
                RecordState::Completed { .. } => None,
            },
            Ok(ClaimOutcome::Claimed | ClaimOutcome::QuotaExceeded(_)) => None,
        };
        if let Some(owner) = holder {
            if self.claims.iter().any(|c| &c.id == id && c.owner == owner) {
                return AfterClaim::Release(owner);
            }
            // The answer is older than the release: it says nothing of the other tokens either.
            if self
                .released
                .iter()
                .any(|r| &r.id == id && r.owner == owner)
            {
                return AfterClaim::ClaimAgain;
            }
        }
        // One record per key: whoever holds it (if anyone), no other token of ours does.
        let before = self.claims.len();
        self.claims.retain(|c| &c.id != id);
        match before - self.claims.len() {
            0 => AfterClaim::Nothing,
            n => AfterClaim::Forgotten(n),
        }
    }

    /// The next claim to release at `now`, if one is due; the claim stays remembered until
    /// [`on_released`](Self::on_released) or [`on_release_failed`](Self::on_release_failed).
    /// Claims whose retention window has ended are dropped first and returned in `expired`.
    pub(super) fn poll_release(
        &mut self,
        now: Timestamp,
        expired: &mut Vec<Ambiguous>,
    ) -> Option<Ambiguous> {
        let mut i = 0;
        while i < self.claims.len() {
            if self.claims[i].give_up_at <= now {
                expired.push(self.claims.swap_remove(i));
            } else {
                i += 1;
            }
        }
        if now < self.resume_at {
            return None;
        }
        self.claims.first().cloned()
    }

    /// The store answered at `now` a release of `owner`'s claim on `id` (applied or not): it holds
    /// the record no more.
    pub(super) fn on_released(&mut self, id: &RecordId, owner: FencingToken, now: Timestamp) {
        self.claims.retain(|c| !(&c.id == id && c.owner == owner));
        self.failures = 0;
        if self.released.len() >= self.capacity {
            self.released.remove(0);
        }
        self.released.push(Released {
            id: id.clone(),
            owner,
            until: now.saturating_add(RELEASED_KEPT),
        });
    }

    /// A release failed at `now`: the store is still away; back off.
    pub(super) fn on_release_failed(&mut self, now: Timestamp) {
        self.failures = self.failures.saturating_add(1);
        self.resume_at = now.saturating_add(backoff(self.failures, MIN_BACKOFF, MAX_BACKOFF));
    }

    /// The store answered something else (a claim) at `now`: release at once.
    pub(super) fn store_answered(&mut self, now: Timestamp) {
        self.failures = 0;
        self.resume_at = self.resume_at.min(now);
    }

    /// When the next release is due, if any claim is remembered.
    pub(super) fn next_deadline(&self) -> Option<Timestamp> {
        let earliest_end = self.claims.iter().map(|c| c.give_up_at).min()?;
        Some(self.resume_at.min(earliest_end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::fingerprint;
    use crate::key::IdempotencyKey;
    use crate::record::{Outcome, Record, Scope};

    const T0: Timestamp = Timestamp::from_millis(1_000_000);

    fn id(key: &str) -> RecordId {
        RecordId {
            scope: Scope::new("ns", "p"),
            key: IdempotencyKey::new(key, 255).unwrap(),
        }
    }

    fn lost(key: &str, owner: u64) -> Ambiguous {
        Ambiguous {
            id: id(key),
            owner: FencingToken::from_u64(owner),
            give_up_at: at(3_600_000),
        }
    }

    fn at(ms: u64) -> Timestamp {
        T0.saturating_add(Duration::from_millis(ms))
    }

    fn record(key: &str, state: RecordState) -> Record {
        Record {
            trace: None,
            id: id(key),
            fingerprint: fingerprint("t", None).unwrap(),
            tool_name: "t".into(),
            state,
            created_at: T0,
            expires_at: at(3_600_000),
        }
    }

    fn running(key: &str, owner: u64) -> Result<ClaimOutcome, StoreError> {
        Ok(ClaimOutcome::Existing(record(
            key,
            RecordState::InProgress {
                owner: FencingToken::from_u64(owner),
                lease_expires_at: at(30_000),
            },
        )))
    }

    fn unavailable() -> Result<ClaimOutcome, StoreError> {
        Err(StoreError::Unavailable {
            message: "down".into(),
            source: None,
        })
    }

    #[test]
    fn a_retry_releases_its_own_lost_claim_and_forgets_the_others() {
        let mut claims = AmbiguousClaims::new(8);
        assert_eq!(claims.remember(lost("k", 1), T0), Remembered::Queued);
        assert_eq!(claims.remember(lost("k", 1), T0), Remembered::Queued);
        assert_eq!(claims.remember(lost("k", 2), T0), Remembered::Queued);
        assert_eq!(claims.remember(lost("other", 3), T0), Remembered::Queued);
        assert_eq!(claims.len(), 3);

        // An error says nothing; another owner's record means ours hold nothing.
        assert_eq!(
            claims.on_claim_answer(&id("k"), &unavailable(), T0),
            AfterClaim::Nothing
        );
        assert_eq!(
            claims.on_claim_answer(&id("k"), &running("k", 2), T0),
            AfterClaim::Release(FencingToken::from_u64(2))
        );
        claims.on_released(&id("k"), FencingToken::from_u64(2), T0);
        assert_eq!(
            claims.on_claim_answer(&id("k"), &Ok(ClaimOutcome::Claimed), T0),
            AfterClaim::Forgotten(1)
        );
        assert_eq!(claims.len(), 1, "the other key is still remembered");
        assert_eq!(
            claims.on_claim_answer(&id("other"), &running("other", 9), T0),
            AfterClaim::Forgotten(1)
        );
        assert_eq!(claims.len(), 0);
        assert_eq!(claims.next_deadline(), None);
    }

    #[test]
    fn an_answer_older_than_the_release_claims_again() {
        let mut claims = AmbiguousClaims::new(8);
        let _ = claims.remember(lost("k", 1), T0);
        // The release task releases the token while a retry's claim is on its way back with the
        // record as the store read it before: held by that token.
        claims.on_released(&id("k"), FencingToken::from_u64(1), T0);
        assert_eq!(claims.len(), 0);
        assert!(claims.is_watching());
        assert_eq!(
            claims.on_claim_answer(&id("k"), &running("k", 1), at(1_000)),
            AfterClaim::ClaimAgain
        );
        // Another token holding the record is somebody else's call, in progress.
        assert_eq!(
            claims.on_claim_answer(&id("k"), &running("k", 2), at(1_000)),
            AfterClaim::Nothing
        );
        // Past RELEASED_KEPT no answer can be that old; the released token is forgotten.
        let later = T0.saturating_add(RELEASED_KEPT);
        assert_eq!(
            claims.on_claim_answer(&id("k"), &running("k", 1), later),
            AfterClaim::Nothing
        );
        assert!(!claims.is_watching());
    }

    #[test]
    fn a_completed_record_or_a_refused_claim_forgets_the_key() {
        for answer in [
            Ok(ClaimOutcome::Existing(record(
                "k",
                RecordState::Completed {
                    outcome: Outcome::Success("1".into()),
                    completed_at: T0,
                },
            ))),
            Ok(ClaimOutcome::QuotaExceeded(
                crate::store::QuotaExceeded::Scope { limit: 1 },
            )),
        ] {
            let mut claims = AmbiguousClaims::new(8);
            let _ = claims.remember(lost("k", 1), T0);
            assert_eq!(
                claims.on_claim_answer(&id("k"), &answer, T0),
                AfterClaim::Forgotten(1)
            );
        }
    }

    #[test]
    fn releases_back_off_while_the_store_fails_and_resume_when_it_answers() {
        let mut claims = AmbiguousClaims::new(8);
        let mut expired = Vec::new();
        let _ = claims.remember(lost("a", 1), T0);
        let _ = claims.remember(lost("b", 2), T0);
        assert_eq!(claims.next_deadline(), Some(at(100)));
        assert_eq!(claims.poll_release(at(99), &mut expired), None);
        let first = claims.poll_release(at(100), &mut expired).unwrap();
        assert_eq!(first, lost("a", 1));

        // 100 ms, 200 ms, 400 ms, ... up to 5 s.
        let mut now = at(100);
        let mut waits = Vec::new();
        for _ in 0..8 {
            claims.on_release_failed(now);
            let next = claims.next_deadline().unwrap();
            waits.push(next.saturating_since(now).as_millis());
            assert_eq!(
                claims.poll_release(now, &mut expired),
                None,
                "no retry before the backoff"
            );
            now = next;
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);

        // Any answer of the store ends the backoff.
        claims.store_answered(now);
        assert_eq!(claims.poll_release(now, &mut expired), Some(lost("a", 1)));
        claims.on_released(&first.id, first.owner, T0);
        assert_eq!(claims.poll_release(now, &mut expired), Some(lost("b", 2)));
        claims.on_released(&id("b"), FencingToken::from_u64(2), T0);
        assert_eq!(claims.poll_release(now, &mut expired), None);
        assert!(expired.is_empty());
    }

    #[test]
    fn the_set_is_bounded_and_forgets_claims_past_their_retention() {
        let mut claims = AmbiguousClaims::new(2);
        let mut expired = Vec::new();
        let short = Ambiguous {
            give_up_at: at(50),
            ..lost("a", 1)
        };
        assert_eq!(claims.remember(short.clone(), T0), Remembered::Queued);
        assert_eq!(claims.remember(lost("b", 2), T0), Remembered::Queued);
        assert_eq!(claims.remember(lost("c", 3), T0), Remembered::Full);
        assert_eq!(claims.next_deadline(), Some(at(50)));
        assert_eq!(claims.poll_release(at(50), &mut expired), None);
        assert_eq!(expired, [short]);
        assert_eq!(claims.remember(lost("c", 3), T0), Remembered::Queued);
        assert_eq!(claims.len(), 2);
    }
}
