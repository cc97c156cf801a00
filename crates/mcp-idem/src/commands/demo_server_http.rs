//! `mcp-idem demo-server --http ADDR`: the same payment server over Streamable HTTP.
//!
//! One POST endpoint, `/mcp`, served by rmcp's `StreamableHttpService` in stateless mode (no
//! sessions: legacy session mode off, `NeverSessionManager`): every POST is answered on its own,
//! `server/discover` and 2026-07-28 requests as well as a legacy `initialize`. Answers are plain
//! `application/json` unless `--http-sse` asks for `text/event-stream`. GET and DELETE get 405.
//!
//! rmcp checks the `Host` header against an allow-list (a defence against DNS rebinding):
//! `localhost`, `127.0.0.1` and `::1` with any port, plus the address the server is bound to.
//!
//! Each request gets its own clone of the handler; all clones share one [`Ledger`], whose
//! appends are single `write(2)` calls on an `O_APPEND` descriptor, so concurrent charges never
//! interleave. rmcp runs each handler in its own task: a client that disconnects does not stop a
//! charge already under way, only its answer is lost.
//!
//! The first line on stderr is `listening on http://ADDR/mcp`, with the real port when ADDR asks
//! for port 0. SIGINT or SIGTERM stops the server.
//!
//! [`Ledger`]: crate::ledger::Ledger

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServerHandler;

/// Serves `server` at `http://addr/mcp` until SIGINT or SIGTERM; answers are SSE streams if
/// `sse`, else plain JSON.
pub(crate) async fn serve<S>(server: S, addr: SocketAddr, sse: bool) -> anyhow::Result<()>
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
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(!sse)
        .with_allowed_hosts(hosts);
    let shutdown = config.cancellation_token.clone();
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let router = axum::Router::new().route_service("/mcp", service);

    eprintln!("listening on http://{local}/mcp");
    tracing::info!(%local, "demo server listening on HTTP");
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
