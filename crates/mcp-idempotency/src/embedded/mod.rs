//! SEP-3182 inside a server whose transport is not this crate's: one message at a time, for the
//! Python and TypeScript bindings.
//!
//! The host SDK keeps its own transport (stdio, Streamable HTTP) and its own message loop. For
//! each connection it asks [`Embedded::connect`] for a [`Connection`], hands every message from
//! the client to [`Connection::from_client`] and every message from the server to
//! [`Connection::from_server`], and does what each answer says. Every decision is the
//! [`Interceptor`]'s and the [`Deduplicator`]'s, exactly as under `mcp-idem wrap`: the same
//! replays, rejections, capability injection and `_meta` key; a binding only carries messages.
//!
//! ```
//! use mcp_idempotency::embedded::{FromClient, FromServer, Settings};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut settings = Settings::new("embedded:docs");
//! settings.set("store", "memory")?;
//! let gateway = settings.open().await?;
//! let connection = gateway.connect(None);
//! let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{"amount":5},"idempotencyKey":"k-1"}}"#;
//! // Claimed: the call goes to the server, the key moved to `_meta`.
//! let FromClient::ForwardRewritten(to_server) = connection.from_client(call).await else { panic!() };
//! assert!(to_server.contains("mcp-idem/idempotencyKey"));
//! // The server's answer is recorded, then passed on.
//! let answer = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ch_1"}]}}"#;
//! assert!(matches!(connection.from_server(answer).await, FromServer::Forward));
//! // The retry, with a new id, is answered from the record.
//! let retry = call.replace(r#""id":1"#, r#""id":2"#);
//! let FromClient::Respond(replayed) = connection.from_client(&retry).await else { panic!() };
//! assert!(replayed.contains("ch_1"));
//! # Ok(())
//! # }
//! ```
//!
//! With `tools = "suggested"`, the host first asks [`Connection::tools_request`] whether to run
//! a `tools/list` on its own server before a `tools/call`, as `wrap` lists the tools itself.
//!
//! Ending a connection ([`Connection::close`]) records the claimed calls still running as
//! outcome-unknown, answers them `idempotency_outcome_unknown`, and refuses later keyed calls with
//! `idempotency_shutting_down`, as `wrap` does when its server exits.

mod gateways;
mod host;
mod listing;
pub mod log_format;
pub mod options;
mod settings;

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use crate::claims::StopGate;
use crate::interceptor::{
    CancelPolicy, ClientAction, Decided, Interceptor, InterceptorConfig, ServerAction,
};
use crate::record::Scope;
use crate::{Deduplicator, RunningClaim};

pub use gateways::Gateways;
#[cfg(feature = "otel")]
pub use host::export_telemetry;
pub use host::{log_to_stderr, log_to_stderr_as, runtime, Step};
pub use log_format::LogFormat;
pub use settings::{default_sqlite_path, store_url_or_default, Settings, SetupError};

/// A gateway in process: the deduplicator, the scope its records belong to, and the interceptor's
/// settings, shared by every [`Connection`]. Cheap to clone; clones are equal, other gateways are
/// not. Expired records are purged every [`PURGE_EVERY`](crate::upkeep::PURGE_EVERY) while a
/// clone is alive (as `wrap` does).
#[derive(Clone, Debug)]
pub struct Embedded {
    inner: Arc<Inner>,
}

impl PartialEq for Embedded {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for Embedded {}

#[derive(Debug)]
struct Inner {
    dedup: Deduplicator,
    scope: Scope,
    config: InterceptorConfig,
    store_io: StoreIo,
    purge: Option<tokio::task::AbortHandle>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(purge) = self.purge.take() {
            purge.abort();
        }
    }
}

impl Embedded {
    /// A gateway deciding with `dedup`, recording under `scope`. Started on a tokio runtime, it
    /// purges expired records on it.
    pub fn new(dedup: Deduplicator, scope: Scope, config: InterceptorConfig) -> Self {
        Self::start(dedup, scope, config, StoreIo::Runtime)
    }

