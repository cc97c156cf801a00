//! `mcp-idem`: SEP-3182 request idempotency for any MCP server.

use std::process::ExitCode;

use clap::FromArgMatches;

mod allowed_hosts;
mod cli;
mod commands;
mod config_file;
mod http_answer;
mod ledger;
mod line_client;
mod ops;
mod progress;
mod shown;
mod upstream;

fn main() -> ExitCode {
    let invocation = match config_file::parse(cli::command(), std::env::args_os().collect()) {
        Ok(invocation) => invocation,
        Err(err) => {
            eprintln!("mcp-idem: error: {err:#}");
            return ExitCode::from(2);
        }
    };
    let cli = cli::Cli::from_arg_matches(&invocation.matches).unwrap_or_else(|err| err.exit());
    init_logging();
    match cli.command.exec(&invocation) {
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
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
