//! A stdio MCP server that forwards to a remote Streamable HTTP server, giving every `tools/call`
//! an idempotency key and re-issuing a call whose answer was lost with the SAME key (feature
//! `bridge`; `mcp-idem bridge` is this module on the process's stdin and stdout).
//!
//! A desktop client launches the bridge as if it were the server. Messages pass through in both
//! directions, in order and untranslated, whatever revision the client speaks:
//!
//! - **2026-07-28** (stateless, `server/discover`): each POST carries the `Mcp-Method`,
//!   `Mcp-Name` and `MCP-Protocol-Version` headers its message calls for.
//! - **`initialize` revisions** (2025-03-26 to 2025-11-25): the `Mcp-Session-Id` of the
//!   `initialize` answer goes on every later request, the server's GET stream is opened for its
//!   own messages, and a session the server forgot (`404`) is initialized again with the
//!   client's own `initialize` and `notifications/initialized` before the request is re-sent.
//!   The session is deleted when the client's input ends.
//!
//! Answers, plain JSON or SSE streams, reach the client message by message; server-to-client
//! requests (sampling, elicitation, roots) and the client's answers pass through like any other
//! message.
//!
//! # Keys and re-issues
//!
//! A client's own key is kept wherever it carries it: `params.idempotencyKey` (the SEP key),
//! `params._meta.idempotencyKey`, or a `_meta` member named by
//! [`BridgeConfig::meta_key`]. A call keyed in `_meta` goes out as the client wrote it, with no SEP
//! key beside it (which would outrank it at a gateway, so that the same call sent later without
//! the bridge would run again), and is re-issued under the same rules as a SEP key. A
//! `tools/call` without a key of its own gets a fresh UUID v4 as `params.idempotencyKey`. MRTR
//! continuations (`requestState` / `inputResponses`) go out as they are. The capability is read
//! from the raw `server/discover` or `initialize` result (the bridge probes `server/discover` at
//! start, before it reads the client's first line).
//!
//! When the server advertises `tools.idempotency`, a call whose answer is lost (no connection,
//! a connection reset, a stream that ends before the response, no answer within the attempt
//! timeout, HTTP 502/503/504, `idempotency_key_in_progress` (after its `retryAfterMs`),
//! `idempotency_store_unavailable`, `idempotency_shutting_down`) is re-issued with the same key
//! under a new JSON-RPC id, and the answer reaches the client under the client's id. Waits between
//! attempts back off with jitter ([`RetryPolicy`]: the same loop as
//! [`Client`](crate::client::Client)); once the call's time is
//! up the client gets an error whose `data.type` is [`ANSWER_LOST`] and which names the key. A
//! conflict, `idempotency_outcome_unknown` or any other answer is the client's as it came.
//!
//! Without the capability a `tools/call` whose answer was lost is re-issued only when the tool's
//! `tools/list` annotations say `idempotentHint` or `readOnlyHint`; otherwise the client gets the
//! [`ANSWER_LOST`] error, saying the call may have run (`data.mayHaveRun`) and was not re-issued.
//! Such a call has no attempt timeout: it waits as long as the server takes, or until the client
//! cancels. Requests other than `tools/call` are re-issued as needed. A request that could not
//! be sent at all (connection refused) is always tried again.
//!
//! A `notifications/cancelled` from the client stops that request's attempts and closes its
//! answer stream (how 2026-07-28 cancels); in a legacy session it is also sent on, naming the
//! attempt's id. A JSON-RPC batch is sent as it is, never re-issued.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use mcp_idempotency::bridge::{Bridge, BridgeConfig};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = BridgeConfig::new("https://mcp.example.com/mcp")?
//!     .header_line("Authorization: Bearer secret")?
//!     .attempt_timeout(Duration::from_secs(60));
//! let bridge = Bridge::connect(config).await?;
//! bridge.run(tokio::io::stdin(), tokio::io::stdout()).await?;
//! # Ok(())
//! # }
//! ```