    /// [`new`](Self::new), its decisions that wait on the store run where `store_io` says.
    fn start(
        dedup: Deduplicator,
        scope: Scope,
        config: InterceptorConfig,
        store_io: StoreIo,
    ) -> Self {
        let purge = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            let dedup = dedup.clone();
            let purge = crate::upkeep::purge_periodically(dedup);
            runtime.spawn(purge).abort_handle()
        });
        Self {
            inner: Arc::new(Inner {
                dedup,
                scope,
                config,
                store_io,
                purge,
            }),
        }
    }

    /// A new connection (one stdio session, one HTTP session or stateless request): its own
    /// request ids and calls in flight, this gateway's records. `principal` overrides the
    /// gateway's for this connection's records (the authenticated caller of an HTTP request).
    pub fn connect(&self, principal: Option<&str>) -> Connection {
        let scope = match principal {
            Some(principal) => Scope::new(self.inner.scope.namespace(), principal),
            None => self.inner.scope.clone(),
        };
        Connection {
            dedup: self.inner.dedup.clone(),
            scope,
            state: Mutex::new(Interceptor::new(self.inner.config.clone())),
            closed: AtomicBool::new(false),
            listing: AtomicBool::new(false),
            lists_tools: self.lists_tools(),
            store_io: self.inner.store_io,
        }
    }

    /// The scope records are kept under by default.
    pub fn scope(&self) -> &Scope {
        &self.inner.scope
    }

    /// The deduplicator.
    pub fn deduplicator(&self) -> &Deduplicator {
        &self.inner.dedup
    }

    /// Whether the suggested policies apply (`tools = "suggested"`): a host then asks each
    /// connection's [`tools_request`](Connection::tools_request) before a `tools/call`; without
    /// them it need not ask.
    pub fn lists_tools(&self) -> bool {
        self.inner.config.policies().is_suggested()
    }

    /// What is done with cancellations of claimed calls (the `cancel` option).
    pub fn cancel_policy(&self) -> CancelPolicy {
        self.inner.config.cancel()
    }

    /// Waits up to `grace` for the outcomes the store failed to take and that are being sent again
    /// in the background (call it before the process exits; [`Gateways::settle_at_exit`] does it
    /// for every gateway a binding opened); returns how many are still pending.
    pub async fn settle(&self, grace: Duration) -> usize {
        crate::upkeep::settle_completions(&self.inner.dedup, grace).await
    }
}

/// What to do with a message from the client.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub enum FromClient {
    /// Give the message to the server as it is.
    Forward,
    /// Give this message to the server instead (a claimed call: key moved to `_meta`).
    ForwardRewritten(String),
    /// Send this message (a response) back to the client; nothing reaches the server.
    Respond(String),
    /// Drop the message (an absorbed cancellation).
    Drop,
}

/// What to do with a message from the server.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub enum FromServer {
    /// Send the message to the client as it is.
    Forward,
    /// Send this message to the client instead (a discovery result with the capability added).
    ForwardRewritten(String),
    /// Drop the message (the answer to a call the client cancelled; its outcome is recorded).
    Drop,
}

/// A message from the client, read by [`Connection::receive`]: decide it with
/// [`Connection::decide`] (dropped undecided, a call is neither claimed nor sent).
#[must_use]
#[derive(Debug)]
pub struct Received(ClientAction<RunningClaim>);

impl Received {
    /// Whether deciding may wait for another call's outcome: a duplicate of a running call under
    /// a key the client did not send (a business identifier, a key argument, a window) waits for
    /// it, up to its tool's `wait`. A driver must then not hold up the messages after this one:
    /// the running call may be waiting for one of them (the client's answer to its elicitation,
    /// say). `wrap` decides such calls beside its reads for the same reason.
    pub fn may_wait(&self) -> bool {
        matches!(&self.0, ClientAction::Decide(call) if call.terms().wait.is_some())
    }
}

