use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::commands::demo::DemoArgs;

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
}

impl Command {
    pub(crate) fn exec(self) -> anyhow::Result<ExitCode> {
        match self {
            Self::Demo(args) => args.exec(),
        }
    }
}
