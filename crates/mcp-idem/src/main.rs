//! `mcp-idem`: SEP-3182 request idempotency for any MCP server.

use std::process::ExitCode;

use clap::FromArgMatches;

mod allowed_hosts;
mod cli;
mod commands;
mod config_file;
mod http_answer;
mod http_line_client;
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
    init_logging(cli.log_format);
    match cli.command.exec(&invocation) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("mcp-idem: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// Logs go to stderr: on stdio transports stdout carries the protocol. `MCP_IDEM_LOG` filters
/// them: a level (`debug`) or comma-separated `TARGET=LEVEL` directives
/// (`warn,mcp_idempotency::interceptor=debug`); unset or unreadable, `warn`. The bindings log
/// the same way (`embedded::log_to_stderr`). `--log-format` (`MCP_IDEM_LOG_FORMAT`) picks text
/// or one JSON object per line (`embedded::log_format`).
fn init_logging(format: mcp_idempotency::embedded::LogFormat) {
    mcp_idempotency::embedded::log_to_stderr_as(format);
}
