//! The one retry loop's decisions, without I/O: whether a failed attempt is retried, how long to
//! wait first, and when to give up. [`Client`](super::Client) and the
//! [bridge](crate::bridge) both run their attempts through a [`Retries`].

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::error::GaveUp;
use super::policy::RetryPolicy;
use crate::RejectionKind;

/// Whether a failed attempt may be retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Never: the failure is final.
    Never,
    /// Nothing was sent: always safe.
    NotSent,
    /// The call went out: only when retrying is safe (`safe`), after `after` if the server said.
    IfSafe { safe: bool, after: Option<Duration> },
}

/// The attempts of one call: counts them and decides, after each failure, whether and when the
/// next one starts. The clock is passed in.
#[derive(Debug)]
pub(crate) struct Retries {
    policy: RetryPolicy,
    started: Instant,
    deadline: Instant,
    attempts: u32,
}

impl Retries {
    /// A call starting at `now`.
    pub(crate) fn new(policy: &RetryPolicy, now: Instant) -> Self {
        Self {
            policy: policy.clone(),
            started: now,
            deadline: now + policy.max_elapsed(),
            attempts: 0,
        }
    }

    /// Counts a new attempt; returns its number (1 for the first).
    pub(crate) fn start_attempt(&mut self) -> u32 {
        self.attempts += 1;
        self.attempts
    }

    /// Attempts started so far.
    #[cfg_attr(not(feature = "bridge"), allow(dead_code))]
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// No attempt runs past this.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// When an attempt started at `now` stops waiting for its answer.
    pub(crate) fn attempt_deadline(&self, now: Instant) -> Instant {
        self.deadline.min(now + self.policy.attempt_timeout())
    }

    /// Time since the call started.
    pub(crate) fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }

    /// After a failed attempt: how long to wait before the next one, or why there is none.
    pub(crate) fn after_failure(&self, retry: Retry, now: Instant) -> Result<Duration, GaveUp> {
        let after = match retry {
            Retry::Never => return Err(GaveUp::Final),
            Retry::IfSafe { safe: false, .. } => return Err(GaveUp::Unsafe),
            Retry::IfSafe { safe: true, after } => after,
            Retry::NotSent => None,
        };
        if self.attempts >= self.policy.max_attempts() {
            return Err(GaveUp::MaxAttempts);
        }
        let delay = self.policy.delay(self.attempts, after);
        if now + delay >= self.deadline {
            return Err(GaveUp::MaxElapsed);
        }
        Ok(delay)
    }
}

/// An `idempotency_*` refusal, read from a JSON-RPC error's `data`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A type of [`RejectionKind`].
    Known(RejectionKind),
    /// Another `idempotency_*` type (a newer server's).
    Unknown(String),
}

impl Refusal {
    /// The refusal in a JSON-RPC error's `data`, if it is one, with the server's `retryAfterMs`.
    pub(crate) fn of(data: Option<&Value>) -> Option<(Self, Option<Duration>)> {
        let data = data?;
        let type_name = data.get("type").and_then(Value::as_str)?;
        let refusal = match type_name.parse::<RejectionKind>() {
            Ok(kind) => Self::Known(kind),
            Err(_) if type_name.starts_with("idempotency_") => Self::Unknown(type_name.to_owned()),
            Err(_) => return None,
        };
        let after = data
            .get("retryAfterMs")
            .and_then(Value::as_u64)
            .map(Duration::from_millis);
        Some((refusal, after))
    }

    /// The `error.data.type` it was read from.
    pub(crate) fn type_name(&self) -> &str {
        match self {
            Self::Known(kind) => kind.as_str(),
            Self::Unknown(type_name) => type_name,
        }
    }

