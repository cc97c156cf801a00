//! `mcp-idem demo-server --http ADDR`: the same payment server over Streamable HTTP.
//!
//! One endpoint, `/mcp`, served by rmcp's `StreamableHttpService`, in one of two modes:
//!
//! - Stateless (the default): legacy session mode off, `NeverSessionManager`. Every POST is
//!   answered on its own, `server/discover` and 2026-07-28 requests as well as a legacy
//!   `initialize`. Answers are plain `application/json` unless `--http-sse` asks for
//!   `text/event-stream`. GET and DELETE get 405.
//! - Stateful (`--http-stateful`): the server of the `initialize` era. Legacy session mode on,
//!   with rmcp's in-memory `LocalSessionManager`: an `initialize` POST opens a session whose id
//!   comes back in the `Mcp-Session-Id` header, and later POSTs must carry it (an unknown id gets
//!   404, a missing one 400). Answers to requests are `text/event-stream`; a GET with the session id
//!   opens the session's standalone SSE stream, and a DELETE ends the session. Server-to-client
//!   requests (the `elicitation/create` of `confirm_charge`) go out on the stream of the POST that
//!   caused them. Sessions live in memory only: after a restart every old id gets 404. Each new
//!   session prints `session opened: ID` on stderr (and `session closed: ID` when it ends), and
//!   each GET stream `stream opened: ID`, so tests can count sessions and streams. A 2026-07-28 request (per-request `_meta` protocol version, or
//!   `server/discover`) is still served statelessly, as that revision has no sessions.
//!
//! rmcp checks the `Host` header against an allow-list (a defence against DNS rebinding):
//! `localhost`, `127.0.0.1` and `::1` with any port, plus the address the server is bound to.
//!
//! Each request (stateless) or session (stateful) gets its own clone of the handler; all clones
//! share one [`Ledger`], whose appends are single `write(2)` calls on an `O_APPEND` descriptor,
//! so concurrent charges never interleave. rmcp runs each handler in its own task: a client that
//! disconnects does not stop a charge already under way, only its answer is lost.
//!
//! The first line on stderr is `listening on http://ADDR/mcp`, with the real port when ADDR asks
//! for port 0. SIGINT or SIGTERM stops the server.
//!
//! [`Ledger`]: crate::ledger::Ledger

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use futures_util::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServerHandler;

/// How `demo-server --http` serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HttpMode {
    /// No sessions; answers are SSE streams if `sse`, else plain JSON.
    Stateless {
        /// Answer with `text/event-stream` instead of `application/json`.
        sse: bool,
    },
    /// Legacy sessions (`Mcp-Session-Id`), SSE answers, a GET stream per session.
    Stateful,
}

/// Serves `server` at `http://addr/mcp` in `mode` until SIGINT or SIGTERM.
pub(crate) async fn serve<S>(server: S, addr: SocketAddr, mode: HttpMode) -> anyhow::Result<()>
where
    S: ServerHandler + Clone + Send + Sync + 'static,
{
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener
        .local_addr()
        .context("cannot read the bound address")?;

    let mut hosts = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    if !local.ip().is_unspecified() {
        hosts.push(local.ip().to_string());
    }
    let config = StreamableHttpServerConfig::default().with_allowed_hosts(hosts);
    let shutdown = config.cancellation_token.clone();
    let factory = move || Ok(server.clone());
    let router = match mode {
        HttpMode::Stateless { sse } => {
            let config = config
                .with_legacy_session_mode(false)
                .with_json_response(!sse);
            let service = StreamableHttpService::new(
                factory,
                Arc::new(NeverSessionManager::default()),
                config,
            );
            axum::Router::new().route_service("/mcp", service)
        }
        HttpMode::Stateful => {
            let config = config.with_legacy_session_mode(true);
            let service =
                StreamableHttpService::new(factory, Arc::new(LoggedSessions::default()), config);
            axum::Router::new().route_service("/mcp", service)
        }
    };

    eprintln!("listening on http://{local}/mcp");
    tracing::info!(%local, ?mode, "demo server listening on HTTP");
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            super::stop_signal().await;
            // Ends open SSE streams, so the graceful shutdown does not wait for them.
            shutdown.cancel();
        })
        .await
        .context("the HTTP server failed")?;
    tracing::info!("demo server stopped");
    Ok(())
}

/// rmcp's [`LocalSessionManager`], printing `session opened: ID`, `session closed: ID` and, for
/// each GET stream, `stream opened: ID` on stderr.
#[derive(Debug, Default)]
struct LoggedSessions {
    inner: LocalSessionManager,
}

impl SessionManager for LoggedSessions {
    type Error = <LocalSessionManager as SessionManager>::Error;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, transport) = self.inner.create_session().await?;
        eprintln!("session opened: {id}");
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let known = self.inner.has_session(id).await?;
        self.inner.close_session(id).await?;
        if known {
            eprintln!("session closed: {id}");
        }
        Ok(())
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let stream = self.inner.create_standalone_stream(id).await?;
        eprintln!("stream opened: {id}");
        Ok(stream)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }
}