/// One connection's interceptor state. Messages of one direction must be handed over
/// ([`from_client`](Self::from_client), [`receive`](Self::receive)) in the order they travel;
/// the two directions may be handed over concurrently, and so may the decisions of received
/// messages.
#[derive(Debug)]
pub struct Connection {
    dedup: Deduplicator,
    scope: Scope,
    state: Mutex<Interceptor<RunningClaim>>,
    closed: AtomicBool,
    /// Set once this connection asked for the server's tools ([`tools_request`](Self::tools_request)):
    /// their next pages are asked for too.
    listing: AtomicBool,
    /// [`Embedded::lists_tools`].
    lists_tools: bool,
    store_io: StoreIo,
}

impl Connection {
    /// Decides on a message from the client: a keyed `tools/call` is claimed, replayed or
    /// rejected here; everything else passes. The same as [`receive`](Self::receive) then
    /// [`decide`](Self::decide).
    pub async fn from_client(&self, message: &str) -> FromClient {
        self.decide(self.receive(message)).await
    }

    /// Reads a message from the client, without waiting: what [`decide`](Self::decide) then
    /// decides. For a driver that hands messages over in order but does not await each decision
    /// before the next message: [`Received::may_wait`] says which decisions must not hold up the
    /// messages after them.
    pub fn receive(&self, message: &str) -> Received {
        Received(self.lock().on_client_message(message))
    }

    /// Decides on a message [`receive`](Self::receive)d by this connection.
    pub async fn decide(&self, received: Received) -> FromClient {
        match received.0 {
            ClientAction::Forward => FromClient::Forward,
            ClientAction::ForwardTraced { message, .. } => FromClient::ForwardRewritten(message),
            ClientAction::Absorb => FromClient::Drop,
            ClientAction::Respond(response) => FromClient::Respond(response),
            ClientAction::RecordThenForward(claim, outcome) => {
                claim.record(outcome).await;
                FromClient::Forward
            }
            ClientAction::Decide(call) => {
                let decision = self
                    .dedup
                    .begin_guarded(&self.scope, &call.tool_call(), call.span(), self)
                    .await;
                match self.lock().on_decision(call, decision) {
                    Decided::Forward(request) => FromClient::ForwardRewritten(request),
                    Decided::Respond(response) => FromClient::Respond(response),
                }
            }
        }
    }

    /// Handles a message from the server: the answer to a claimed call is recorded before it is
    /// passed on; discovery results get `capabilities.tools.idempotency`.
    pub async fn from_server(&self, message: &str) -> FromServer {
        let action = {
            let mut interceptor = self.lock();
            interceptor.set_store_usable(self.dedup.store_usable());
            interceptor.on_server_message(message)
        };
        match action {
            ServerAction::Forward => FromServer::Forward,
            ServerAction::ForwardRewritten(message) => FromServer::ForwardRewritten(message),
            ServerAction::Absorb => FromServer::Drop,
            ServerAction::Record {
                claim,
                outcome,
                forward,
            } => {
                claim.record(outcome).await;
                if forward {
                    FromServer::Forward
                } else {
                    FromServer::Drop
                }
            }
        }
    }

    /// The connection ended (the server stopped, the transport closed): every claimed call still
    /// unanswered is recorded as outcome-unknown, and the responses to send the client for them
    /// are returned (for calls it did not cancel). Keyed calls after this are refused with
    /// `idempotency_shutting_down`.
    pub async fn close(&self) -> Vec<String> {
        self.closed.store(true, Ordering::SeqCst);
        let orphans = self.lock().on_server_gone(CLOSED);
        if !orphans.is_empty() {
            tracing::warn!(
                calls = orphans.len(),
                "the connection closed with calls in flight; recording them as outcome-unknown"
            );
        }
        let mut responses = Vec::with_capacity(orphans.len());
        for orphan in orphans {
            orphan.claim.abandon(CLOSED).await;
            responses.extend(orphan.response);
        }
        responses
    }

