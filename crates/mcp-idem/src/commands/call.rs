//! `mcp-idem call`: one `tools/call` with an idempotency key, retried safely, over stdio or
//! Streamable HTTP. The work is done by [`mcp_idempotency::client`].

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use mcp_idempotency::client::{
    CallError, CallOutcome, CallReport, CallRequest, Client, Failure, GaveUp, RetryPolicy,
};
use mcp_idempotency::RejectionKind;
use serde_json::{json, Value};

use super::server_args::ServerArgs;

/// Exit status of a call whose outcome is a tool error.
const EXIT_TOOL_ERROR: u8 = 1;
/// Exit status of a call without an outcome, or of a usage error.
const EXIT_NO_OUTCOME: u8 = 2;

#[derive(Debug, Args)]
#[command(after_help = "\
Output: the outcome goes to stdout (text contents, then the structured content; a JSON-RPC \
error's message and data), the key and the number of attempts to stderr. With --json, stdout \
holds one object: {\"key\", \"attempts\", and \"result\" or \"error\" (the JSON-RPC response \
member) or \"failure\" ({\"type\", \"message\", \"mayHaveRun\", \"gaveUp\", \"error\"?})}.

Retries reuse the key, and happen only when safe: the server advertises tools.idempotency (or \
--trust-idempotent-hint and the tool is annotated idempotentHint: true). Retried: no answer \
within --timeout, a broken connection (a stdio server is started again), \
idempotency_key_in_progress (after its retryAfterMs), idempotency_store_unavailable, \
idempotency_shutting_down. Never \
retried: idempotency_key_conflict, idempotency_outcome_unknown, other idempotency_* refusals, \
tool errors.

Exit status:
  0  the tool succeeded (first run or replay)
  1  the tool failed: a result with isError, or a JSON-RPC error (perhaps replayed)
  2  no outcome: key conflict, outcome unknown, retries exhausted, connection failure, or a \
usage error. When stderr says the call may have run, retry with the same --key, never a new one.")]
pub(crate) struct CallArgs {
    #[command(flatten)]
    server: ServerArgs,

    /// The tool to call.
    #[arg(long, value_name = "NAME")]
    tool: String,

    /// The tool's arguments, a JSON object [default: none].
    #[arg(long = "args", value_name = "JSON", value_parser = parse_arguments)]
    arguments: Option<Value>,

    /// Idempotency key [default: a fresh UUID v4, printed on stderr]. Pass the key of a call
    /// whose outcome is unknown to get its outcome without running it twice.
    #[arg(long, value_name = "KEY")]
    key: Option<String>,

    /// Retries after the first attempt, at most (only when safe).
    #[arg(long, value_name = "N", default_value_t = 4)]
    retries: u32,

    /// How long each attempt waits for its response.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,

    /// How long starting the server (stdio) or connecting (HTTP) and the handshake may take.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    connect_timeout: Duration,

    /// Stop retrying after this long in total.
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = humantime::parse_duration)]
    max_time: Duration,

    /// Also retry over a server without tools.idempotency when the tool is annotated
    /// idempotentHint: true (the tool may then run more than once).
    #[arg(long)]
    trust_idempotent_hint: bool,

    /// Print the outcome as one JSON object (see below).
    #[arg(long)]
    json: bool,
}

fn parse_arguments(text: &str) -> Result<Value, String> {
    let value: Value = serde_json::from_str(text).map_err(|err| format!("not JSON: {err}"))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err("the arguments must be a JSON object".into())
    }
}

impl CallArgs {
    pub(crate) fn exec(self) -> anyhow::Result<ExitCode> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let code = runtime.block_on(self.run());
        runtime.shutdown_timeout(Duration::from_secs(1));
        Ok(ExitCode::from(code))
    }

    async fn run(self) -> u8 {
        let policy = RetryPolicy::default()
            .with_max_attempts(self.retries.saturating_add(1))
            .with_attempt_timeout(self.timeout)
            .with_connect_timeout(self.connect_timeout)
            .with_max_elapsed(self.max_time)
            .with_trust_idempotent_hint(self.trust_idempotent_hint);
        let mut request = CallRequest::new(&self.tool);
        if let Some(arguments) = &self.arguments {
            request = request.arguments(arguments.clone());
        }
        if let Some(key) = &self.key {
            request = request.key(key);
        }
        let client = Client::new(self.server.connector()).with_policy(policy);
        let result = client.call_tool(request).await;
        client.close().await;
        self.report(&result)
    }

    /// Prints the outcome; returns the exit status.
    fn report(&self, result: &Result<CallReport, CallError>) -> u8 {
        let code = match result {
            Ok(report) if report.outcome().is_success() => 0,
            Ok(_) => EXIT_TOOL_ERROR,
            Err(_) => EXIT_NO_OUTCOME,
        };
        let printed = if self.json {
            print_json(result)
        } else {
            print_human(result)
        };
        if let Err(err) = printed {
            if err.kind() != std::io::ErrorKind::BrokenPipe {
                eprintln!("mcp-idem: error: cannot write the outcome: {err}");
                return EXIT_NO_OUTCOME;
            }
        }
        code
    }
}

fn attempts(n: u32) -> String {
    if n == 1 {
        "1 attempt".into()
    } else {
        format!("{n} attempts")
    }
}

