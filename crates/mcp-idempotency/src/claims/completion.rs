//! Completions whose store write failed: whether and when to send them again. Sans-IO: the clock
//! is passed in, the store and the task are the caller's (`RunningClaim`).
//!
//! A call that ran while the store went away (a PostgreSQL restart, a Redis outage) has answered
//! its client, but the write of its outcome failed. Left alone, its record would stay in progress
//! until its lease ran out; retries would then get `idempotency_outcome_unknown`, or, with
//! `--after-crash reexecute`, run the call a second time. So a completion that failed with an
//! error that may pass ([`StoreError::may_have_applied`]: the store could not be reached, or
//! answered with an error that may be its going down) is sent again, the very same request
//! (fenced by the claim's token; a request sent again after it was applied answers
//! [`Fenced::Applied`]), while the claim's lease is kept alive, until one of:
//!
//! - the store applies it ([`Settled::Recorded`]);
//! - the claim is no longer ours ([`Settled::TakenOver`]): its lease ran out and a retry took the
//!   record over, legitimately; the outcome is not written;
//! - the store answers with an error that sending again will not change ([`Settled::Failed`]);
//! - the deadline passes ([`Settled::GaveUp`]): the end of the retention window the outcome would
//!   have had (the completion's `expires_at`); past it, the record would be gone anyway.
//!
//! Attempts back off from [`MIN_BACKOFF`] to [`MAX_BACKOFF`] (the same [`backoff`], with the same
//! bounds, as the release of ambiguous claims), and are due again at once, though at most every
//! [`MIN_BACKOFF`], when the store answers anything else ([`CompletionRetry::store_answered`]).
//! At most [`MAX_PENDING_COMPLETIONS`] completions are retried at once per deduplicator; one
//! beyond is left to its lease, as before, and logged.

use super::ambiguous::{MAX_BACKOFF, MIN_BACKOFF};
use crate::store::{Fenced, StoreError};
use crate::time::{backoff, Timestamp};

/// Most completions retried at once (per deduplicator).
pub(super) const MAX_PENDING_COMPLETIONS: usize = 1024;

/// How a completion that was retried ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Settled {
    /// The outcome is recorded.
    Recorded,
    /// Someone else owns the record: the outcome was not written.
    TakenOver,
    /// The store answered with an error that will not pass: the record is left to its lease.
    Failed,
    /// The deadline passed while the store still failed: the record is left to its lease.
    GaveUp,
}

/// What to do after an attempt, as [`CompletionRetry::on_answer`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(super) enum Next {
    /// Send the completion again at this time (or earlier, once the store answers).
    RetryAt(Timestamp),
    /// Stop: the completion ended so.
    Settled(Settled),
}

/// Whether an error of a completion may pass, so that sending it again is worth it.
pub(super) fn worth_retrying(error: &StoreError) -> bool {
    error.is_unavailable() || error.may_have_applied()
}

/// The retry schedule of one completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct CompletionRetry {
    /// No attempt after this.
    give_up_at: Timestamp,
    /// Attempts that failed in a row.
    failures: u32,
    /// When the last attempt was made.
    last_attempt: Timestamp,
    /// When the next attempt is due.
    due: Timestamp,
}

impl CompletionRetry {
    /// The schedule of a completion whose first attempt failed with `error` at `now`, to be given
    /// up at `give_up_at`; `None` if the error will not pass, or the deadline has passed.
    pub(super) fn after_first_failure(
        error: &StoreError,
        give_up_at: Timestamp,
        now: Timestamp,
    ) -> Option<Self> {
        if !worth_retrying(error) || now >= give_up_at {
            return None;
        }
        Some(Self {
            give_up_at,
            failures: 1,
            last_attempt: now,
            due: now
                .saturating_add(backoff(1, MIN_BACKOFF, MAX_BACKOFF))
                .min(give_up_at),
        })
    }

    /// When the next attempt is due.
    pub(super) fn due(&self) -> Timestamp {
        self.due
    }

    /// Reads the store's answer to an attempt made at `now`.
    pub(super) fn on_answer(
        &mut self,
        answer: &Result<Fenced, StoreError>,
        now: Timestamp,
    ) -> Next {
        self.last_attempt = now;
        match answer {
            Ok(Fenced::Applied) => Next::Settled(Settled::Recorded),
            Ok(Fenced::NotOwner) => Next::Settled(Settled::TakenOver),
            Err(error) if !worth_retrying(error) => Next::Settled(Settled::Failed),
            Err(_) if now >= self.give_up_at => Next::Settled(Settled::GaveUp),
            Err(_) => {
                self.failures = self.failures.saturating_add(1);
                self.due = now
                    .saturating_add(backoff(self.failures, MIN_BACKOFF, MAX_BACKOFF))
                    .min(self.give_up_at);
                Next::RetryAt(self.due)
            }
        }
    }

