//! The graceful stop of one [`StdioProxy`](super::StdioProxy) run, shared by its two pumps and
//! the task that drains it.
//!
//! A run stops when the client's input ends or the caller's `stop` future completes, whichever
//! comes first. From then on keyed calls are refused (`idempotency_shutting_down`, nothing
//! claimed); everything else is still forwarded both ways, so that a call in flight can finish
//! (it may wait for the client's answer to a server request). The drain is over when no request
//! forwarded to the server is unanswered, or when the grace period ends: then the claimed calls
//! still running are recorded as outcome-unknown and answered, the client's input is no longer
//! read, and the server's input is closed.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use std::future::Future;
use std::sync::Mutex;

use tokio::sync::Notify;

use super::{lock, send, StdioProxy, ToClient, GRACE_ENDED};
use crate::claims::StopGate;
use crate::interceptor::Interceptor;
use crate::RunningClaim;

/// Where a run is in its stop; every flag only goes from `false` to `true`.
#[derive(Debug, Default)]
pub(super) struct Stopping {
    /// New keyed calls are refused.
    draining: AtomicBool,
    /// The drain is over: nothing more goes to the server.
    over: AtomicBool,
    /// Keyed calls past the `draining` check and not yet handed to the interceptor (their claim
    /// is being taken): the drain waits for them as for calls in flight.
    deciding: AtomicUsize,
    /// Something the drain waits for may have changed (a response, a decided call).
    pub(super) progress: Notify,
    /// The client's input ended.
    pub(super) client_ended: Notify,
    /// The drain is over.
    pub(super) drained: Notify,
    /// The server's output ended ([`server_gone`](Self::server_gone)), for the client pump, which
    /// stops reading, and for the drain, which stops waiting: one `Notify` each, as `notify_one`
    /// keeps its permit for one waiter, which may not be waiting yet.
    pub(super) server_gone_for_pump: Notify,
    pub(super) server_gone_for_drain: Notify,
    /// The server answered something, or its output ended: a call waiting for the server's name
    /// looks again ([`notify_waiters`](Notify::notify_waiters): every waiter, none kept).
    pub(super) server_answered: Notify,
    /// The server's output has ended.
    server_ended: AtomicBool,
}

impl Stopping {
    /// Starts the drain: keyed calls from now on are refused.
    pub(super) fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub(super) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Ends the drain; the client pump stops and closes the server's input.
    pub(super) fn end_drain(&self) {
        self.over.store(true, Ordering::SeqCst);
        self.drained.notify_one();
    }

    /// The server's output has ended: nothing the client sends can be answered any more.
    pub(super) fn server_gone(&self) {
        self.server_ended.store(true, Ordering::SeqCst);
        self.server_gone_for_pump.notify_one();
        self.server_gone_for_drain.notify_one();
        self.server_answered.notify_waiters();
    }

    /// Whether the server's output has ended.
    pub(super) fn is_server_gone(&self) -> bool {
        self.server_ended.load(Ordering::SeqCst)
    }

    pub(super) fn is_over(&self) -> bool {
        self.over.load(Ordering::SeqCst)
    }

    /// Marks a keyed call as being decided, then tells whether it must be refused. Counting
    /// first (both sequentially consistent) means the drain either sees the call counted or the
    /// call sees the drain: a call is never claimed behind the drain's back.
    pub(super) fn enter_decision(&self) -> Deciding<'_> {
        self.deciding.fetch_add(1, Ordering::SeqCst);
        Deciding {
            stopping: self,
            refuse: self.is_draining(),
        }
    }

    /// Whether no keyed call is being decided.
    pub(super) fn none_deciding(&self) -> bool {
        self.deciding.load(Ordering::SeqCst) == 0
    }
}

/// A keyed call being decided; dropped once the interceptor holds it (or it was answered).
pub(super) struct Deciding<'a> {
    stopping: &'a Stopping,
    /// The run is draining: refuse the call without claiming it.
    refuse: bool,
}

impl StopGate for Deciding<'_> {
    fn refuses(&self) -> bool {
        self.refuse
    }

    /// The drain ended while the key was being claimed: the call is not sent.
    fn stopped(&self) -> bool {
        self.stopping.is_over()
    }
}

impl Drop for Deciding<'_> {
    fn drop(&mut self) {
        self.stopping.deciding.fetch_sub(1, Ordering::SeqCst);
        self.stopping.progress.notify_one();
    }
}

impl StdioProxy {
    /// Waits for `stop` or the client's EOF, then drains (see [Stopping](super#stopping)); returns
    /// how many claimed calls were cut off by the end of the grace.
    pub(super) async fn drain<S: Future<Output = ()>>(
        &self,
        stop: S,
        state: &Mutex<Interceptor<RunningClaim>>,
        to_client: &ToClient,
        stopping: &Stopping,
    ) -> usize {
        // Once the server's output has ended, the run answers what is left in flight itself.
        let server_gone = stopping.server_gone_for_drain.notified();
        tokio::pin!(server_gone);
        tokio::select! {
            () = stop => tracing::info!("stopping: no new keyed calls"),
            () = stopping.client_ended.notified() => {
                tracing::debug!("the client closed its input; finishing the requests in flight");
            }
            () = &mut server_gone => return 0,
        }
        stopping.start_draining();
        let grace = tokio::time::sleep(self.shutdown_grace);
        tokio::pin!(grace);
        let cut_off = loop {
            let progress = stopping.progress.notified();
            if stopping.none_deciding() && !lock(state).has_requests_in_flight() {
                break 0;
            }
            tokio::select! {
                () = progress => {}
                () = &mut server_gone => break 0,
                () = &mut grace => break self.cut_off_calls(state, to_client).await,
            }
        };
        stopping.end_drain();
        cut_off
    }

    /// Records the claimed calls still running at the end of the grace as outcome-unknown and
    /// answers them; returns how many there were.
    async fn cut_off_calls(
        &self,
        state: &Mutex<Interceptor<RunningClaim>>,
        to_client: &ToClient,
    ) -> usize {
        let orphans = lock(state).on_server_gone(GRACE_ENDED);
        let cut_off = orphans.len();
        if cut_off > 0 {
            tracing::warn!(
                calls = cut_off,
                grace_ms = u64::try_from(self.shutdown_grace.as_millis()).unwrap_or(u64::MAX),
                "the shutdown grace ended with calls running; recording them as outcome-unknown"
            );
        }
        for orphan in orphans {
            orphan
                .claim
                .abandon("the gateway shut down while the call ran (its shutdown grace ended)")
                .await;
            if let Some(response) = orphan.response {
                send(to_client, &mut response.into_bytes()).await;
            }
        }
        cut_off
    }
}
