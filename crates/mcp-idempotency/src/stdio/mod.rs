//! The stdio adapter: runs the [`Interceptor`] between two newline-delimited JSON-RPC streams.
//!
//! [`StdioProxy::run`] sits between a client's streams and a server's: the gateway (`mcp-idem wrap`)
//! uses it with a child process, and [`idempotent_stdio`] uses it in-process, so a Rust server built
//! with rmcp gets SEP-3182 in one line:
//!
//! ```no_run
//! use rmcp::{ServerHandler, ServiceExt};
//!
//! #[derive(Clone)]
//! struct MyServer;
//! impl ServerHandler for MyServer {}
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Instead of `MyServer.serve(rmcp::transport::stdio())`:
//!     let server = MyServer
//!         .serve(mcp_idempotency::stdio::idempotent_stdio("sqlite:records.sqlite3").await?)
//!         .await?;
//!     server.waiting().await?;
//!     Ok(())
//! }
//! ```
//!
//! Lines are forwarded byte for byte unless the interceptor rewrites or answers them. Messages in
//! each direction keep their order. Logs go to `tracing`, never to stdout.
//!
//! No line is held in memory whole past a limit. A client line longer than
//! [`StdioProxy::max_line_bytes`] is discarded up to its newline and answered with a JSON-RPC
//! error (`-32600`, with the request's `id` when it precedes the long part of the message). A
//! server line longer than [`MAX_SERVER_MESSAGE_BYTES`] is passed to the client as it comes,
//! unread: the client asked for that response, so dropping it would only make the client wait; a
//! keyed call it answered is not recorded and stays in flight until the server exits.
//!
//! # Stopping
//!
//! A run stops gracefully when the client closes its input, or when the future given to
//! [`StdioProxy::run_until`] completes (`mcp-idem wrap` passes SIGTERM and SIGINT): keyed calls
//! that arrive from then on are refused with `idempotency_shutting_down` (nothing runs, nothing
//! is claimed), while everything else is still forwarded both ways, so that calls in flight can
//! finish. Once no request forwarded to the server is unanswered, or when
//! [`StdioProxy::shutdown_grace`] has passed, the claimed calls still running are recorded as
//! outcome-unknown and answered `idempotency_outcome_unknown`, the client's input is no longer
//! read, and the server's input is closed; the server's output is still relayed until it ends.

mod from_client;
mod listing;
mod naming;
mod stopping;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::io::{
    AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf,
};

use crate::default_scope::{embedded_legacy_namespace, local_user, LegacyNamespaceReads};
use crate::interceptor::{Interceptor, InterceptorConfig, ServerAction};
use crate::jsonrpc::{DEFAULT_MAX_CLIENT_MESSAGE_BYTES, MAX_SERVER_MESSAGE_BYTES};
use crate::lines::{next_piece, read_line, Line};
use crate::record::Scope;
use crate::store::{self, StoreError, StoreUrl};
use crate::{Deduplicator, EngineConfig, RunningClaim, Timestamp};
use stopping::Stopping;

/// Default of [`StdioProxy::shutdown_grace`]: 3 s. The Python SDK's stdio client closes a server's
/// input, waits 2 s, sends SIGTERM, waits 2 s more and sends SIGKILL; a grace counted from the
/// first of these ends, and the calls are recorded, before the SIGKILL.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Why a call still running when the grace ended is answered outcome-unknown (the interceptor
/// adds "before answering; the call may or may not have taken effect").
const GRACE_ENDED: &str =
    "the gateway shut down with the call still running: the MCP server was stopped";

/// Buffer between the in-process server and the proxy, per direction.
const DUPLEX_BUFFER: usize = 256 * 1024;

/// The client's output, shared by every part of a run: whoever holds it writes a message whole,
/// and an over-long server line holds it until its last piece is written.
type ToClient = tokio::sync::Mutex<ClientOutput>;

/// The stream to the client. Each part of a run writes to it itself: a queue and a writer task in
/// between cost a task wake-up per message, and the pipe to the client is a queue already.
struct ClientOutput {
    /// `None` once a write failed: the client is gone, and what is sent to it is dropped.
    out: Option<Pin<Box<dyn AsyncWrite + Send>>>,
}

impl ClientOutput {
    fn new(out: impl AsyncWrite + Send + 'static) -> Self {
        Self {
            out: Some(Box::pin(out)),
        }
    }

    /// Writes `bytes` and flushes them; after a failed write, drops them.
    async fn write(&mut self, bytes: &[u8]) {
        let Some(out) = self.out.as_mut() else {
            tracing::debug!("client output is closed; dropping a message");
            return;
        };
        let written = match out.write_all(bytes).await {
            Ok(()) => out.flush().await,
            Err(err) => Err(err),
        };
        if let Err(err) = written {
            tracing::debug!(error = %err, "client output closed; dropping what is sent to it");
            self.out = None;
        }
    }
}