mod exchange;
mod message;
mod request;
mod shared;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};

use crate::client::RetryPolicy;
use crate::http_client::{https_client, TlsSetupError};
use crate::jsonrpc::{
    error_response, error_response_with_data, DEFAULT_MAX_CLIENT_MESSAGE_BYTES, INTERNAL_ERROR,
    INVALID_REQUEST, PARSE_ERROR,
};
use crate::lines::{self, Line};
use crate::policy::DEFAULT_META_KEY;
use crate::protocol::{self, INITIALIZE, INITIALIZED};
use exchange::{Endpoint, SendError};
use message::ClientMessage;
use shared::Shared;

pub use request::ANSWER_LOST;

/// Messages on their way to the client's stdout.
const OUTPUT_QUEUE: usize = 256;
/// How long a notification or a response may take to be taken by the server before the next
/// client message is read anyway.
const INLINE_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the bridge forwards to and how it retries.
#[derive(Clone, Debug)]
pub struct BridgeConfig {
    url: Uri,
    headers: HeaderMap,
    ca_cert: Option<PathBuf>,
    attempt_timeout: Duration,
    max_time: Duration,
    max_line_bytes: usize,
    meta_keys: Vec<String>,
}

/// Why the bridge cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BridgeError {
    /// The URL is not an `http://` or `https://` URL with a host.
    #[error("invalid server URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A `_meta` key name that is empty.
    #[error("invalid _meta key name {name:?}: it must not be empty")]
    InvalidMetaKey {
        /// The name given.
        name: String,
    },
    /// A `Name: Value` header that is not a valid header.
    #[error("invalid header {header:?}: {reason}")]
    InvalidHeader {
        /// The header given.
        header: String,
        /// What is wrong with it.
        reason: String,
    },
    /// TLS could not be set up (the CA file).
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
    /// The server could not be reached (no connection, a TLS failure).
    #[error("cannot reach the MCP server at {url}: {source}")]
    Unreachable {
        /// The endpoint.
        url: String,
        /// What went wrong, with its causes.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The server asks for credentials the bridge was not given.
    #[error(
        "the MCP server at {url} answered HTTP {status}: it wants authorization (pass --header 'Authorization: Bearer …')"
    )]
    Unauthorized {
        /// The endpoint.
        url: String,
        /// `401` or `403`.
        status: u16,
    },
}

impl BridgeConfig {
    /// Forwards to the Streamable HTTP endpoint `url` (`http://` or `https://`). Defaults: attempt
    /// timeout 60 s, re-issues for at most 2 minutes, client lines of at most 4 MiB.
    pub fn new(url: &str) -> Result<Self, BridgeError> {
        let invalid = |reason: &str| BridgeError::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(invalid("expected http://HOST[:PORT]/PATH or https://…")),
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(invalid("no host"));
        }
        Ok(Self {
            url: uri,
            headers: HeaderMap::new(),
            ca_cert: None,
            attempt_timeout: Duration::from_secs(60),
            max_time: Duration::from_secs(120),
            max_line_bytes: DEFAULT_MAX_CLIENT_MESSAGE_BYTES,
            meta_keys: vec![DEFAULT_META_KEY.to_owned()],
        })
    }

    /// Adds a header, given as `Name: Value`, to every request (credentials, for example).
    pub fn header_line(mut self, line: &str) -> Result<Self, BridgeError> {
        let invalid = |reason: &str| BridgeError::InvalidHeader {
            header: redact_header(line),
            reason: reason.to_owned(),
        };
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| invalid("expected 'Name: Value'"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| invalid("not a valid header name"))?;
        let value =
            HeaderValue::from_str(value.trim()).map_err(|_| invalid("not a valid header value"))?;
        self.headers.append(name, value);
        Ok(self)
    }

    /// Also trusts the CA certificates of this PEM file (a private CA).
    pub fn ca_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_cert = Some(path.into());
        self
    }

    /// How long one attempt of a re-issuable request waits for its answer.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// No re-issue starts later than this after the client's request.
    pub fn max_time(mut self, max_time: Duration) -> Self {
        self.max_time = max_time;
        self
    }

    /// Longest client line (default [`DEFAULT_MAX_CLIENT_MESSAGE_BYTES`]); a longer one is skipped
    /// and answered `-32600`.
    pub fn max_line_bytes(mut self, bytes: usize) -> Self {
        self.max_line_bytes = bytes;
        self
    }

    /// Also takes `params._meta[name]` as a client's own key (beside `_meta.idempotencyKey`,
    /// always read), as a gateway's `--meta-key` does: a call that carries it gets no key from
    /// the bridge.
    pub fn meta_key(mut self, name: &str) -> Result<Self, BridgeError> {
        if name.is_empty() {
            return Err(BridgeError::InvalidMetaKey {
                name: name.to_owned(),
            });
        }
        if !self.meta_keys.iter().any(|known| known == name) {
            self.meta_keys.push(name.to_owned());
        }
        Ok(self)
    }

    fn policy(&self) -> RetryPolicy {
        RetryPolicy::default()
            .with_max_attempts(u32::MAX)
            .with_max_elapsed(self.max_time)
            .with_attempt_timeout(self.attempt_timeout)
    }
}

