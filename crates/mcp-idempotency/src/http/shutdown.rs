//! [`Shutdown`]: stopping an [`IdempotencyLayer`](super::IdempotencyLayer) without leaving a
//! claim that nobody owns.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::claims::StopGate;

/// Longest [`Shutdown::drain`] waits, after the grace, for the calls it cut off to be recorded
/// and answered (a store that does not answer leaves them in progress until their lease ends).
pub const CUT_OFF_WAIT: Duration = Duration::from_secs(2);

/// The graceful stop of an [`IdempotencyLayer`](super::IdempotencyLayer), shared by every service
/// it made ([`IdempotencyLayer::shutdown`](super::IdempotencyLayer::shutdown)). A cheap clone.
///
/// Call [`drain`](Self::drain) when the server stops (after it stopped accepting connections):
/// keyed calls that arrive from then on are answered `idempotency_shutting_down` (status 200, a
/// JSON-RPC error; nothing runs, nothing is claimed); the claimed calls in flight, also those whose
/// client went away, get the grace to be recorded and answered; those still running then are
/// recorded as outcome-unknown and answered `idempotency_outcome_unknown` (in their SSE stream if it
/// has begun). Requests without a key are not refused or cut off here: they end with the server.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    stopping: AtomicBool,
    /// Keyed calls being decided or relayed.
    calls: AtomicUsize,
    /// Notified when `calls` drops to zero.
    idle: Notify,
    /// `true` once the grace has ended.
    grace_over: watch::Sender<bool>,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            stopping: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
            idle: Notify::new(),
            grace_over: watch::Sender::new(false),
        }
    }
}

impl Shutdown {
    /// Stops taking keyed calls, waits at most `grace` for the claimed calls in flight to be
    /// recorded and answered, then cuts off those still running (recorded outcome-unknown and
    /// answered so) and waits at most [`CUT_OFF_WAIT`] for that. Returns how many were cut off.
    pub async fn drain(&self, grace: Duration) -> usize {
        self.stop_taking_calls();
        if tokio::time::timeout(grace, self.calls_done()).await.is_ok() {
            return 0;
        }
        let cut_off = self.end_grace();
        if tokio::time::timeout(CUT_OFF_WAIT, self.calls_done())
            .await
            .is_err()
        {
            tracing::warn!(
                calls = self.calls_in_flight(),
                "calls cut off at shutdown could not all be recorded in time"
            );
        }
        cut_off
    }

    /// Keyed calls arriving from now on are refused with `idempotency_shutting_down`.
    pub fn stop_taking_calls(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether keyed calls are refused.
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::SeqCst)
    }

    /// Keyed calls being decided or waiting for their upstream answer.
    pub fn calls_in_flight(&self) -> usize {
        self.inner.calls.load(Ordering::SeqCst)
    }

    /// Completes once no keyed call is in flight.
    pub async fn calls_done(&self) {
        loop {
            let idle = self.inner.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.calls_in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Ends the grace: the claimed calls still running are recorded as outcome-unknown and
    /// answered so (and keyed calls are refused, if they were not yet). Returns how many calls
    /// were in flight.
    pub fn end_grace(&self) -> usize {
        self.stop_taking_calls();
        let calls = self.calls_in_flight();
        if calls > 0 {
            tracing::warn!(
                calls,
                "the shutdown grace ended with calls running; recording them as outcome-unknown"
            );
        }
        self.inner.grace_over.send_replace(true);
        calls
    }

    /// Counts a keyed call in, unless keyed calls are refused (then `None`). Counting first, then
    /// reading the flag (both sequentially consistent), means a drain either sees the call or the
    /// call sees the drain.
    pub(super) fn enter(&self) -> Option<CallGuard> {
        self.inner.calls.fetch_add(1, Ordering::SeqCst);
        let guard = CallGuard(self.clone());
        (!self.is_stopping()).then_some(guard)
    }

    /// Whether the grace has ended.
    pub(super) fn grace_is_over(&self) -> bool {
        *self.inner.grace_over.borrow()
    }

    /// Completes when the grace has ended.
    pub(super) async fn grace_ended(&self) {
        let mut over = self.inner.grace_over.subscribe();
        if over.wait_for(|over| *over).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// One keyed call counted by [`Shutdown`], until it is dropped.
#[derive(Debug)]
pub(super) struct CallGuard(Shutdown);

impl CallGuard {
    /// The shutdown this call is counted by.
    pub(super) fn shutdown(&self) -> &Shutdown {
        &self.0
    }
}

/// A keyed call's place in the count, `None` if keyed calls were refused when it came
/// ([`Shutdown::enter`]).
impl StopGate for Option<CallGuard> {
    fn refuses(&self) -> bool {
        self.is_none()
    }

    /// The shutdown grace ended while the key was being claimed: the call is not forwarded.
    fn stopped(&self) -> bool {
        self.as_ref()
            .is_some_and(|call| call.shutdown().grace_is_over())
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if self.0.inner.calls.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.inner.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_drain_waits_for_calls_then_cuts_them_off() {
        let shutdown = Shutdown::default();
        let call = shutdown.enter().expect("taking calls");
        assert_eq!(shutdown.calls_in_flight(), 1);
        let drained = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { shutdown.drain(Duration::from_secs(3600)).await }
        });
        tokio::task::yield_now().await;
        assert!(shutdown.enter().is_none(), "refused while stopping");
        drop(call);
        assert_eq!(drained.await.unwrap(), 0);

        let shutdown = Shutdown::default();
        let call = shutdown.enter().expect("taking calls");
        let cut_off = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                shutdown.grace_ended().await;
                drop(call);
            }
        });
        assert_eq!(shutdown.drain(Duration::from_millis(1)).await, 1);
        cut_off.await.unwrap();
        assert_eq!(shutdown.calls_in_flight(), 0);
    }
}
