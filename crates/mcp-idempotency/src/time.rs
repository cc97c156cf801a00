//! Wall-clock instants as plain numbers.
//!
//! Records outlive processes and are shared between machines, so instants are milliseconds since the
//! Unix epoch rather than [`std::time::Instant`]. The engine never reads a clock: callers pass `now`.
//! The deduplicator reads and waits on a [`Clock`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

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

/// A wait on a [`Clock`], as [`Clock::sleep`] returns it.
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Where the [`Deduplicator`](crate::Deduplicator) reads the time and waits: lease deadlines,
/// completion and expiry times, and every wait of a claim (a duplicate waiting for a running
/// call, the renewals of leases, the completions and releases sent again). [`SystemClock`] by
/// default; [`ManualClock`] in tests and simulations, so that a lease can run out and a backoff
/// pass without anyone sleeping. (rustls' `TimeProvider` and quinn's `Runtime::now` and
/// `new_timer` play this role there.)
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;

    /// Waits until `duration` has passed on this clock.
    fn sleep(&self, duration: Duration) -> Sleep<'_>;
}

/// The system's wall clock; its waits are tokio's timer ([`tokio::time::sleep`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    fn sleep(&self, duration: Duration) -> Sleep<'_> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// A clock that moves only when told: for tests and simulations. Its waits end when
/// [`advance`](Self::advance) moves it to or past their end, never by themselves: a test drives
/// every wait of a deduplicator on it, and no real time passes.
///
/// ```
/// use std::time::Duration;
/// use mcp_idempotency::{Clock, ManualClock, Timestamp};
///
/// let clock = ManualClock::new(Timestamp::from_millis(1_000));
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now(), Timestamp::from_millis(3_000));
/// ```
#[derive(Debug)]
pub struct ManualClock {
    /// The time in milliseconds since the Unix epoch; each pending [`Clock::sleep`] holds a
    /// receiver, woken when the time moves.
    millis: watch::Sender<u64>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new(Timestamp::default())
    }
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            millis: watch::channel(start.as_millis()).0,
        }
    }

    /// Moves the clock forward by `by`, and wakes the waits that end by then (they run when
    /// their tasks are next polled).
    pub fn advance(&self, by: Duration) {
        let millis = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.millis
            .send_modify(|now| *now = now.saturating_add(millis));
    }

    /// How many waits on this clock have not ended yet (made by [`Clock::sleep`] and not
    /// dropped): a test or a simulator can tell from it that a task has gone to sleep.
    pub fn sleepers(&self) -> usize {
        self.millis.receiver_count()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(*self.millis.borrow())
    }

    fn sleep(&self, duration: Duration) -> Sleep<'_> {
        let end = self.now().saturating_add(duration).as_millis();
        let mut millis = self.millis.subscribe();
        Box::pin(async move {
            // The sender lives as long as the clock, which this wait borrows: it cannot fail.
            let _ = millis.wait_for(|&now| now >= end).await;
        })
    }
}

/// The wait after `failures` failed attempts in a row (at least one): `min`, doubling at each
/// failure, up to `max`. The one backoff of the claims (a duplicate looking again for a running
/// call's outcome, the releases of claims whose answer was lost, the completions sent again)
/// and of `mcp-idem proxy` asking its upstream's name.
pub fn backoff(failures: u32, min: Duration, max: Duration) -> Duration {
    let shift = failures.saturating_sub(1).min(16);
    min.saturating_mul(1 << shift).min(max)
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
    fn the_backoff_doubles_between_its_bounds() {
        let waits = |min, max| {
            (1..=8)
                .map(|n| backoff(n, Duration::from_millis(min), Duration::from_millis(max)))
                .map(|wait| wait.as_millis())
                .collect::<Vec<_>>()
        };
        assert_eq!(waits(50, 500), [50, 100, 200, 400, 500, 500, 500, 500]);
        assert_eq!(
            waits(100, 5_000),
            [100, 200, 400, 800, 1600, 3200, 5000, 5000]
        );
        let far = backoff(u32::MAX, Duration::from_secs(1), Duration::MAX);
        assert_eq!(far, Duration::from_secs(1 << 16), "the doubling stops");
    }

    #[test]
    fn a_manual_sleep_ends_when_the_clock_is_moved_past_it() {
        use std::task::{Context, Poll, Waker};

        let clock = ManualClock::new(Timestamp::from_millis(1_000));
        let mut cx = Context::from_waker(Waker::noop());
        let mut short = clock.sleep(Duration::from_millis(100));
        let mut long = clock.sleep(Duration::from_millis(300));
        assert_eq!(clock.sleepers(), 2);
        assert!(short.as_mut().poll(&mut cx).is_pending());
        clock.advance(Duration::from_millis(99));
        assert!(short.as_mut().poll(&mut cx).is_pending());
        clock.advance(Duration::from_millis(1));
        assert_eq!(short.as_mut().poll(&mut cx), Poll::Ready(()));
        assert!(long.as_mut().poll(&mut cx).is_pending());
        drop(short);
        assert_eq!(clock.sleepers(), 1);
        clock.advance(Duration::from_secs(5));
        assert_eq!(long.as_mut().poll(&mut cx), Poll::Ready(()));
        drop(long);
        assert_eq!(clock.sleepers(), 0);
        // A sleep of nothing ends at once.
        assert_eq!(
            clock.sleep(Duration::ZERO).as_mut().poll(&mut cx),
            Poll::Ready(())
        );
    }

    #[test]
    fn now_is_after_2020() {
        assert!(Timestamp::now().as_millis() > 1_577_836_800_000);
    }
}
