//! `mcp-idem tools`: lists a server's tools (every `tools/list` page) and suggests a per-tool
//! idempotency policy for calls that carry no SEP-3182 key, as a TOML config to start from.
//!
//! The connection is `call`'s ([`ServerArgs`], the library's [`mcp_idempotency::client`]);
//! [`classify`] decides, [`render`] writes; this module only does the I/O between them.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use mcp_idempotency::client::Connect;
use serde_json::Value;

use super::server_args::ServerArgs;

mod render;

/// The classifier the gateways apply with `--tools suggested`: one, in the library.
use mcp_idempotency::policy::suggest as classify;

/// Options of `mcp-idem tools`.
#[derive(Debug, Args)]
#[command(after_help = "\
Output: the tools as TOML comments (annotations readOnlyHint, idempotentHint, destructiveHint, \
openWorldHint; the arguments that look like identifiers, and why), then a starting policy: one \
[tools.NAME] table per tool that may change things. Save stdout as the config file, then check \
each table. The rules, in order:
  readOnlyHint or idempotentHint true   left out (listed in a comment; so is a tool named *)
  an argument idempotency_key           key-argument = \"idempotency_key\"
  required identifier-like arguments    key-from = [\"/order_id\", ...], required = true
  otherwise                             window = \"30s\" (two identical calls within it run once)
Identifier-like: a string or integer argument named id, *_id, *Id, *ID, request_id, reference, \
*_reference, *_number, *Number, *_uuid, … An optional one is listed as weaker and not used. \
`wrap --tools suggested` and `proxy --tools suggested` apply this policy as printed, by the same \
classifier, to the tools the server lists (see docs/key-sources.md for the risk).

With --json, stdout holds one object: {\"server\", \"tools\": [{\"name\", \"annotations\", \
\"identifiers\": [{\"argument\", \"pointer\", \"type\", \"required\", \"pattern\", \"reason\"}], \
\"policy\" (the table, or null), \"leftOut\" ({\"reason\", \"why\"} or null)}], \"policy\": \
{\"tools\": {NAME: TABLE}}}.

Exit status: 0 listed, 2 the server could not be reached or listed (or a usage error).")]
pub(crate) struct ToolsArgs {
    #[command(flatten)]
    server: ServerArgs,

    /// How long starting the server (stdio) or connecting (HTTP) and the handshake may take: a
    /// stdio server gets all of it to start (a first `npx -y` downloads its package).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    connect_timeout: Duration,

    /// How long listing the tools (all pages) may take.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,

    /// Print one JSON object instead of TOML (see below).
    #[arg(long)]
    json: bool,
}

impl ToolsArgs {
    pub(crate) fn exec(self) -> anyhow::Result<ExitCode> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let tools = runtime.block_on(self.list());
        runtime.shutdown_timeout(Duration::from_secs(1));
        let server = self.server.describe();
        let reports = classify::classify(&tools?);
        let output = if self.json {
            format!("{:#}\n", render::json(&server, &reports))
        } else {
            render::text(&server, &reports)
        };
        let mut out = std::io::stdout().lock();
        match out.write_all(output.as_bytes()).and_then(|()| out.flush()) {
            Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
                Err(err).context("cannot write the output")
            }
            _ => Ok(ExitCode::SUCCESS),
        }
    }

    /// Connects, lists every tool (following `nextCursor`), closes; each tool as its JSON.
    /// The errors say what failed in one line (the library's errors name their causes).
    async fn list(&self) -> anyhow::Result<Vec<Value>> {
        let server = self.server.describe();
        let connector = self.server.connector();
        let session = match tokio::time::timeout(self.connect_timeout, connector.connect()).await {
            Ok(Ok(session)) => session,
            Ok(Err(err)) => bail!("cannot connect to {server}: {err}"),
            Err(_) => bail!(
                "cannot connect to {server}: no session within {} (--connect-timeout)",
                humantime::format_duration(self.connect_timeout)
            ),
        };
        let listed = tokio::time::timeout(self.timeout, session.peer().list_all_tools()).await;
        session.close().await;
        let tools = match listed {
            Ok(Ok(tools)) => tools,
            Ok(Err(err)) => bail!("{server} did not list its tools: {err}"),
            Err(_) => bail!("{server} did not list its tools within {:?}", self.timeout),
        };
        tools
            .iter()
            .map(|tool| serde_json::to_value(tool).context("cannot read a listed tool"))
            .collect()
    }
}
