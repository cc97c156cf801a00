//! `mcp-idem wrap [--] <command>`: SEP-3182 in front of any stdio MCP server.
//!
//! On SIGTERM, SIGINT or the client's EOF, `wrap` stops taking keyed calls, gives the calls in
//! flight `--shutdown-grace` to be answered and recorded (see the library's
//! [stdio stopping](mcp_idempotency::stdio#stopping)), then stops the server as [`server`] says
//! and exits with its status.

mod server;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use super::policy_args::PolicyArgs;
use anyhow::Context;
use clap::Args;
use mcp_idempotency::default_scope::local_user;
use mcp_idempotency::default_scope::{wrap_legacy_namespace, LegacyNamespaceReads};
use mcp_idempotency::embedded::options::{self, CANCEL, FORWARD_KEY, NAMESPACE, PRINCIPAL};
use mcp_idempotency::interceptor::{CancelPolicy, InterceptorConfig};
use mcp_idempotency::stdio::StdioProxy;
use mcp_idempotency::{Deduplicator, Scope, Timestamp};

use super::engine_args::EngineArgs;
use crate::ops::OpsArgs;
pub(crate) use server::ExecServerArgs;

/// Default of `--max-line-bytes`: the library's
/// [`DEFAULT_MAX_CLIENT_MESSAGE_BYTES`](mcp_idempotency::jsonrpc::DEFAULT_MAX_CLIENT_MESSAGE_BYTES),
/// spelled for `--help` and `config-check`.
const DEFAULT_MAX_LINE: &str = "4MiB";

/// Default of `--shutdown-grace`: the library's
/// [`DEFAULT_SHUTDOWN_GRACE`](mcp_idempotency::stdio::DEFAULT_SHUTDOWN_GRACE), spelled for `--help`.
const DEFAULT_GRACE: &str = "3s";

#[derive(Debug, Args)]
pub(crate) struct WrapArgs {
    #[command(flatten)]
    engine: EngineArgs,

    #[command(flatten)]
    ops: OpsArgs,

    #[command(flatten)]
    policy: PolicyArgs,

    /// Namespace of this server's records [default: `mcp-server:<name>`, the name the server
    /// gives itself in its `initialize` / `server/discover` result (as the Python and TypeScript
    /// bindings do), so it keeps its records when moved into a binding. A keyed call sent before
    /// any such result waits for one, `wrap` asking the server itself with `server/discover`;
    /// records kept by earlier versions under `wrap:<program>:<hash of the command line>` are
    /// still found].
    #[arg(long = NAMESPACE.name, env = "MCP_IDEM_NAMESPACE")]
    namespace: Option<String>,

    /// Principal the records belong to [default: the local user].
    #[arg(long = PRINCIPAL.name, env = "MCP_IDEM_PRINCIPAL")]
    principal: Option<String>,

    #[arg(long = FORWARD_KEY.name, env = "MCP_IDEM_FORWARD_KEY", help = FORWARD_KEY.help)]
    forward_key: bool,

    #[arg(long = CANCEL.name, env = "MCP_IDEM_CANCEL", help = CANCEL.help,
          default_value = CANCEL.default, value_parser = options::cancel)]
    cancel: CancelPolicy,

    /// Longest client message (one line) read, e.g. 4MiB, 512KiB; a longer one is discarded
    /// without being held in memory whole and answered with a JSON-RPC error.
    #[arg(long, env = "MCP_IDEM_MAX_LINE_BYTES", default_value = DEFAULT_MAX_LINE, value_parser = parse_bytes)]
    max_line_bytes: usize,

    /// How long keyed calls in flight get to be answered and recorded once `wrap` is stopping
    /// (SIGTERM, SIGINT or the client's EOF, counted from the first); new keyed calls are refused
    /// meanwhile. Calls still running then are recorded as outcome-unknown. Then the server's
    /// input is closed; it gets 2 s to exit, then SIGTERM, 2 s more, then SIGKILL.
    #[arg(long, env = "MCP_IDEM_SHUTDOWN_GRACE", default_value = DEFAULT_GRACE, value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,

    /// The MCP server to run, and its arguments, after `--` or not: the first word that is not
    /// one of `wrap`'s options starts it, and every word after it is the server's (`--config`
    /// there is the server's option, not `wrap`'s).
    #[arg(trailing_var_arg = true, required = true, num_args = 1.., value_name = "COMMAND")]
    command: Vec<String>,
}

/// A size: a number of bytes, optionally with a `KiB`, `MiB` or `GiB` suffix.
fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => s.split_at(at),
        None => (s, ""),
    };
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        other => return Err(format!("unknown unit {other:?}; expected KiB, MiB or GiB")),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("expected a size such as 4MiB, got {s:?}"))?;
    n.checked_mul(1 << shift)
        .filter(|&bytes| bytes > 0)
        .ok_or_else(|| format!("size {s:?} out of range"))
}

