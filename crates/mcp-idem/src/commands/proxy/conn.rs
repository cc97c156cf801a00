//! Serving the proxy's client connections (HTTP/1.1) so that clients that send nothing cannot hold
//! them: at most `max_connections` are open at once (more wait, unaccepted, until one closes), a
//! request head must arrive within `header_timeout` (counted from the connection's start, or on a
//! kept-alive connection from the next request's first byte), and a kept-alive connection idle
//! for `idle_timeout` is closed. A request being answered (its response body included) is never
//! cut off by these; the request body has the layer's own timeout.
//!
//! When the shutdown signal comes, the listener is closed at once (new connections are refused,
//! so a client or a load balancer turns to another instance), each connection finishes the
//! request it is answering and closes, and [`serve`] returns once the open requests are answered
//! and the idempotency layer's claimed calls are recorded ([`Shutdown::drain`]), or when the grace
//! ends: the layer then cuts off its calls still running (recorded outcome-unknown, answered so),
//! and requests without a key still open are cut off when the process exits. GET streams (a
//! session's server-to-client stream) are not waited for.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use mcp_idempotency::http::{Shutdown, CUT_OFF_WAIT};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;
use tower::Service;

/// Limits on the proxy's client connections.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_connections: usize,
    pub(crate) header_timeout: Duration,
    pub(crate) idle_timeout: Duration,
}

/// Serves `router` on `listener` until `stop` completes, then drains: see the module docs.
pub(crate) async fn serve(
    listener: TcpListener,
    router: super::Routes,
    limits: Limits,
    stop: impl Future<Output = ()>,
    calls: Shutdown,
    grace: Duration,
) {
    let requests = Requests::default();
    accept(listener, router, limits, stop, &requests).await;
    calls.stop_taking_calls();
    tracing::info!(
        requests = requests.open(),
        calls = calls.calls_in_flight(),
        "stopping: no new connections; finishing the requests in flight"
    );
    let answered = async {
        tokio::join!(requests.done(), calls.calls_done());
    };
    if tokio::time::timeout(grace, answered).await.is_ok() {
        return;
    }
    calls.end_grace();
    // The calls cut off are recorded and answered; give their answers a moment to be sent.
    let answered = async {
        tokio::join!(requests.done(), calls.calls_done());
    };
    if tokio::time::timeout(CUT_OFF_WAIT, answered).await.is_err() {
        tracing::warn!(
            requests = requests.open(),
            calls = calls.calls_in_flight(),
            "exiting with requests still open"
        );
    }
}

/// Accepts connections until `shutdown` completes; then closes the listener and asks every open
/// connection to close once it has answered its request.
async fn accept(
    listener: TcpListener,
    router: super::Routes,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    requests: &Requests,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stop, stopped) = watch::channel(());
    let mut shutdown = pin!(shutdown);
    loop {
        let permit = match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    "connection limit reached; new connections wait until one closes"
                );
                tokio::select! {
                    permit = Arc::clone(&permits).acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of file descriptors, or a connection reset before it was accepted.
                    tracing::warn!(error = %err, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let router = router.clone();
        let stopped = stopped.clone();
        let requests = requests.clone();
        tokio::spawn(async move {
            serve_connection(stream, router, limits, stopped, requests).await;
            drop(permit);
        });
    }
    drop(listener);
    drop(stop);
}

/// Requests being answered, GET streams left out: what a stopping proxy waits for.
#[derive(Clone, Debug, Default)]
struct Requests(Arc<RequestsInner>);

#[derive(Debug, Default)]
struct RequestsInner {
    open: std::sync::atomic::AtomicUsize,
    none_open: Notify,
}

impl Requests {
    fn open(&self) -> usize {
        self.0.open.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn enter(&self) -> OpenRequest {
        self.0
            .open
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        OpenRequest(self.clone())
    }

    async fn done(&self) {
        loop {
            let none_open = self.0.none_open.notified();
            tokio::pin!(none_open);
            none_open.as_mut().enable();
            if self.open() == 0 {
                return;
            }
            none_open.await;
        }
    }
}

/// One open request, until its response has been sent (or dropped).
struct OpenRequest(Requests);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        let inner = &(self.0).0;
        if inner.open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            inner.none_open.notify_waiters();
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    router: super::Routes,
    limits: Limits,
    mut stopped: watch::Receiver<()>,
    requests: Requests,
) {
    let activity = Arc::new(Activity::new(Instant::now()));
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: Arc::clone(&activity),
    });
    let service = TowerToHyperService::new(Tracked {
        inner: router,
        activity: Arc::clone(&activity),
        requests,
    });
    let mut conn = pin!(hyper::server::conn::http1::Builder::new()
        .header_read_timeout(None)
        .serve_connection(io, service));
    let mut expired = pin!(activity.expired(limits));
    let mut stopping = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "client connection failed");
                }
                return;
            }
            reason = &mut expired => {
                tracing::debug!(reason, "closing a client connection");
                return;
            }
            _ = stopped.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// What a connection is doing, for its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request since `since`; `head_from` is when its first byte came, on a
    /// kept-alive connection (on a new one the head's time counts from `since`).
    Waiting {
        since: Instant,
        kept_alive: bool,
        head_from: Option<Instant>,
    },
    /// Answering this many requests.
    Busy(usize),
}