    /// Whether the same call may be sent again with the same key: only while the original runs,
    /// when the server failed closed or is stopping, and only if retrying is `safe`.
    pub(crate) fn retry(&self, safe: bool, after: Option<Duration>) -> Retry {
        match self {
            Self::Known(
                RejectionKind::KeyInProgress
                | RejectionKind::StoreUnavailable
                | RejectionKind::ShuttingDown,
            ) => Retry::IfSafe { safe, after },
            Self::Known(_) | Self::Unknown(_) => Retry::Never,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy() -> RetryPolicy {
        RetryPolicy::default()
            .with_max_attempts(3)
            .with_max_elapsed(Duration::from_secs(10))
            .with_backoff(Duration::from_millis(100), Duration::from_secs(1))
            .with_jitter(false)
    }

    #[test]
    fn final_and_unsafe_failures_are_not_retried() {
        let now = Instant::now();
        let mut retries = Retries::new(&policy(), now);
        retries.start_attempt();
        assert_eq!(retries.after_failure(Retry::Never, now), Err(GaveUp::Final));
        let unsafe_retry = Retry::IfSafe {
            safe: false,
            after: None,
        };
        assert_eq!(
            retries.after_failure(unsafe_retry, now),
            Err(GaveUp::Unsafe)
        );
    }

    #[test]
    fn retries_back_off_until_the_attempts_run_out() {
        let now = Instant::now();
        let mut retries = Retries::new(&policy(), now);
        let safe = Retry::IfSafe {
            safe: true,
            after: None,
        };
        retries.start_attempt();
        assert_eq!(
            retries.after_failure(safe, now),
            Ok(Duration::from_millis(100))
        );
        retries.start_attempt();
        assert_eq!(
            retries.after_failure(Retry::NotSent, now),
            Ok(Duration::from_millis(200))
        );
        retries.start_attempt();
        assert_eq!(retries.after_failure(safe, now), Err(GaveUp::MaxAttempts));
    }

    #[test]
    fn no_retry_would_start_past_the_deadline() {
        let now = Instant::now();
        let mut retries = Retries::new(&policy(), now);
        retries.start_attempt();
        let hint = Retry::IfSafe {
            safe: true,
            after: Some(Duration::from_secs(3)),
        };
        assert_eq!(retries.after_failure(hint, now), Ok(Duration::from_secs(3)));
        let late = now + Duration::from_secs(8);
        assert_eq!(retries.after_failure(hint, late), Err(GaveUp::MaxElapsed));
        assert_eq!(
            retries.attempt_deadline(late),
            now + Duration::from_secs(10)
        );
    }

    #[test]
    fn refusals_are_read_from_the_error_data() {
        let in_progress = json!({"type": "idempotency_key_in_progress", "retryAfterMs": 250});
        assert_eq!(
            Refusal::of(Some(&in_progress)),
            Some((
                Refusal::Known(RejectionKind::KeyInProgress),
                Some(Duration::from_millis(250))
            ))
        );
        let quota = json!({"type": "idempotency_quota_exceeded"});
        let (refusal, _) = Refusal::of(Some(&quota)).unwrap();
        assert_eq!(refusal, Refusal::Known(RejectionKind::QuotaExceeded));
        assert_eq!(refusal.retry(true, None), Retry::Never);
        let newer = json!({"type": "idempotency_something_new"});
        let (refusal, _) = Refusal::of(Some(&newer)).unwrap();
        assert_eq!(refusal.type_name(), "idempotency_something_new");
        assert_eq!(refusal.retry(true, None), Retry::Never);
        // A stopping gateway ran nothing and claimed nothing: retried, when safe, after its hint.
        let stopping = json!({"type": "idempotency_shutting_down", "retryAfterMs": 1000});
        let (refusal, after) = Refusal::of(Some(&stopping)).unwrap();
        assert_eq!(refusal, Refusal::Known(RejectionKind::ShuttingDown));
        assert_eq!(after, Some(Duration::from_secs(1)));
        assert_eq!(
            refusal.retry(true, after),
            Retry::IfSafe {
                safe: true,
                after: Some(Duration::from_secs(1))
            }
        );
        assert_eq!(Refusal::of(Some(&json!({"type": "tool_failed"}))), None);
        assert_eq!(Refusal::of(None), None);
    }
}
