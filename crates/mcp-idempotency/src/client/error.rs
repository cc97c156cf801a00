//! [`CallError`]: a call that produced no outcome.

use std::fmt;
use std::time::Duration;

use rmcp::model::ErrorData;
use rmcp::ServiceError;

use super::connect::ConnectError;

/// A call that ended without an outcome: the key it used, how many attempts it made, what went
/// wrong last, and why it stopped retrying.
#[derive(Debug)]
pub struct CallError {
    pub(crate) key: String,
    pub(crate) attempts: u32,
    pub(crate) elapsed: Duration,
    pub(crate) failure: Failure,
    pub(crate) gave_up: GaveUp,
}

impl CallError {
    /// The idempotency key every attempt carried: retry later with it, never with a new one,
    /// when the call [may have run](Self::may_have_run).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How many attempts were made (requests sent or connections tried).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Time from the start of the call to the end of its last attempt.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// What went wrong last.
    pub fn failure(&self) -> &Failure {
        &self.failure
    }

    /// Why there was no further attempt.
    pub fn gave_up(&self) -> GaveUp {
        self.gave_up
    }

    /// The last failure, by value.
    pub fn into_failure(self) -> Failure {
        self.failure
    }

    /// Whether the tool may have run although no outcome came back (see
    /// [`Failure::may_have_run`]).
    pub fn may_have_run(&self) -> bool {
        self.failure.may_have_run()
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.failure)?;
        match self.gave_up {
            GaveUp::Final => Ok(()),
            GaveUp::Unsafe => f.write_str(
                "; not retried: the server does not advertise tools.idempotency, so a retry could run the tool twice",
            ),
            GaveUp::MaxAttempts => write!(f, "; gave up after {} attempts", self.attempts),
            GaveUp::MaxElapsed => write!(
                f,
                "; gave up after {:.1} s ({} attempts)",
                self.elapsed.as_secs_f64(),
                self.attempts
            ),
        }
    }
}

impl std::error::Error for CallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.failure)
    }
}

/// Why a [`CallError`] was not retried (again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GaveUp {
    /// The failure is final: retrying with the same key cannot change it (a conflict, an unknown
    /// outcome, a refused key, a program that cannot start, …).
    Final,
    /// A retry could help but might run the tool twice: the server does not advertise
    /// `tools.idempotency` and the tool is not trusted as idempotent
    /// ([`RetryPolicy::trust_idempotent_hint`](super::RetryPolicy::with_trust_idempotent_hint)).
    Unsafe,
    /// [`RetryPolicy::max_attempts`](super::RetryPolicy::with_max_attempts) were made.
    MaxAttempts,
    /// [`RetryPolicy::max_elapsed`](super::RetryPolicy::with_max_elapsed) ran out.
    MaxElapsed,
}

/// What went wrong with one attempt.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// `idempotency_key_conflict`: the key was used before with another tool or other
    /// arguments. The tool did not run. Never retried: use a new key for a new operation.
    #[error("idempotency key conflict: {}", .0.message)]
    Conflict(ErrorData),
    /// `idempotency_outcome_unknown`: the original call may or may not have taken effect and its
    /// outcome is lost; the server will not run it again for this key. Never retried: check the
    /// effect out of band, then use a new key if it must run.
    #[error("outcome unknown: {}", .0.message)]
    OutcomeUnknown(ErrorData),
    /// `idempotency_key_in_progress`: a call with this key is still running. Retried after
    /// `data.retryAfterMs`; this is the last answer when the retries ran out.
    #[error("still in progress: {}", .0.message)]
    InProgress(ErrorData),
    /// `idempotency_store_unavailable`: the server could not read or write its records, so the
    /// tool did not run. Retried with the same key.
    #[error("the server's idempotency store is unavailable: {}", .0.message)]
    StoreUnavailable(ErrorData),
    /// `idempotency_shutting_down`: the server (a gateway) is stopping and took no new keyed
    /// call; the tool did not run. Retried with the same key after `data.retryAfterMs`.
    #[error("the server is shutting down: {}", .0.message)]
    ShuttingDown(ErrorData),
    /// Any other `idempotency_*` refusal (`idempotency_key_invalid`,
    /// `idempotency_arguments_too_large`, `idempotency_quota_exceeded`,
    /// `idempotency_outcome_not_retained`, …). Never retried.
    #[error("the server refused the call ({kind}): {}", error.message)]
    Rejected {
        /// `error.data.type`.
        kind: String,
        /// The JSON-RPC error.
        error: ErrorData,
    },
    /// No response within the attempt's time: the call may have run.
    #[error("no response within {0:?}")]
    Timeout(Duration),
    /// The connection failed or closed while the call was out: the call may have run.
    #[error("the connection failed: {0}")]
    Transport(#[source] ServiceError),
    /// No session could be opened for the attempt: the call was not sent.
    #[error("cannot connect: {0}")]
    Connect(#[source] ConnectError),
    /// A response that is not a `tools/call` result this client understands (an MRTR
    /// `input_required` result, a task, …). Never retried.
    #[error("unexpected response: {0}")]
    UnexpectedResponse(String),
}

impl Failure {
    /// The JSON-RPC error the server answered with, for the `idempotency_*` refusals.
    pub fn error_data(&self) -> Option<&ErrorData> {
        match self {
            Self::Conflict(error)
            | Self::OutcomeUnknown(error)
            | Self::InProgress(error)
            | Self::StoreUnavailable(error)
            | Self::ShuttingDown(error)
            | Self::Rejected { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether the tool may have run (or may still be running) for this key: no answer came back
    /// for a request that was sent (a timeout, a broken connection), the call is still in
    /// progress, or the server says its outcome is unknown. Never run the operation again under a
    /// new key without checking its effect first; a later retry with the same key gets the
    /// outcome, once recorded (except after [`OutcomeUnknown`](Self::OutcomeUnknown)).
    pub fn may_have_run(&self) -> bool {
        matches!(
            self,
            Self::Timeout(_) | Self::Transport(_) | Self::InProgress(_) | Self::OutcomeUnknown(_)
        )
    }
}
