//! `mcp-idem bridge URL`: a stdio MCP server for a desktop client, forwarding to a remote
//! Streamable HTTP server with a key on every `tools/call` and safe re-issues. The work is done
//! by [`mcp_idempotency::bridge`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use mcp_idempotency::bridge::{Bridge, BridgeConfig};
use mcp_idempotency::embedded::options::{self, MetaKeys, META_KEY};

#[derive(Debug, Args)]
#[command(after_help = "\
A client's own key is kept wherever it carries it: params.idempotencyKey, \
params._meta.idempotencyKey, or a --meta-key member of _meta (no key is added beside it). Every \
other tools/call gets a fresh params.idempotencyKey (UUID v4). When the server \
advertises tools.idempotency, a call whose answer is lost (no connection, a reset, a stream \
that ends early, no answer within --attempt-timeout, HTTP 502/503/504, \
idempotency_key_in_progress, idempotency_store_unavailable, idempotency_shutting_down) is \
re-issued with the same key until \
--max-time; then the client gets an error (data.type mcp_idem_answer_lost) naming the key. \
Without the capability such a call is re-issued only if tools/list annotates the tool \
idempotentHint or readOnlyHint; otherwise the client gets that error, saying the call may have \
run. Logs (one line per re-issue) go to stderr; MCP_IDEM_LOG sets the filter.

Exit status: 0 when the client's input ends, 2 if the server cannot be reached at start.")]
pub(crate) struct BridgeArgs {
    /// The server's Streamable HTTP endpoint, e.g. https://mcp.example.com/mcp.
    #[arg(value_name = "URL")]
    url: String,

    /// An HTTP header for every request, `Name: Value` (repeatable). MCP_IDEM_HEADERS holds
    /// more, one per line, so that a token can stay out of the client's configuration.
    #[arg(long = "header", short = 'H', value_name = "NAME:VALUE")]
    headers: Vec<String>,

    /// A PEM file of CA certificates to trust besides the system's (a private CA).
    #[arg(long, value_name = "FILE", env = "MCP_IDEM_CA_CERT")]
    ca_cert: Option<PathBuf>,

    /// How long one attempt of a call that may be re-issued waits for its answer.
    #[arg(long, value_name = "DURATION", default_value = "60s", env = "MCP_IDEM_ATTEMPT_TIMEOUT", value_parser = humantime::parse_duration)]
    attempt_timeout: Duration,

    /// No re-issue after this long, counted from the client's request.
    #[arg(long, value_name = "DURATION", default_value = "2m", env = "MCP_IDEM_MAX_TIME", value_parser = humantime::parse_duration)]
    max_time: Duration,

    /// Longest client message (one line); a longer one is skipped and answered -32600.
    #[arg(long, value_name = "BYTES", default_value_t = mcp_idempotency::jsonrpc::DEFAULT_MAX_CLIENT_MESSAGE_BYTES, env = "MCP_IDEM_MAX_LINE_BYTES")]
    max_line_bytes: usize,

    /// Also take a client's own key from these `params._meta` members (comma-separated), beside
    /// `_meta.idempotencyKey`, always read: give the names the gateway behind reads
    /// (its --meta-key).
    #[arg(long = META_KEY.name, env = "MCP_IDEM_META_KEY", value_name = "NAMES", value_parser = options::meta_keys)]
    meta_key: Option<MetaKeys>,
}

/// Headers from the environment: one `Name: Value` per line.
const HEADERS_ENV: &str = "MCP_IDEM_HEADERS";

impl BridgeArgs {
    pub(crate) fn exec(self) -> anyhow::Result<ExitCode> {
        let mut config = BridgeConfig::new(&self.url)?
            .attempt_timeout(self.attempt_timeout)
            .max_time(self.max_time)
            .max_line_bytes(self.max_line_bytes);
        let from_env = std::env::var(HEADERS_ENV).unwrap_or_default();
        let env_headers = from_env.lines().filter(|line| !line.trim().is_empty());
        for header in self.headers.iter().map(String::as_str).chain(env_headers) {
            config = config.header_line(header)?;
        }
        for name in self.meta_key.iter().flat_map(|names| &names.0) {
            config = config.meta_key(name)?;
        }
        if let Some(ca) = self.ca_cert {
            config = config.ca_cert(ca);
        }
        // One thread: a bridge serves one client, and every hand-off between threads costs a
        // wake-up on each call (measured in docs/benchmarks.md, "Bridge latency").
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        runtime.block_on(async {
            let telemetry = crate::ops::start_telemetry()?;
            let bridge = Bridge::connect(config).await?;
            let (input, output) = stdio();
            let served = bridge
                .run(input, output)
                .await
                .context("cannot read the client's input");
            crate::ops::stop_telemetry(telemetry, TELEMETRY_FLUSH).await;
            served?;
            Ok(ExitCode::SUCCESS)
        })
    }
}

/// How long the bridge waits, as its client leaves, for the spans still buffered to be sent.
const TELEMETRY_FLUSH: std::time::Duration = std::time::Duration::from_secs(5);

type Input = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
type Output = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

/// The process's stdin and stdout. When they are pipes (as a client that launches the bridge
/// makes them) they are read and written on the runtime's own thread, without tokio's blocking
/// thread pool; a terminal or a file falls back to `tokio::io::stdin()` / `stdout()`.
fn stdio() -> (Input, Output) {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        use tokio::net::unix::pipe;
        let input = std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .ok()
            .and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok());
        let output = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .ok()
            .and_then(|fd| pipe::Sender::from_owned_fd(fd).ok());
        let input: Input = match input {
            Some(pipe) => Box::new(pipe),
            None => Box::new(tokio::io::stdin()),
        };
        let output: Output = match output {
            Some(pipe) => Box::new(pipe),
            None => Box::new(tokio::io::stdout()),
        };
        (input, output)
    }
    #[cfg(not(unix))]
    {
        (Box::new(tokio::io::stdin()), Box::new(tokio::io::stdout()))
    }
}