    /// The store answered something else at `now`: the next attempt is due at once, though not
    /// sooner than [`MIN_BACKOFF`] after the last one, and the backoff starts over.
    pub(super) fn store_answered(&mut self, now: Timestamp) {
        self.failures = 0;
        let earliest = now.max(self.last_attempt.saturating_add(MIN_BACKOFF));
        self.due = self.due.min(earliest);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const T0: Timestamp = Timestamp::from_millis(1_000_000);

    fn at(ms: u64) -> Timestamp {
        T0.saturating_add(Duration::from_millis(ms))
    }

    fn unavailable() -> StoreError {
        StoreError::Unavailable {
            message: "down".into(),
            source: None,
        }
    }

    fn backend() -> StoreError {
        StoreError::Backend {
            message: "terminating connection due to administrator command".into(),
            source: None,
        }
    }

    fn corrupt() -> StoreError {
        StoreError::Corrupt(crate::record::CorruptRecord("bad".into()))
    }

    #[test]
    fn only_errors_that_may_pass_are_retried() {
        assert!(CompletionRetry::after_first_failure(&unavailable(), at(60_000), T0).is_some());
        assert!(CompletionRetry::after_first_failure(&backend(), at(60_000), T0).is_some());
        assert_eq!(
            CompletionRetry::after_first_failure(&corrupt(), at(60_000), T0),
            None
        );
        assert_eq!(
            CompletionRetry::after_first_failure(&unavailable(), T0, T0),
            None,
            "past the deadline"
        );
    }

    #[test]
    fn attempts_back_off_until_the_store_applies_one() {
        let mut retry = CompletionRetry::after_first_failure(&unavailable(), at(3_600_000), T0)
            .expect("retried");
        let mut now = T0;
        let mut waits = vec![retry.due().saturating_since(now).as_millis()];
        now = retry.due();
        for _ in 0..8 {
            let Next::RetryAt(due) = retry.on_answer(&Err(unavailable()), now) else {
                panic!("retried")
            };
            assert_eq!(due, retry.due());
            waits.push(due.saturating_since(now).as_millis());
            now = due;
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        assert_eq!(
            retry.on_answer(&Ok(Fenced::Applied), now),
            Next::Settled(Settled::Recorded)
        );
    }

    #[test]
    fn a_take_over_or_an_error_that_will_not_pass_stops_the_retries() {
        let retry = CompletionRetry::after_first_failure(&unavailable(), at(60_000), T0).unwrap();
        assert_eq!(
            retry.clone().on_answer(&Ok(Fenced::NotOwner), at(100)),
            Next::Settled(Settled::TakenOver)
        );
        assert_eq!(
            retry.clone().on_answer(&Err(corrupt()), at(100)),
            Next::Settled(Settled::Failed)
        );
        assert!(matches!(
            retry.clone().on_answer(&Err(backend()), at(100)),
            Next::RetryAt(_)
        ));
    }

    #[test]
    fn the_last_attempt_is_at_the_deadline() {
        let deadline = at(1_000);
        let mut retry = CompletionRetry::after_first_failure(&unavailable(), deadline, T0).unwrap();
        let mut now = retry.due();
        loop {
            match retry.on_answer(&Err(unavailable()), now) {
                Next::RetryAt(due) => {
                    assert!(due <= deadline);
                    now = due;
                }
                Next::Settled(settled) => {
                    assert_eq!(settled, Settled::GaveUp);
                    assert_eq!(now, deadline, "one last attempt at the deadline");
                    break;
                }
            }
        }
    }

    #[test]
    fn an_answer_of_the_store_makes_the_next_attempt_due_but_not_in_a_burst() {
        let mut retry =
            CompletionRetry::after_first_failure(&unavailable(), at(3_600_000), T0).unwrap();
        let mut now = retry.due();
        for _ in 0..6 {
            let Next::RetryAt(due) = retry.on_answer(&Err(unavailable()), now) else {
                panic!()
            };
            if due.saturating_since(now).as_millis() < 5_000 {
                now = due;
            }
        }
        // The last attempt was at `now`; the next is due 5 s later.
        assert_eq!(retry.due().saturating_since(now).as_millis(), 5_000);
        retry.store_answered(now.saturating_add(Duration::from_millis(30)));
        assert_eq!(
            retry.due(),
            now.saturating_add(MIN_BACKOFF),
            "not sooner than 100 ms after the last attempt"
        );
        retry.store_answered(now.saturating_add(Duration::from_millis(2_000)));
        assert_eq!(retry.due(), now.saturating_add(MIN_BACKOFF), "never later");
        // The backoff started over.
        let later = now.saturating_add(MIN_BACKOFF);
        assert_eq!(
            retry.on_answer(&Err(unavailable()), later),
            Next::RetryAt(later.saturating_add(MIN_BACKOFF))
        );
    }
}
