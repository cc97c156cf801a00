//! Each host's clock: the simulation's time, which tokio's paused clock moves, plus the host's
//! own offset, which skews and jumps.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use mcp_idempotency::{Clock, Sleep, Timestamp};
use tokio::time::Instant;

/// The instant every simulation starts at, as the hosts' clocks read it (2027-01-01T00:00:00Z).
pub const EPOCH: Timestamp = Timestamp::from_millis(1_798_761_600_000);

/// A host's wall clock: [`EPOCH`] plus the simulated time elapsed plus the host's offset. Its
/// waits are tokio's timer, on the simulation's time: a jump of the wall clock does not end a
/// wait early, as on a real host (timers run on the monotonic clock).
#[derive(Debug)]
pub struct HostClock {
    start: Instant,
    offset_ms: AtomicI64,
}

impl HostClock {
    /// A clock `offset_ms` ahead of the simulation's time (behind when negative).
    pub fn new(start: Instant, offset_ms: i64) -> Self {
        Self {
            start,
            offset_ms: AtomicI64::new(offset_ms),
        }
    }

    /// Moves the clock by `by_ms` (backwards when negative), as an NTP step does.
    pub fn jump(&self, by_ms: i64) {
        self.offset_ms.fetch_add(by_ms, Ordering::Relaxed);
    }

    /// How far ahead of the simulation's time this clock is.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }
}

impl Clock for HostClock {
    fn now(&self) -> Timestamp {
        let elapsed = i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        let millis = i64::try_from(EPOCH.as_millis()).unwrap_or(i64::MAX)
            + elapsed
            + self.offset_ms.load(Ordering::Relaxed);
        Timestamp::from_millis(u64::try_from(millis).unwrap_or(0))
    }

    fn sleep(&self, duration: Duration) -> Sleep<'_> {
        Box::pin(tokio::time::sleep(duration))
    }
}