/// What the tasks of one run share.
struct Run {
    proxy: StdioProxy,
    state: Mutex<Interceptor<RunningClaim>>,
    to_client: ToClient,
    stopping: Stopping,
}

/// Aborts the tasks when dropped (those that ended already are left as they are).
struct AbortOnDrop(Vec<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// A task's output; `None` if it was cancelled (the runtime is shutting down). A panic in the task
/// goes on in the caller, as it would have with the task's future awaited in place.
fn joined<T>(result: Result<T, tokio::task::JoinError>) -> Option<T> {
    match result {
        Ok(output) => Some(output),
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        Err(_) => None,
    }
}

/// Drives an [`Interceptor`] over stdio-style streams.
#[derive(Clone, Debug)]
pub struct StdioProxy {
    dedup: Deduplicator,
    scope: Scope,
    namespace_from_server: bool,
    /// The scope under the server's own name, once it gave it.
    named: OnceLock<Scope>,
    config: InterceptorConfig,
    max_line_bytes: usize,
    shutdown_grace: Duration,
}

/// How a proxy run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyExit {
    /// Claimed calls that were in flight when the server went away (recorded as outcome-unknown).
    pub orphaned_calls: usize,
    /// Claimed calls still running when the shutdown grace ended (recorded as outcome-unknown).
    pub calls_cut_off: usize,
}