/// `Name: Value` with the value hidden, for error messages about credentials.
fn redact_header(line: &str) -> String {
    match line.split_once(':') {
        Some((name, _)) => format!("{}: …", name.trim()),
        None => line.chars().take(40).collect(),
    }
}

/// A bridge connected to its server, ready to [`run`](Self::run).
pub struct Bridge {
    endpoint: Endpoint,
    policy: RetryPolicy,
    capability: Option<bool>,
    max_line_bytes: usize,
    meta_keys: Vec<String>,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge")
            .field("url", self.endpoint.uri())
            .field("capability", &self.capability)
            .finish_non_exhaustive()
    }
}

impl Bridge {
    /// Checks that the server answers: POSTs `server/discover`, and learns from its result
    /// whether the server advertises `tools.idempotency` (a legacy server says so later, in its
    /// `initialize` result). Fails if the server cannot be reached or wants credentials.
    pub async fn connect(config: BridgeConfig) -> Result<Self, BridgeError> {
        let client = https_client(config.ca_cert.as_deref())?;
        let endpoint = Endpoint::new(client, config.url.clone(), config.headers.clone());
        let url = config.url.to_string();
        let probe = protocol::discover_request("mcp-idem-bridge-discover").to_string();
        let unreachable =
            |source: Box<dyn std::error::Error + Send + Sync>| BridgeError::Unreachable {
                url: url.clone(),
                source,
            };
        let mut answer = endpoint
            .post(&probe, &message::routing_headers(&probe))
            .await
            .map_err(|error| match error {
                SendError::NotSent(e) | SendError::Failed(e) => unreachable(Box::new(e)),
                SendError::Build(e) => unreachable(Box::new(e)),
            })?;
        if matches!(
            answer.status,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            return Err(BridgeError::Unauthorized {
                url,
                status: answer.status.as_u16(),
            });
        }
        let mut capability = None;
        while let Ok(Some(received)) = answer.next_message().await {
            if let Some(advertised) = message::advertises_idempotency(&received) {
                capability = Some(advertised);
                break;
            }
        }
        tracing::info!(%url, status = %answer.status, ?capability, "probed the server");
        Ok(Self {
            endpoint,
            policy: config.policy(),
            capability,
            max_line_bytes: config.max_line_bytes,
            meta_keys: config.meta_keys,
        })
    }

    /// Whether the server's `server/discover` result advertised `tools.idempotency` (`None`: it
    /// gave no such result; a legacy server).
    pub fn advertises_idempotency(&self) -> Option<bool> {
        self.capability
    }