impl WrapArgs {
    pub(crate) fn exec(self) -> anyhow::Result<ExitCode> {
        // One thread: the proxy is one task per direction, and waking a single thread on I/O is
        // cheaper than handing each message between worker threads.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let result = runtime.block_on(self.run());
        // When stdin is not a pipe, tokio reads it on a blocking thread, which stays in read(2)
        // while the client keeps its end open (the server exited first). Dropping the runtime
        // would wait for that read forever; every response has been flushed by now.
        runtime.shutdown_background();
        result
    }

    async fn run(self) -> anyhow::Result<ExitCode> {
        let policies = self.policy.policies()?;
        PolicyArgs::log(&policies);
        let telemetry = crate::ops::start_telemetry()?;
        let mut store = self
            .ops
            .start(self.engine.open_store().await?, telemetry.as_ref())
            .await?;
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| wrap_legacy_namespace(&self.command));
        let scope = Scope::new(namespace, self.principal.clone().unwrap_or_else(local_user));
        let learn_namespace = self.namespace.is_none();
        if learn_namespace {
            let legacy = (scope.namespace(), scope.principal());
            store = Arc::new(
                LegacyNamespaceReads::open(store, legacy.0, Some(legacy.1), Timestamp::now()).await,
            );
        }
        let dedup = Deduplicator::new(self.engine.engine_config(), store);
        tracing::info!(
            namespace = scope.namespace(),
            principal = scope.principal(),
            "wrapping {:?}",
            self.command
        );

        // Before the server starts: from now on SIGTERM and SIGINT start the graceful stop instead
        // of killing `wrap` at once.
        let (stop, stopped_at) = super::noting_when(super::stop_signal());
        let (mut server, child_in, child_out) = server::spawn(&self.command)?;
        let (input_closed, closing) = tokio::sync::oneshot::channel();
        let child_in = server::ServerInput::new(child_in, input_closed);

        let purge = mcp_idempotency::upkeep::purge_periodically(dedup.clone());
        let proxy = StdioProxy::new(dedup.clone(), scope)
            .namespace_from_server(learn_namespace)
            .interceptor_config(
                InterceptorConfig::default()
                    .forward_key(self.forward_key)
                    .cancel_policy(self.cancel)
                    .tool_policies(policies)
                    .policy_command(format!("mcp-idem tools -- {}", shell_words(&self.command))),
            )
            .max_line_bytes(self.max_line_bytes)
            .shutdown_grace(self.shutdown_grace);
        // Non-blocking pipes when the client launched us with pipes (the usual case): no thread
        // hand-off per message.
        let (client_in, client_out) = rmcp::transport::stdio_pipes();
        let run = proxy.run_until(client_in, client_out, child_in, child_out, stop);
        let proxied = async {
            tokio::select! {
                result = run => result,
                never = purge => match never {},
            }
        };
        let (proxied, status) = tokio::join!(proxied, server.wait_or_stop(closing));
        super::settle_completions(&dedup, self.shutdown_grace, stopped_at.get().copied()).await;
        let left = super::grace_left(self.shutdown_grace, stopped_at.get().copied());
        crate::ops::stop_telemetry(telemetry, left).await;
        let exit = proxied.context("stdio proxy failed")?;
        if exit.calls_cut_off > 0 {
            tracing::warn!(
                calls = exit.calls_cut_off,
                "stopped with calls still running after --shutdown-grace; they are recorded as outcome-unknown"
            );
        }
        let status = status.context("cannot wait for the server")?;
        Ok(exit_code(status))
    }
}

fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return ExitCode::from(u8::try_from(128 + signal).unwrap_or(1));
        }
    }
    ExitCode::FAILURE
}

/// `words` as one shell command line, each word quoted when it needs to be.
fn shell_words(words: &[String]) -> String {
    words
        .iter()
        .map(|word| {
            let plain = !word.is_empty()
                && word
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@%+,".contains(&b));
            if plain {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_bytes("4MiB"), Ok(4 << 20));
        assert_eq!(parse_bytes("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("4MB").is_err());
        assert!(parse_bytes("MiB").is_err());
    }

    #[test]
    fn the_default_grace_is_the_librarys() {
        use mcp_idempotency::stdio::DEFAULT_SHUTDOWN_GRACE;
        assert_eq!(
            humantime::parse_duration(DEFAULT_GRACE),
            Ok(DEFAULT_SHUTDOWN_GRACE)
        );
    }

    #[test]
    fn the_default_line_limit_is_the_librarys() {
        assert_eq!(
            parse_bytes(DEFAULT_MAX_LINE),
            Ok(mcp_idempotency::jsonrpc::DEFAULT_MAX_CLIENT_MESSAGE_BYTES)
        );
    }
}
