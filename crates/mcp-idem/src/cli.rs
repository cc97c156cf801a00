use std::process::ExitCode;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{CommandFactory, Parser, Subcommand};
use mcp_idempotency::embedded::log_format::LOG_FORMAT_ENV;
use mcp_idempotency::embedded::LogFormat;

use crate::commands::bridge::BridgeArgs;
use crate::commands::call::CallArgs;
use crate::commands::check::CheckArgs;
use crate::commands::config_check::ConfigCheckArgs;
use crate::commands::demo::DemoArgs;
use crate::commands::demo_server::DemoServerArgs;
use crate::commands::inspect::InspectArgs;
use crate::commands::proxy::ProxyArgs;
use crate::commands::tools::ToolsArgs;
use crate::commands::wrap::{ExecServerArgs, WrapArgs};
use crate::config_file::Invocation;

/// SEP-3182 request idempotency for MCP servers: replay lost `tools/call` outcomes instead of
/// running side effects twice.
#[derive(Debug, Parser)]
#[command(name = "mcp-idem", version, about, long_about = None)]
pub(crate) struct Cli {
    /// Format of the logs on stderr: `text`, or `json` (one JSON object per line, with
    /// `trace_id` and `span_id` inside a traced call).
    #[arg(long, global = true, env = LOG_FORMAT_ENV, value_name = "FORMAT", default_value = "text",
          value_parser = log_format())]
    pub(crate) log_format: LogFormat,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Walk through the SEP-3182 decisions on the embedded SQLite store and check each one.
    Demo(DemoArgs),
    /// Run a small payment MCP server on stdio (or Streamable HTTP with --http, stateless unless
    /// --http-stateful): the upstream for demos, tests and benchmarks.
    ///
    /// Built on rmcp (protocol 2026-07-28 and the legacy `initialize`), it knows nothing about
    /// idempotency: every executed charge_payment appends one line to the ledger. Tools:
    /// charge_payment {amount, currency, delay_ms?, fail_after_charge?}, get_balance, noop,
    /// work_1ms; with --http-stateful also confirm_charge {amount, currency}, which asks the
    /// client (elicitation/create) before charging. Logs go to stderr; on stdio, stdin EOF exits
    /// with status 0; over HTTP, SIGINT or SIGTERM stops the server.
    DemoServer(DemoServerArgs),
    /// Run a stdio MCP server behind SEP-3182: `mcp-idem wrap [OPTIONS] -- <command> [args...]`.
    Wrap(WrapArgs),
    /// Put SEP-3182 in front of a Streamable HTTP MCP server: a reverse proxy, `mcp-idem proxy
    /// --listen ADDR --upstream URL`. Instances sharing a Redis or PostgreSQL store may serve the
    /// same server side by side.
    Proxy(ProxyArgs),
    /// Give a stdio MCP client safe retries to a remote Streamable HTTP server: `mcp-idem bridge
    /// [OPTIONS] URL`, launched by the client as its server. Every tools/call gets an
    /// idempotency key, and a call whose answer was lost is re-issued with the same key.
    Bridge(BridgeArgs),
    /// Call a tool with an idempotency key, retrying safely: `mcp-idem call --tool NAME --args
    /// JSON (--url URL | -- <command> [args...])`. Exit status: 0 success, 1 tool error, 2 no
    /// outcome (conflict, outcome unknown, connection failure, usage error).
    Call(CallArgs),
    /// Test any MCP server (a stdio command after `--`, or --url) against SEP-3182 and report
    /// each check: `mcp-idem check --tool NAME --args JSON [--slow-args JSON] [--error-args JSON]
    /// -- <command>`. Exit status 1 if a MUST check fails, 2 if the server cannot be checked.
    Check(CheckArgs),
    /// List a server's tools, their annotations and identifier-like arguments, and print a
    /// starting TOML policy for calls without an idempotency key: `mcp-idem tools [--json]
    /// (--url URL | -- <command> [args...])`. Exit status 2 if the server cannot be listed.
    Tools(ToolsArgs),
    /// Look into a record store: list records (by scope, key, state, age), show one with its
    /// stored outcome, count them, purge expired ones, or delete one so that its key runs again:
    /// `mcp-idem inspect --store URL [list|show KEY|stats|purge|delete KEY] [--json]` (without a
    /// subcommand, it lists).
    Inspect(InspectArgs),
    /// Print the configuration `wrap` or `proxy` would run with, and where each value came from
    /// (command line, environment, config file, default): `mcp-idem config-check proxy --config
    /// FILE [OPTIONS]`. Passwords in URLs are redacted. Exit status 2 if it is invalid.
    ConfigCheck(ConfigCheckArgs),
    /// How `wrap` starts its server on Linux (not for direct use): sets the parent-death signal,
    /// then executes the server.
    #[command(hide = true)]
    ExecServer(ExecServerArgs),
}

/// `--log-format`: `text` or `json`, listed in the help.
fn log_format() -> impl TypedValueParser<Value = LogFormat> {
    PossibleValuesParser::new(["text", "json"]).map(|name| name.parse().unwrap_or_default())
}

/// The command-line interface; `config-check wrap` needs no server command.
pub(crate) fn command() -> clap::Command {
    Cli::command().mut_subcommand("config-check", |check| {
        check.mut_subcommand("wrap", |wrap| {
            wrap.mut_arg("command", |arg| arg.required(false))
        })
    })
}

impl Command {
    pub(crate) fn exec(self, invocation: &Invocation) -> anyhow::Result<ExitCode> {
        match self {
            Self::Demo(args) => args.exec(),
            Self::Wrap(args) => args.exec(),
            Self::DemoServer(args) => args.exec(),
            Self::Proxy(args) => args.exec(),
            Self::Bridge(args) => args.exec(),
            Self::Call(args) => args.exec(),
            Self::Check(args) => args.exec(),
            Self::Tools(args) => args.exec(),
            Self::Inspect(args) => args.exec(),
            Self::ConfigCheck(args) => args.exec(invocation),
            Self::ExecServer(args) => args.exec(),
        }
    }
}