    /// Serves the client on `input` / `output` until `input` ends, then waits for the requests
    /// in flight to be answered and ends a legacy session. Errors only when `input` fails.
    pub async fn run<R, W>(self, input: R, mut output: W) -> std::io::Result<()>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out, mut queue) = mpsc::channel::<String>(OUTPUT_QUEUE);
        let writer = tokio::spawn(async move {
            while let Some(mut line) = queue.recv().await {
                line.push('\n');
                if output.write_all(line.as_bytes()).await.is_err() || output.flush().await.is_err()
                {
                    tracing::warn!("the client's output closed");
                    break;
                }
            }
        });
        let shared = Arc::new(Shared::new(
            self.endpoint,
            self.policy,
            out,
            self.capability,
        ));
        let mut relay = Relay {
            shared: Arc::clone(&shared),
            tasks: JoinSet::new(),
            in_flight: HashMap::new(),
            meta_keys: self.meta_keys,
        };
        let result = relay.read_client(input, self.max_line_bytes).await;
        // The client is gone: its requests in flight get until their own deadline to be answered
        // (a call that may not be re-issued has none, so the wait is bounded here).
        let drain = async { while relay.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(shared.policy.max_elapsed(), drain)
            .await
            .is_err()
        {
            tracing::warn!("the client's input ended; requests still unanswered are abandoned");
            relay.tasks.abort_all();
        }
        shared.end_session().await;
        drop(relay);
        drop(shared);
        let _ = writer.await;
        result
    }
}

/// The client side of a running bridge: reads the client's lines and dispatches them.
struct Relay {
    shared: Arc<Shared>,
    tasks: JoinSet<()>,
    /// Requests being answered, by the client's id: their task and the id of their attempt.
    in_flight: HashMap<String, (AbortHandle, Arc<Mutex<String>>)>,
    /// The `_meta` members a client's own key is read from.
    meta_keys: Vec<String>,
}

impl Relay {
    async fn read_client<R: AsyncRead + Unpin>(
        &mut self,
        input: R,
        max_line_bytes: usize,
    ) -> std::io::Result<()> {
        let mut reader = BufReader::new(input);
        let mut line = Vec::new();
        loop {
            match lines::read_line(&mut reader, &mut line, max_line_bytes).await? {
                Line::Eof => return Ok(()),
                Line::TooLong => {
                    let id = lines::id_in_prefix(&line).unwrap_or_else(|| "null".into());
                    lines::skip_rest(&mut reader).await?;
                    let message = format!("the message is longer than {max_line_bytes} bytes");
                    self.shared
                        .deliver(&error_response(&id, INVALID_REQUEST, &message))
                        .await;
                }
                Line::Whole => match std::str::from_utf8(&line) {
                    Ok(text) => {
                        let text = text.trim_end_matches(['\n', '\r']).to_owned();
                        if !text.trim().is_empty() {
                            self.on_line(&text).await;
                        }
                    }
                    Err(_) => {
                        let error = error_response("null", PARSE_ERROR, "Parse error: not UTF-8");
                        self.shared.deliver(&error).await;
                    }
                },
            }
            self.in_flight.retain(|_, (task, _)| !task.is_finished());
            while self.tasks.try_join_next().is_some() {}
        }
    }