impl Phase {
    /// When the connection is to be closed, and why; `None` while it answers a request.
    fn deadline(self, limits: &Limits) -> Option<(Instant, &'static str)> {
        match self {
            Phase::Busy(_) => None,
            Phase::Waiting {
                head_from: Some(start),
                ..
            } => Some((start + limits.header_timeout, "request head too slow")),
            Phase::Waiting {
                since,
                kept_alive: false,
                ..
            } => Some((since + limits.header_timeout, "no request head in time")),
            Phase::Waiting { since, .. } => Some((since + limits.idle_timeout, "idle")),
        }
    }

    fn on_bytes_read(&mut self, now: Instant) {
        if let Phase::Waiting {
            kept_alive: true,
            head_from: head_from @ None,
            ..
        } = self
        {
            *head_from = Some(now);
        }
    }

    fn on_request(&mut self) {
        *self = match *self {
            Phase::Busy(n) => Phase::Busy(n + 1),
            Phase::Waiting { .. } => Phase::Busy(1),
        };
    }

    fn on_response_done(&mut self, now: Instant) {
        *self = match *self {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Waiting {
                since: now,
                kept_alive: true,
                head_from: None,
            },
        };
    }
}

/// What a connection's watchdog does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Watch {
    /// The deadline has passed: close the connection, for this reason.
    Close(&'static str),
    /// Look again at this instant.
    LookAt(Instant),
}

impl Phase {
    /// What the watchdog does when it looks at `now`. It is not told of changes of phase: it looks
    /// again at the deadline, or sooner, within the shortest timeout. No change can bring a
    /// deadline nearer than that (the head's time and the idle time both count from when the
    /// change happens), so every deadline is kept to the instant, and a request costs no timer.
    fn watch(self, now: Instant, limits: &Limits) -> Watch {
        let next_look = now + limits.header_timeout.min(limits.idle_timeout);
        match self.deadline(limits) {
            Some((at, reason)) if at <= now => Watch::Close(reason),
            Some((at, _)) => Watch::LookAt(at.min(next_look)),
            None => Watch::LookAt(next_look),
        }
    }
}

/// A connection's [`Phase`], shared by its socket, its service and its watchdog.
#[derive(Debug)]
struct Activity {
    phase: Mutex<Phase>,
}

impl Activity {
    fn new(now: Instant) -> Self {
        Self {
            phase: Mutex::new(Phase::Waiting {
                since: now,
                kept_alive: false,
                head_from: None,
            }),
        }
    }

    fn update(&self, change: impl FnOnce(&mut Phase)) {
        change(&mut self.phase.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Completes when the connection's deadline passes; returns why.
    async fn expired(&self, limits: Limits) -> &'static str {
        let mut sleep = pin!(tokio::time::sleep(Duration::ZERO));
        loop {
            let now = Instant::now();
            let phase = *self.phase.lock().unwrap_or_else(PoisonError::into_inner);
            match phase.watch(now, &limits) {
                Watch::Close(reason) => return reason,
                Watch::LookAt(at) => {
                    sleep.as_mut().reset(at);
                    sleep.as_mut().await;
                }
            }
        }
    }
}

/// The client's socket, noting when bytes arrive.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity
                .update(|phase| phase.on_bytes_read(Instant::now()));
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The service, noting when a request starts and when its response has been sent (or dropped).
#[derive(Clone)]
struct Tracked {
    inner: super::Routes,
    activity: Arc<Activity>,
    requests: Requests,
}

impl Service<Request<Incoming>> for Tracked {
    type Response = Response<TrackedBody>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<Request<Incoming>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        self.activity.update(Phase::on_request);
        let busy = Busy(Arc::clone(&self.activity));
        // A GET is a stream the server keeps open (a session's server-to-client stream): a
        // stopping proxy does not wait for it.
        let open = (request.method() != http::Method::GET).then(|| self.requests.enter());
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = call.await?;
            Ok(response.map(|body| TrackedBody {
                body,
                _busy: busy,
                _open: open,
            }))
        })
    }
}

