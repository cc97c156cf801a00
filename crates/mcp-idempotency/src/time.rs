//! Wall-clock instants as plain numbers.
//!
//! Records outlive processes and are shared between machines, so instants are milliseconds since the
//! Unix epoch rather than [`std::time::Instant`]. The engine never reads a clock: callers pass `now`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The instant `millis` milliseconds after the Unix epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// The current wall-clock time. Only I/O adapters call this; the engine takes `now` as input.
    pub fn now() -> Self {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Self(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
    }

    /// `self + duration`, saturating at the far future.
    pub fn saturating_add(self, duration: Duration) -> Self {
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(millis))
    }

    /// How long after `earlier` this instant is; zero if it is not after it.
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({}ms)", self.0)
    }
}

/// Where the [`Deduplicator`](crate::Deduplicator) reads the time: lease deadlines, completion
/// and expiry times. [`SystemClock`] by default; [`ManualClock`] in tests, so that a lease can run
/// out without anyone sleeping. (rustls' `TimeProvider` and quinn's `Runtime::now` play this role
/// there.)
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told: for tests.
///
/// ```
/// use std::time::Duration;
/// use mcp_idempotency::{Clock, ManualClock, Timestamp};
///
/// let clock = ManualClock::new(Timestamp::from_millis(1_000));
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now(), Timestamp::from_millis(3_000));
/// ```
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self(AtomicU64::new(start.as_millis()))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let millis = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(millis))
            });
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_millis(u64::MAX - 1);
        assert_eq!(
            t.saturating_add(Duration::from_secs(5)).as_millis(),
            u64::MAX
        );
        assert_eq!(
            Timestamp::from_millis(5).saturating_since(Timestamp::from_millis(9)),
            Duration::ZERO
        );
        assert_eq!(
            Timestamp::from_millis(9).saturating_since(Timestamp::from_millis(5)),
            Duration::from_millis(4)
        );
    }

    #[test]
    fn now_is_after_2020() {
        assert!(Timestamp::now().as_millis() > 1_577_836_800_000);
    }
}
