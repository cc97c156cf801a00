//! Engine settings: limits, retention, leases and the after-crash policy, with their defaults.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::key::DEFAULT_MAX_KEY_BYTES;

/// Limits on how many live records may exist, checked atomically with each claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLimits {
    /// Most records one scope (principal) may hold.
    pub max_records_per_scope: u64,
    /// Most records the whole store may hold.
    pub max_records_total: u64,
}

impl RecordLimits {
    /// No limits.
    pub const UNLIMITED: Self = Self {
        max_records_per_scope: u64::MAX,
        max_records_total: u64::MAX,
    };
}

/// What to do with a retry whose original call stopped renewing its lease (its owner crashed or
/// lost contact with the store) before recording an outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AfterCrash {
    /// Answer `idempotency_outcome_unknown` until the record expires: the tool may have run, so it is
    /// never run again for this key. The safe default for side effects such as payments.
    #[default]
    Reject,
    /// Take the record over and run the tool again: the SEP's minimum, which accepts a second
    /// execution when the first one's owner died between executing and recording.
    Reexecute,
}

impl AfterCrash {
    /// The name used on the command line and in configuration files.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Reject => "reject",
            Self::Reexecute => "reexecute",
        }
    }
}

impl fmt::Display for AfterCrash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AfterCrash {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reject" => Ok(Self::Reject),
            "reexecute" => Ok(Self::Reexecute),
            other => Err(format!(
                "unknown after-crash policy {other:?}; expected `reject` or `reexecute`"
            )),
        }
    }
}

/// Settings of an [`Engine`](crate::Engine). Start from [`EngineConfig::default`] and adjust:
///
/// ```
/// use std::time::Duration;
/// use mcp_idempotency::{AfterCrash, EngineConfig};
///
/// let config = EngineConfig::default()
///     .with_retention(Duration::from_secs(3600))
///     .with_after_crash(AfterCrash::Reexecute)
///     .with_max_records_per_scope(1_000);
/// assert_eq!(config.retention(), Duration::from_secs(3600));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    pub(crate) retention: Duration,
    pub(crate) lease: Duration,
    pub(crate) after_crash: AfterCrash,
    pub(crate) in_progress_retry_after: Duration,
    pub(crate) max_key_bytes: usize,
    pub(crate) max_argument_bytes: usize,
    pub(crate) max_outcome_bytes: usize,
    pub(crate) limits: RecordLimits,
}

impl EngineConfig {
    /// Default retention window: 24 hours, as Stripe keeps keys.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
    /// Default longest `idempotencyKey`, in bytes of UTF-8, as Stripe and the IETF draft use.
    pub const DEFAULT_MAX_KEY_BYTES: usize = DEFAULT_MAX_KEY_BYTES;
    /// Default lease of an in-progress call; the owner renews it while the call runs.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
    /// Default size limit of a call's `arguments`.
    pub const DEFAULT_MAX_ARGUMENT_BYTES: usize = 1024 * 1024;
    /// Default size limit of a recorded outcome.
    pub const DEFAULT_MAX_OUTCOME_BYTES: usize = 1024 * 1024;
    /// Default number of live records one scope may hold.
    pub const DEFAULT_MAX_RECORDS_PER_SCOPE: u64 = 10_000;
    /// Default number of live records a store may hold.
    pub const DEFAULT_MAX_RECORDS_TOTAL: u64 = 100_000;
    /// Default `retryAfterMs` of `idempotency_key_in_progress`
    /// ([`EngineConfig::with_in_progress_retry_after`]).
    pub const DEFAULT_IN_PROGRESS_RETRY_AFTER: Duration = Duration::from_secs(1);
    /// Shortest `retryAfterMs` of `idempotency_key_in_progress`, whatever the configuration and
    /// the lease left: a client that retries exactly when told never spins.
    pub const MIN_IN_PROGRESS_RETRY_AFTER: Duration = Duration::from_millis(100);
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            retention: Self::DEFAULT_RETENTION,
            lease: Self::DEFAULT_LEASE,
            after_crash: AfterCrash::Reject,
            in_progress_retry_after: Self::DEFAULT_IN_PROGRESS_RETRY_AFTER,
            max_key_bytes: DEFAULT_MAX_KEY_BYTES,
            max_argument_bytes: Self::DEFAULT_MAX_ARGUMENT_BYTES,
            max_outcome_bytes: Self::DEFAULT_MAX_OUTCOME_BYTES,
            limits: RecordLimits {
                max_records_per_scope: Self::DEFAULT_MAX_RECORDS_PER_SCOPE,
                max_records_total: Self::DEFAULT_MAX_RECORDS_TOTAL,
            },
        }
    }
}

impl EngineConfig {
    /// How long a record is kept after its call completes. A retry after that runs as a new call.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long an in-progress claim lives without renewal.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// What a retry gets after the original call's owner died.
    pub fn with_after_crash(mut self, policy: AfterCrash) -> Self {
        self.after_crash = policy;
        self
    }

    /// The `retryAfterMs` hint sent with `idempotency_key_in_progress` (default
    /// [`DEFAULT_IN_PROGRESS_RETRY_AFTER`](Self::DEFAULT_IN_PROGRESS_RETRY_AFTER), 1 s). The hint
    /// sent is this, or the time left on the running call's lease when that is shorter (the call
    /// renews its lease, or its owner is gone and the retry gets another answer), and never less
    /// than [`MIN_IN_PROGRESS_RETRY_AFTER`](Self::MIN_IN_PROGRESS_RETRY_AFTER) (100 ms).
    pub fn with_in_progress_retry_after(mut self, after: Duration) -> Self {
        self.in_progress_retry_after = after;
        self
    }

    /// Longest accepted key, in bytes.
    pub fn with_max_key_bytes(mut self, max: usize) -> Self {
        self.max_key_bytes = max;
        self
    }

    /// Largest accepted `arguments`, in bytes of JSON text.
    pub fn with_max_argument_bytes(mut self, max: usize) -> Self {
        self.max_argument_bytes = max;
        self
    }

    /// Largest outcome kept for replay, in bytes of JSON text. A larger outcome is recorded as
    /// completed but not retained: retries get `idempotency_outcome_not_retained`, never a second run.
    pub fn with_max_outcome_bytes(mut self, max: usize) -> Self {
        self.max_outcome_bytes = max;
        self
    }

    /// Most live records per scope.
    pub fn with_max_records_per_scope(mut self, max: u64) -> Self {
        self.limits.max_records_per_scope = max;
        self
    }

    /// Most live records in the store.
    pub fn with_max_records_total(mut self, max: u64) -> Self {
        self.limits.max_records_total = max;
        self
    }

    /// The retention window.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The lease duration.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The after-crash policy.
    pub fn after_crash(&self) -> AfterCrash {
        self.after_crash
    }

    /// The record quotas.
    pub fn record_limits(&self) -> RecordLimits {
        self.limits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_crash_parses_its_names() {
        assert_eq!("reject".parse(), Ok(AfterCrash::Reject));
        assert_eq!("reexecute".parse(), Ok(AfterCrash::Reexecute));
        assert!("retry"
            .parse::<AfterCrash>()
            .unwrap_err()
            .contains("expected"));
    }
}