    async fn on_line(&mut self, line: &str) {
        let key = || uuid::Uuid::new_v4().to_string();
        match ClientMessage::parse(line, &self.meta_keys, key) {
            ClientMessage::Request(request) => {
                if request.method == INITIALIZE {
                    self.shared.remember_initialize(&request.message);
                }
                let id = request.id.clone();
                let wire_id = Arc::new(Mutex::new(id.clone()));
                let task = self.tasks.spawn(request::serve(
                    Arc::clone(&self.shared),
                    request,
                    Arc::clone(&wire_id),
                ));
                self.in_flight.insert(id, (task, wire_id));
            }
            ClientMessage::Notification { method } => {
                if method == "notifications/cancelled" && self.cancel(line).await {
                    return;
                }
                if method == INITIALIZED {
                    self.shared.remember_initialized(line);
                }
                self.post_inline(line).await;
                if method == INITIALIZED {
                    self.shared.open_get_stream();
                }
            }
            ClientMessage::Response => self.post_inline(line).await,
            ClientMessage::Batch => {
                let shared = Arc::clone(&self.shared);
                let batch = line.to_owned();
                self.tasks
                    .spawn(async move { forward_batch(&shared, &batch).await });
            }
            ClientMessage::NotJson => {
                let error =
                    error_response("null", PARSE_ERROR, "Parse error: the line is not JSON");
                self.shared.deliver(&error).await;
            }
            ClientMessage::NotJsonRpc => {
                let error = error_response(
                    "null",
                    INVALID_REQUEST,
                    "Invalid Request: not a JSON-RPC request, notification or response",
                );
                self.shared.deliver(&error).await;
            }
        }
    }

    /// The client cancelled a request: stops its attempts (which closes its answer stream) and,
    /// in a legacy session, tells the server under the attempt's id. `false` if no such request
    /// is in flight (the notification then goes on as it is).
    async fn cancel(&mut self, line: &str) -> bool {
        let Ok(notification) = serde_json::from_str::<serde_json::Value>(line) else {
            return false;
        };
        let Some(id) = notification
            .get("params")
            .and_then(|params| params.get("requestId"))
            .map(ToString::to_string)
        else {
            return false;
        };
        let Some((task, wire_id)) = self.in_flight.remove(&id) else {
            return false;
        };
        task.abort();
        if self.shared.in_session() {
            let wire_id = wire_id
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            let mut notification = notification;
            notification["params"]["requestId"] =
                serde_json::from_str(&wire_id).unwrap_or(serde_json::Value::Null);
            self.post_inline(&notification.to_string()).await;
        }
        true
    }

    /// POSTs a notification or a response and waits for the server to take it, so that what
    /// the client sends next arrives after it.
    async fn post_inline(&self, message: &str) {
        let sent = tokio::time::timeout(INLINE_TIMEOUT, self.post_and_read(message)).await;
        if sent.is_err() {
            tracing::warn!(
                "the server took more than {INLINE_TIMEOUT:?} to take a notification or response"
            );
        }
    }

    async fn post_and_read(&self, message: &str) {
        let (headers, _) = self.shared.headers_for(message);
        match self.shared.endpoint.post(message, &headers).await {
            Ok(mut answer) if answer.status.is_success() => {
                while let Ok(Some(received)) = answer.next_message().await {
                    self.shared.deliver_from_server(&received).await;
                }
            }
            // A notification or a response has nobody to tell; the log says it.
            Ok(answer) => tracing::warn!(
                status = %answer.status,
                "the server refused a notification or response"
            ),
            Err(error) => tracing::warn!(%error, "cannot send a notification or response"),
        }
    }
}

/// Sends a batch once and passes its answer on.
async fn forward_batch(shared: &Shared, batch: &str) {
    let (headers, _) = shared.headers_for(batch);
    let (code, message, data) = match shared.endpoint.post(batch, &headers).await {
        Ok(mut answer) if answer.status.is_success() => {
            while let Ok(Some(received)) = answer.next_message().await {
                shared.deliver_from_server(&received).await;
            }
            return;
        }
        Ok(answer) => (
            INVALID_REQUEST,
            format!("the server refused the batch (HTTP {})", answer.status),
            json!({"httpStatus": answer.status.as_u16(), "mayHaveRun": answer.status.is_server_error()}),
        ),
        Err(error) => (
            INTERNAL_ERROR,
            format!("the batch could not be sent: {error}"),
            json!({"type": ANSWER_LOST, "mayHaveRun": matches!(error, SendError::Failed(_))}),
        ),
    };
    shared
        .deliver(&error_response_with_data(
            "null",
            code,
            &message,
            Some(data),
        ))
        .await;
}