impl StdioProxy {
    /// A proxy deciding with `dedup`, recording under `scope`.
    pub fn new(dedup: Deduplicator, scope: Scope) -> Self {
        Self {
            dedup,
            scope,
            namespace_from_server: false,
            named: OnceLock::new(),
            config: InterceptorConfig::default(),
            max_line_bytes: DEFAULT_MAX_CLIENT_MESSAGE_BYTES,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }

    /// How long a stopping run waits for the requests in flight (default
    /// [`DEFAULT_SHUTDOWN_GRACE`]), counted from the client's EOF or the `stop` of
    /// [`run_until`](Self::run_until), whichever comes first; see [Stopping](self#stopping).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Longest client line (without its line ending) read (default
    /// [`DEFAULT_MAX_CLIENT_MESSAGE_BYTES`]); a longer one is discarded without being held whole
    /// and answered with a JSON-RPC error.
    pub fn max_line_bytes(mut self, max: usize) -> Self {
        self.max_line_bytes = max;
        self
    }

    /// Record under the server's own name: calls are decided under the namespace
    /// [`server_namespace`](crate::default_scope::server_namespace)`(name)` with the principal
    /// of the scope given to [`new`](Self::new) (default: no, the scope given to `new`
    /// throughout). The name comes from the server's `initialize` or `server/discover` result; a
    /// call that comes before any waits for one on its way, or for the proxy's own
    /// `server/discover`, up to
    /// [`SERVER_NAME_TIMEOUT`](crate::default_scope::SERVER_NAME_TIMEOUT). A server that does not name itself
    /// there gets such calls refused with `idempotency_scope_unknown`, never decided under
    /// another namespace. See [`default_scope`](crate::default_scope).
    pub fn namespace_from_server(mut self, learn: bool) -> Self {
        self.namespace_from_server = learn;
        self
    }

    /// Interceptor settings (key forwarding, cancellation policy).
    pub fn interceptor_config(mut self, config: InterceptorConfig) -> Self {
        self.config = config;
        self
    }

    /// Proxies until the server closes its output. When the client closes its input, the run
    /// stops gracefully (see [Stopping](self#stopping)) and then closes the server's input, so a
    /// well-behaved server exits and the run ends. When the server's output ends first, the
    /// client's input is no longer read (it may stay open), and claimed calls still unanswered are
    /// recorded as outcome-unknown and answered with `idempotency_outcome_unknown`.
    pub async fn run<CR, CW, SW, SR>(
        self,
        client_in: CR,
        client_out: CW,
        server_in: SW,
        server_out: SR,
    ) -> io::Result<ProxyExit>
    where
        CR: AsyncRead + Unpin + Send + 'static,
        CW: AsyncWrite + Unpin + Send + 'static,
        SW: AsyncWrite + Unpin + Send + 'static,
        SR: AsyncRead + Unpin + Send + 'static,
    {
        self.run_until(
            client_in,
            client_out,
            server_in,
            server_out,
            std::future::pending(),
        )
        .await
    }

    /// [`run`](Self::run), also stopping gracefully when `stop` completes (a signal), as on the
    /// client's EOF: keyed calls are refused from then on, the requests in flight get
    /// [`shutdown_grace`](Self::shutdown_grace) to be answered, then the server's input is closed.
    pub async fn run_until<CR, CW, SW, SR, S>(
        self,
        client_in: CR,
        client_out: CW,
        server_in: SW,
        server_out: SR,
        stop: S,
    ) -> io::Result<ProxyExit>
    where
        CR: AsyncRead + Unpin + Send + 'static,
        CW: AsyncWrite + Unpin + Send + 'static,
        SW: AsyncWrite + Unpin + Send + 'static,
        SR: AsyncRead + Unpin + Send + 'static,
        S: Future<Output = ()> + Send + 'static,
    {
        let run = Arc::new(Run {
            state: Mutex::new(Interceptor::new(self.config.clone())),
            to_client: ToClient::new(ClientOutput::new(client_out)),
            stopping: Stopping::default(),
            proxy: self,
        });
        // Each part is a task of its own, so that a wake-up (a line from either side, the drain's
        // timer) polls the part it is for, not every part of the run.
        let client_pump = tokio::spawn({
            let run = Arc::clone(&run);
            async move {
                let result = run
                    .proxy
                    .client_to_server(
                        &run.state,
                        client_in,
                        server_in,
                        &run.to_client,
                        &run.stopping,
                    )
                    .await;
                if let Err(err) = result {
                    tracing::debug!(error = %err, "client stream ended with an error");
                }
            }
        });
        let server_pump = tokio::spawn({
            let run = Arc::clone(&run);
            async move {
                run.proxy
                    .server_to_client(&run.state, server_out, &run.to_client, &run.stopping)
                    .await
            }
        });
        let drain = tokio::spawn({
            let run = Arc::clone(&run);
            async move {
                run.proxy
                    .drain(stop, &run.state, &run.to_client, &run.stopping)
                    .await
            }
        });
        // A run whose future is dropped stops its tasks with it, as it did when they were its parts.
        let _tasks = AbortOnDrop(vec![
            client_pump.abort_handle(),
            server_pump.abort_handle(),
            drain.abort_handle(),
        ]);
        // The server pump decides when the run is over; the client pump ending (EOF) only starts
        // the drain, which ends with the server's input closed. Once the server's output has
        // ended, the client pump stops before its next read (never in the middle of a message),
        // even if the client keeps its end open.
        let ended = joined(server_pump.await)
            .unwrap_or_else(|| Err(io::Error::other("the server pump was cancelled")));
        run.stopping.server_gone();
        joined(client_pump.await);
        // A drain still waiting stops (nothing it waits for can happen now); one cutting calls off
        // finishes, so that each of them is recorded and answered, and no write to the client is
        // cut in the middle of a line.
        let calls_cut_off = joined(drain.await).unwrap_or(0);
        // Only now is no call on its way to the server: whatever is still in flight (also a call
        // the client pump claimed but could not deliver) will never be answered.
        let orphaned_calls = run
            .proxy
            .orphan_calls_in_flight(&run.state, &run.to_client)
            .await;
        ended.map(|()| ProxyExit {
            orphaned_calls,
            calls_cut_off,
        })
    }

    async fn server_to_client<SR>(
        &self,
        state: &Mutex<Interceptor<RunningClaim>>,
        server_out: SR,
        to_client: &ToClient,
        stopping: &Stopping,
    ) -> io::Result<()>
    where
        SR: AsyncRead + Unpin,
    {
        let mut lines = BufReader::new(server_out);
        let mut line = Vec::new();
        loop {
            // A response ends what the drain may wait for.
            stopping.progress.notify_one();
            match read_line(&mut lines, &mut line, MAX_SERVER_MESSAGE_BYTES).await? {
                Line::Eof => return Ok(()),
                Line::Whole => {}
                Line::TooLong => {
                    pass_long_line(&mut lines, &mut line, to_client).await?;
                    continue;
                }
            }
            let action = match message_text(&line) {
                Some(text) => {
                    let mut interceptor = lock(state);
                    interceptor.set_store_usable(self.dedup.store_usable());
                    interceptor.on_server_message(text)
                }
                None => ServerAction::Forward,
            };
            // A call may be waiting for the server's name.
            stopping.server_answered.notify_waiters();
            match action {
                ServerAction::Forward => send(to_client, &mut line).await,
                ServerAction::Absorb => {}
                ServerAction::ForwardRewritten(message) => {
                    send(to_client, &mut message.into_bytes()).await
                }
                ServerAction::Record {
                    claim,
                    outcome,
                    forward,
                } => {
                    claim.record(outcome).await;
                    if forward {
                        send(to_client, &mut line).await;
                    }
                }
            }
        }
    }

    /// Records every call still in flight as outcome-unknown and answers the client; returns how
    /// many there were.
    async fn orphan_calls_in_flight(
        &self,
        state: &Mutex<Interceptor<RunningClaim>>,
        to_client: &ToClient,
    ) -> usize {
        let orphans = lock(state).on_server_gone("the MCP server exited");
        let orphaned_calls = orphans.len();
        for orphan in orphans {
            orphan
                .claim
                .abandon("the MCP server exited while the call ran")
                .await;
            if let Some(response) = orphan.response {
                send(to_client, &mut response.into_bytes()).await;
            }
        }
        if orphaned_calls > 0 {
            tracing::warn!(orphaned_calls, "the MCP server exited with calls in flight");
        }
        orphaned_calls
    }

    /// Spawns the proxy between `client_in`/`client_out` and an in-process server, and returns the
    /// server's ends: what it reads requests from and writes responses to.
    pub fn spawn_in_process<R, W>(
        self,
        client_in: R,
        client_out: W,
    ) -> (ReadHalf<DuplexStream>, WriteHalf<DuplexStream>)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (proxy_side, server_side) = tokio::io::duplex(DUPLEX_BUFFER);
        let (server_out, server_in) = tokio::io::split(proxy_side);
        tokio::spawn(async move {
            if let Err(err) = self.run(client_in, client_out, server_in, server_out).await {
                tracing::warn!(error = %err, "stdio proxy stopped");
            }
        });
        tokio::io::split(server_side)
    }
}

