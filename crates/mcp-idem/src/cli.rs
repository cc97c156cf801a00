use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::commands::demo::DemoArgs;
use crate::commands::demo_server::DemoServerArgs;
use crate::commands::wrap::WrapArgs;

/// SEP-3182 request idempotency for MCP servers: replay lost `tools/call` outcomes instead of
/// running side effects twice.
#[derive(Debug, Parser)]
#[command(name = "mcp-idem", version, about, long_about = None)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Walk through the SEP-3182 decisions on the embedded SQLite store and check each one.
    Demo(DemoArgs),
    /// Run a small payment MCP server on stdio (rmcp, no idempotency): the upstream for demos,
    /// tests and benchmarks. Each executed charge_payment appends one line to the ledger.
    DemoServer(DemoServerArgs),
    /// Run a stdio MCP server behind SEP-3182: `mcp-idem wrap [OPTIONS] -- <command> [args...]`.
    Wrap(WrapArgs),
}

impl Command {
    pub(crate) fn exec(self) -> anyhow::Result<ExitCode> {
        match self {
            Self::Demo(args) => args.exec(),
            Self::Wrap(args) => args.exec(),
            Self::DemoServer(args) => args.exec(),
        }
    }
}