/// The outcome on stdout, the key and the attempts on stderr.
fn print_human(result: &Result<CallReport, CallError>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match result {
        Ok(report) => {
            match report.outcome() {
                CallOutcome::Success(_) | CallOutcome::ToolError(_) => {
                    let json = report.outcome().to_json();
                    write_result(&mut out, &json["result"])?;
                    if !report.outcome().is_success() {
                        eprintln!("mcp-idem call: the tool reported an error (isError)");
                    }
                }
                CallOutcome::RpcError(error) => {
                    writeln!(out, "error {}: {}", error.code.0, error.message)?;
                    if let Some(data) = &error.data {
                        writeln!(out, "{}", pretty(data))?;
                    }
                    eprintln!("mcp-idem call: the call failed with a JSON-RPC error");
                }
                _ => writeln!(out, "{}", pretty(&report.outcome().to_json()))?,
            }
            out.flush()?;
            eprintln!(
                "mcp-idem call: key {}, {}",
                report.key(),
                attempts(report.attempts())
            );
        }
        Err(error) => {
            eprintln!("mcp-idem call: {error}");
            if let Some(data) = error.failure().error_data().and_then(|e| e.data.as_ref()) {
                eprintln!("mcp-idem call: error data: {data}");
            }
            if let Some(hint) = hint(error) {
                eprintln!("mcp-idem call: {hint}");
            }
            eprintln!(
                "mcp-idem call: key {}, {}",
                error.key(),
                attempts(error.attempts())
            );
        }
    }
    Ok(())
}

/// What to do next, for the failures where it is not obvious.
fn hint(error: &CallError) -> Option<String> {
    let key = error.key();
    match error.failure() {
        Failure::Conflict(_) => Some(format!(
            "the key {key} was used before with other arguments: use a new key for a new operation"
        )),
        Failure::OutcomeUnknown(_) => Some(
            "check out of band whether the operation took effect before running it under a new key"
                .into(),
        ),
        _ if error.may_have_run() => Some(format!(
            "the call may have run: retry with --key {key}, never with a new key"
        )),
        _ => None,
    }
}

/// Text contents, other contents as a one-line summary, then the structured content.
fn write_result(out: &mut impl Write, result: &Value) -> std::io::Result<()> {
    let contents = result["content"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for content in contents {
        match content["type"].as_str() {
            Some("text") => writeln!(out, "{}", content["text"].as_str().unwrap_or_default())?,
            Some("resource") if content["resource"]["text"].is_string() => writeln!(
                out,
                "{}",
                content["resource"]["text"].as_str().unwrap_or_default()
            )?,
            kind => {
                let kind = kind.unwrap_or("content");
                let detail = ["mimeType", "uri", "name"]
                    .iter()
                    .filter_map(|field| {
                        content[*field]
                            .as_str()
                            .or_else(|| content["resource"][*field].as_str())
                    })
                    .collect::<Vec<_>>()
                    .join(" ");
                writeln!(out, "[{kind} {detail}]")?;
            }
        }
    }
    if let Some(structured) = result.get("structuredContent") {
        writeln!(out, "{}", pretty(structured))?;
    }
    Ok(())
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// One JSON object on stdout; a failure is also described on stderr.
fn print_json(result: &Result<CallReport, CallError>) -> std::io::Result<()> {
    let object = match result {
        Ok(report) => {
            let mut object = json!({"key": report.key(), "attempts": report.attempts()});
            if let (Some(object), Value::Object(member)) =
                (object.as_object_mut(), report.outcome().to_json())
            {
                object.extend(member);
            }
            object
        }
        Err(error) => {
            eprintln!("mcp-idem call: {error}");
            let mut failure = json!({
                "type": failure_type(error.failure()),
                "message": error.to_string(),
                "mayHaveRun": error.may_have_run(),
                "gaveUp": gave_up(error.gave_up()),
            });
            if let Some(data) = error.failure().error_data() {
                failure["error"] = serde_json::to_value(data).unwrap_or(Value::Null);
            }
            json!({"key": error.key(), "attempts": error.attempts(), "failure": failure})
        }
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{object}")?;
    out.flush()
}

fn failure_type(failure: &Failure) -> &str {
    match failure {
        Failure::Conflict(_) => RejectionKind::KeyConflict.as_str(),
        Failure::OutcomeUnknown(_) => RejectionKind::OutcomeUnknown.as_str(),
        Failure::InProgress(_) => RejectionKind::KeyInProgress.as_str(),
        Failure::StoreUnavailable(_) => RejectionKind::StoreUnavailable.as_str(),
        Failure::ShuttingDown(_) => RejectionKind::ShuttingDown.as_str(),
        Failure::Rejected { kind, .. } => kind,
        Failure::Timeout(_) => "timeout",
        Failure::Transport(_) => "transport",
        Failure::Connect(_) => "connect",
        Failure::UnexpectedResponse(_) => "unexpected_response",
        _ => "other",
    }
}

fn gave_up(gave_up: GaveUp) -> &'static str {
    match gave_up {
        GaveUp::Final => "final",
        GaveUp::Unsafe => "unsafe",
        GaveUp::MaxAttempts => "max_attempts",
        GaveUp::MaxElapsed => "max_elapsed",
        _ => "other",
    }
}