    /// A decision of this connection (a future of [`from_client`](Self::from_client),
    /// [`decide`](Self::decide), [`from_server`](Self::from_server) or [`close`](Self::close)), as
    /// a binding hands it back: [`now_or_later`]; and under `store-io = inline` ([`StoreIo`]) a
    /// decision still waiting on the store is run to its end here, on the caller's thread, unless
    /// it `may_wait` for another call's outcome ([`Received::may_wait`]): that one stays on the
    /// runtime, since the call it waits for may need the host's loop. Call it inside the runtime.
    pub fn answer<F>(&self, answer: F, may_wait: bool) -> Answer<F::Output>
    where
        F: Future + Send + 'static,
    {
        match now_or_later(answer) {
            Answer::Pending(answer) if self.store_io == StoreIo::Inline && !may_wait => {
                Answer::Ready(run_here(answer))
            }
            answer => answer,
        }
    }

    /// Whether a call of this connection is waiting for the server's answer.
    pub fn has_calls_in_flight(&self) -> bool {
        self.lock().has_calls_in_flight()
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, Interceptor<RunningClaim>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A closed connection refuses keyed calls, and one closed while the key was being claimed does
/// not send the call.
impl StopGate for Connection {
    fn refuses(&self) -> bool {
        self.is_closed()
    }

    fn stopped(&self) -> bool {
        self.is_closed()
    }

    fn release_reason(&self) -> &'static str {
        "the server stopped before the call was forwarded"
    }
}

/// An answer that is ready at once, or a future that still waits on the store.
pub enum Answer<T> {
    /// The answer, decided without waiting (every message but a keyed call on a store that does
    /// I/O: SQLite, Redis, PostgreSQL).
    Ready(T),
    /// Still waiting (a store round trip): poll it on the runtime that [`now_or_later`] ran in.
    Pending(Pin<Box<dyn Future<Output = T> + Send>>),
}

impl<T> std::fmt::Debug for Answer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Ready(_) => "Answer::Ready",
            Self::Pending(_) => "Answer::Pending",
        })
    }
}

/// Polls `answer` once, in the tokio runtime the caller entered: most messages are decided
/// without waiting, and a binding hands those back to its language synchronously instead of
/// through a promise, which costs a wake-up of the host's event loop. The rest is returned to be
/// awaited (polling it once more is harmless: every future here may be polled with a new waker).
pub fn now_or_later<F>(answer: F) -> Answer<F::Output>
where
    F: Future + Send + 'static,
{
    let mut answer = Box::pin(answer);
    match answer
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Answer::Ready(output),
        Poll::Pending => Answer::Pending(answer),
    }
}

/// Where a binding runs a decision that waits on the store: the `store-io` option.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StoreIo {
    /// On the library's tokio runtime, its answer handed back to the host's event loop, which
    /// never waits on the store (the default).
    #[default]
    Runtime,
    /// On the host's thread, which waits for it: no hand-off between threads and no wake-up of
    /// the host's loop, but the loop stops for each store round trip (a SQLite transaction, tens
    /// of microseconds; up to SQLite's busy timeout, 5 s, while another process holds the file's
    /// write lock). Local stores only (`sqlite:`, `memory`): a network store's answers arrive on
    /// the runtime anyway.
    Inline,
}

impl FromStr for StoreIo {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "runtime" => Ok(Self::Runtime),
            "inline" => Ok(Self::Inline),
            _ => Err("expected runtime or inline".into()),
        }
    }
}

/// Runs `future` to its end on this thread, parking it while the future waits.
fn run_here<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

/// Why a call still running at [`Connection::close`] is outcome-unknown (the interceptor adds
/// "before answering; the call may or may not have taken effect").
const CLOSED: &str = "the MCP server's connection closed";