/// Marks a request answered when dropped.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0
            .update(|phase| phase.on_response_done(Instant::now()));
    }
}

/// A response body that keeps its request marked as being answered until it is dropped.
struct TrackedBody {
    body: Body,
    _busy: Busy,
    _open: Option<OpenRequest>,
}

impl hyper::body::Body for TrackedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_connections: 1,
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
    };

    #[test]
    fn deadlines_follow_the_phase() {
        let t0 = Instant::now();
        let mut phase = Activity::new(t0).phase.into_inner().unwrap();
        // A new connection: its first head is due `header_timeout` after the connection began,
        // however its bytes trickle in.
        assert_eq!(
            phase.deadline(&LIMITS).unwrap().0,
            t0 + LIMITS.header_timeout
        );
        phase.on_bytes_read(t0 + Duration::from_secs(5));
        assert_eq!(
            phase.deadline(&LIMITS).unwrap().0,
            t0 + LIMITS.header_timeout
        );

        phase.on_request();
        phase.on_request();
        assert_eq!(phase.deadline(&LIMITS), None);
        let t1 = t0 + Duration::from_secs(300);
        phase.on_response_done(t1);
        assert_eq!(phase.deadline(&LIMITS), None, "one request is still open");
        phase.on_response_done(t1);
        // Kept alive: idle until the next request's first byte, then that head has its time.
        assert_eq!(phase.deadline(&LIMITS).unwrap().0, t1 + LIMITS.idle_timeout);
        let t2 = t1 + Duration::from_secs(100);
        phase.on_bytes_read(t2);
        phase.on_bytes_read(t2 + Duration::from_secs(1));
        assert_eq!(
            phase.deadline(&LIMITS).unwrap().0,
            t2 + LIMITS.header_timeout
        );
    }

    #[test]
    fn the_watchdog_looks_again_before_a_change_can_bring_a_deadline_nearer() {
        let t0 = Instant::now();
        let look = t0 + Duration::from_secs(30);
        // A new connection: the watchdog looks at its head's deadline, and closes it then.
        let new = Activity::new(t0).phase.into_inner().unwrap();
        assert_eq!(
            new.watch(t0, &LIMITS),
            Watch::LookAt(t0 + LIMITS.header_timeout)
        );
        assert_eq!(
            new.watch(t0 + LIMITS.header_timeout, &LIMITS),
            Watch::Close("no request head in time")
        );

        // Idle on a kept-alive connection: the idle deadline is far, but a request's first byte
        // may come at once, and its head is due `header_timeout` later: the watchdog looks then.
        let idle = Phase::Waiting {
            since: t0,
            kept_alive: true,
            head_from: None,
        };
        let Watch::LookAt(next) = idle.watch(look, &LIMITS) else {
            panic!("an idle connection closed early");
        };
        assert_eq!(next, look + LIMITS.header_timeout);
        let mut head = idle;
        head.on_bytes_read(look);
        assert_eq!(head.deadline(&LIMITS).map(|(at, _)| at), Some(next));
        assert_eq!(
            head.watch(next, &LIMITS),
            Watch::Close("request head too slow")
        );
        // Nothing came: it looks again, and closes at the idle deadline to the instant.
        let idle_end = t0 + LIMITS.idle_timeout;
        assert_eq!(
            idle.watch(idle_end - Duration::from_secs(1), &LIMITS),
            Watch::LookAt(idle_end)
        );
        assert_eq!(idle.watch(idle_end, &LIMITS), Watch::Close("idle"));

        // Answering: no deadline, but the answer may end at once and the idle time start: with
        // an idle timeout shorter than the head's, the watchdog looks within that.
        let busy = Phase::Busy(1);
        assert_eq!(
            busy.watch(look, &LIMITS),
            Watch::LookAt(look + LIMITS.header_timeout)
        );
        let short_idle = Limits {
            idle_timeout: Duration::from_secs(1),
            ..LIMITS
        };
        let mut done = busy;
        done.on_response_done(look);
        assert_eq!(
            busy.watch(look, &short_idle),
            Watch::LookAt(look + Duration::from_secs(1))
        );
        assert_eq!(
            done.watch(look + Duration::from_secs(1), &short_idle),
            Watch::Close("idle")
        );
    }
}
