//! `mcp-idem`: SEP-3182 request idempotency for any MCP server.

use std::process::ExitCode;

use clap::Parser;

mod allowed_hosts;
mod cli;
mod commands;
mod ledger;
mod line_client;
mod upstream;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    init_logging();
    match cli.command.exec() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("mcp-idem: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// Logs go to stderr: on stdio transports stdout carries the protocol.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MCP_IDEM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
