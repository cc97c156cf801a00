//! `mcp-idem check`: tests any MCP server, stdio or Streamable HTTP, against SEP-3182.
//!
//! It speaks raw JSON-RPC so that it sees the exact responses, opens the session in the era the
//! server speaks (`server/discover`, else the legacy `initialize`), then runs each check with
//! fresh random keys against a witness tool whose result changes on every real execution. Each
//! check passes, fails (with the request and the offending response as evidence) or is skipped
//! with the reason; a skipped check never counts as passed. Exit status: 0 when no MUST check
//! failed (with `--strict`, no check at all), 1 otherwise, 2 when the server could not be
//! checked.
//!
//! Layout: [`connect`] (eras and capability checks), [`session`] (raw requests over a stdio
//! [`LineClient`](crate::line_client::LineClient) or the raw client in [`http`]), [`checks`]
//! (the runner; the checks in `replay`, `rejections`, `meta` (the `_meta` carrier),
//! `concurrency`), [`respell`] (argument spellings) and [`report`] (text and JSON).
//!
//! When the witness tool has a key policy on the server (mcp-idem's `[tools.NAME]`), its answers
//! may be replays marked `_meta["mcp-idem/replayed"]`: such a replay is compared without the
//! marker, a replayed call without a key skips `no_key.executes` (it is deduplicated on
//! purpose), and the report carries a note saying which policy showed and what it changes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::Value;

mod checks;
mod concurrency;
mod connect;
mod meta;
mod rejections;
mod replay;
mod report;
mod respell;
mod session;

use checks::{Checker, Plan};
use connect::Target;
use report::Report;

/// Options of `mcp-idem check`.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The witness tool: its result must change on every real execution (a charge that returns
    /// a new id, a counter), so that a replay can be told from a second execution.
    #[arg(long, value_name = "NAME")]
    tool: String,

    /// Arguments of the witness call, a JSON object.
    #[arg(long, value_name = "JSON", default_value = "{}", value_parser = parse_json)]
    args: Value,

    /// Witness arguments that make the call run long enough (1 s or more) to send a duplicate
    /// while it runs; without them the in-progress checks are skipped.
    #[arg(long, value_name = "JSON", value_parser = parse_json)]
    slow_args: Option<Value>,

    /// Witness arguments whose execution has an error outcome (a JSON-RPC error or a result with
    /// isError); without them the error-replay check is skipped.
    #[arg(long, value_name = "JSON", value_parser = parse_json)]
    error_args: Option<Value>,

    /// A read-only tool whose result changes when the witness runs (a balance, a count): called
    /// without a key before and after calls that must not run, to verify that nothing ran.
    #[arg(long, value_name = "NAME")]
    observe_tool: Option<String>,

    /// Arguments of the observation tool.
    #[arg(long, value_name = "JSON", default_value = "{}", value_parser = parse_json, requires = "observe_tool")]
    observe_args: Value,

    /// A tool that answers `resultType: "input_required"` (MRTR): checks that a continuation
    /// carrying the same key is not deduplicated. Skipped without it.
    #[arg(long, value_name = "NAME")]
    mrtr_tool: Option<String>,

    /// Arguments of the MRTR tool.
    #[arg(long, value_name = "JSON", default_value = "{}", value_parser = parse_json, requires = "mrtr_tool")]
    mrtr_args: Value,

    /// `inputResponses` of the MRTR continuation.
    #[arg(long, value_name = "JSON", default_value = "{}", value_parser = parse_json, requires = "mrtr_tool")]
    mrtr_responses: Value,

    /// Check this Streamable HTTP endpoint (http:// or https://HOST:PORT/PATH) instead of a
    /// stdio command.
    #[arg(long, value_name = "URL")]
    url: Option<String>,

    /// A PEM file of CA certificates to trust besides the system's (a private CA), for an
    /// https:// --url.
    #[arg(long, value_name = "FILE", env = "MCP_IDEM_CA_CERT")]
    ca_cert: Option<PathBuf>,

    /// An HTTP header sent with every request, e.g. `Authorization: Bearer TOKEN`; repeatable.
    #[arg(long = "header", value_name = "NAME: VALUE", requires = "url")]
    headers: Vec<String>,

    /// How long to wait for any one response.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,

    /// Print the report as JSON.
    #[arg(long)]
    json: bool,

    /// Show the evidence of every check, not only of failed ones.
    #[arg(long, short)]
    verbose: bool,

    /// Exit with status 1 when a SHOULD check fails too.
    #[arg(long)]
    strict: bool,

    /// The stdio MCP server to run, and its arguments (instead of --url).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn parse_json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|err| format!("not JSON: {err}"))
}

impl CheckArgs {
    pub(crate) fn exec(self) -> anyhow::Result<ExitCode> {
        let target = match (self.url.clone(), self.command.is_empty()) {
            (Some(url), true) => Target::Http {
                url,
                headers: self.headers.clone(),
                ca_cert: self.ca_cert.clone(),
            },
            (None, false) => Target::Stdio(self.command.clone()),
            (Some(_), false) => bail!("give either --url or a command after `--`, not both"),
            (None, true) => bail!(
                "nothing to check: give a command after `--` (stdio) or --url (Streamable HTTP)"
            ),
        };
        if !self.args.is_object() {
            bail!("--args must be a JSON object, got {}", self.args);
        }
        let plan = Plan {
            tool: self.tool.clone(),
            args: self.args.clone(),
            slow_args: self.slow_args.clone(),
            error_args: self.error_args.clone(),
            observe: self
                .observe_tool
                .clone()
                .map(|tool| (tool, self.observe_args.clone())),
            mrtr: self
                .mrtr_tool
                .clone()
                .map(|tool| (tool, self.mrtr_args.clone(), self.mrtr_responses.clone())),
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let report = runtime.block_on(run(&target, &plan, self.timeout))?;
        if self.json {
            println!("{:#}", report.to_json());
        } else {
            print!("{}", report.to_text(self.verbose));
        }
        let summary = report.summary();
        let failed = summary.failed_must > 0 || (self.strict && summary.failed_should > 0);
        Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    }
}

/// Connects, runs every check, and closes the session.
async fn run(target: &Target, plan: &Plan, timeout: Duration) -> anyhow::Result<Report> {
    let connected = connect::connect(target, timeout).await?;
    let mut session = connected.session;
    let mut outcomes = connected.outcomes;
    let mut checker = Checker::new(&mut session, plan);
    checker.run().await;
    outcomes.append(&mut checker.outcomes);
    let notes = checker.policy_note().into_iter().collect();
    session.close().await;
    let mut witness = format!("{} {}", plan.tool, plan.args);
    for (what, args) in [("slow", &plan.slow_args), ("error", &plan.error_args)] {
        if let Some(args) = args {
            witness.push_str(&format!("; {what}: {args}"));
        }
    }
    if let Some((tool, args)) = &plan.observe {
        witness.push_str(&format!("; observed with {tool} {args}"));
    }
    Ok(Report {
        target: target.describe(),
        era: connected.era,
        witness,
        notes,
        outcomes,
    })
}
