//! `mcp-idem-conformance-server`: the fixture server the official MCP conformance suite
//! (`@modelcontextprotocol/conformance`, server mode) talks to.
//!
//! It serves, with rmcp over stateless Streamable HTTP at `http://ADDR/mcp`, the tools, resources
//! and prompts the suite's 2026-07-28 server scenarios call by name (`test_simple_text`,
//! `test://static-text`, `test_simple_prompt`, the SEP-2322 `test_input_required_result_*`
//! family, ...). `scripts/conformance.sh` runs the suite against it once directly and once
//! through `mcp-idem proxy`, and compares the two runs scenario by scenario.
//!
//! The first line on stderr is `listening on http://ADDR/mcp`, with the real port when ADDR asks
//! for port 0. SIGINT or SIGTERM stops the server.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

mod fixture;

/// Fixture MCP server for the official conformance suite (stateless Streamable HTTP).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to listen on; port 0 picks a free port (the address is printed on stderr).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

/// Logs go to stderr, filtered by `MCP_IDEM_LOG` as `mcp-idem`'s (`warn` by default).
fn init_logging() {
    use tracing_subscriber::layer::{Layer, SubscriberExt};
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = std::env::var("MCP_IDEM_LOG")
        .ok()
        .and_then(|directives| directives.parse().ok())
        .unwrap_or_else(|| {
            tracing_subscriber::filter::Targets::new()
                .with_default(tracing_subscriber::filter::LevelFilter::WARN)
        });
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(filter),
        )
        .init();
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("mcp-idem-conformance-server: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(args.listen))
}

async fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener
        .local_addr()
        .context("cannot read the bound address")?;

    // rmcp's default Host allow-list (localhost, 127.0.0.1, ::1) is what the suite's
    // dns-rebinding-protection scenario expects; the bound address joins it.
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
        .with_allowed_hosts(hosts);
    let shutdown = config.cancellation_token.clone();
    let server = fixture::Fixture::new().context("cannot key the requestState codec")?;
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let router = axum::Router::new().route_service("/mcp", service);

    eprintln!("listening on http://{local}/mcp");
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            stop_signal().await;
            shutdown.cancel();
        })
        .await
        .context("the HTTP server failed")?;
    Ok(())
}

/// Resolves on SIGINT or, on Unix, SIGTERM.
async fn stop_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