/// This process's stdin and stdout with SEP-3182 in front, for an rmcp server to serve on: records
/// in the store at `store_url` (`sqlite:PATH`, `memory`) under the namespace
/// [`server_namespace`](crate::default_scope::server_namespace)`(the server's name)` (records
/// kept before that rule, under
/// [`embedded_legacy_namespace`](crate::default_scope::embedded_legacy_namespace), are still
/// found), default settings, scoped to the local user. Use [`StdioProxy::spawn_in_process`] for other settings.
pub async fn idempotent_stdio(
    store_url: &str,
) -> Result<(ReadHalf<DuplexStream>, WriteHalf<DuplexStream>), StoreError> {
    let store = store::open(&store_url.parse::<StoreUrl>()?).await?;
    let scope = Scope::new(embedded_legacy_namespace(), local_user());
    let store = LegacyNamespaceReads::open(
        store,
        scope.namespace(),
        Some(scope.principal()),
        Timestamp::now(),
    )
    .await;
    let dedup = Deduplicator::new(EngineConfig::default(), Arc::new(store));
    let proxy = StdioProxy::new(dedup, scope).namespace_from_server(true);
    Ok(proxy.spawn_in_process(tokio::io::stdin(), tokio::io::stdout()))
}

fn lock(
    state: &Mutex<Interceptor<RunningClaim>>,
) -> std::sync::MutexGuard<'_, Interceptor<RunningClaim>> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The message in a line, without its line ending; `None` for blank or non-UTF-8 lines.
fn message_text(line: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(line)
        .ok()?
        .trim_end_matches(['\n', '\r']);
    (!text.trim().is_empty()).then_some(text)
}

/// Writes one message as one line, in a single write so the reader gets it whole. The message is
/// borrowed (its `\n` added in place when missing) so that a line buffer is read into again
/// rather than given away and grown anew for every line.
async fn write_line<W: AsyncWrite + Unpin>(out: &mut W, line: &mut Vec<u8>) -> io::Result<()> {
    if !line.ends_with(b"\n") {
        line.push(b'\n');
    }
    out.write_all(line).await?;
    out.flush().await
}

/// Sends one message to the client as one line (as [`write_line`] does).
async fn send(to_client: &ToClient, message: &mut Vec<u8>) {
    if !message.ends_with(b"\n") {
        message.push(b'\n');
    }
    to_client.lock().await.write(message).await;
}

/// Sends a server line longer than [`MAX_SERVER_MESSAGE_BYTES`] to the client piece by piece,
/// `line` (its start) first; no other message goes out in between.
async fn pass_long_line<R: tokio::io::AsyncBufRead + Unpin>(
    server_out: &mut R,
    line: &mut Vec<u8>,
    to_client: &ToClient,
) -> io::Result<()> {
    tracing::warn!(
        limit = MAX_SERVER_MESSAGE_BYTES,
        "passing a server message longer than the line limit to the client unread; a call it answered is not recorded"
    );
    let mut to_client = to_client.lock().await;
    // `line` holds the start, then each next piece in turn.
    loop {
        to_client.write(line).await;
        if next_piece(server_out, line).await? {
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            to_client.write(line).await;
            return Ok(());
        }
    }
}
