//! One connection to the server under test, over stdio or Streamable HTTP, speaking raw JSON-RPC
//! in the protocol era the server answered: requests are written exactly as the checks spell
//! them, and responses are kept exactly as received.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use mcp_idempotency::protocol;

use crate::http_line_client::{HttpAnswer, HttpClient};
use crate::line_client::LineClient;

/// Which handshake the server answered, and so how requests are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Era {
    /// 2026-07-28: `server/discover`, and `_meta` with the protocol version on every request.
    Current,
    /// A legacy session opened with `initialize`, at this protocol version.
    Legacy(String),
}

/// How a request carries its idempotency key.
#[derive(Clone, Debug)]
pub(crate) enum Key {
    None,
    /// A string key in `params.idempotencyKey` (the SEP).
    Text(String),
    /// Any JSON text in `params.idempotencyKey`, for keys that are not valid (a number, say).
    Raw(String),
    /// A string key in `params._meta.idempotencyKey`: where the official SDKs' public APIs let a
    /// client put one (`meta=` in the Python SDK).
    Meta(String),
}

impl Key {
    /// The JSON text of `params.idempotencyKey`, if the key goes there.
    fn json(&self) -> Option<String> {
        match self {
            Self::None | Self::Meta(_) => None,
            Self::Text(key) => Some(Value::from(key.as_str()).to_string()),
            Self::Raw(raw) => Some(raw.clone()),
        }
    }

    /// The `"idempotencyKey":KEY` member of `params._meta`, if the key goes there.
    fn meta_member(&self) -> Option<String> {
        match self {
            Self::Meta(key) => Some(format!(
                r#""{}":{}"#,
                protocol::IDEMPOTENCY_KEY,
                Value::from(key.as_str())
            )),
            _ => None,
        }
    }
}

/// A response, parsed and as received, with the request that asked for it and when.
#[derive(Clone, Debug)]
pub(crate) struct Reply {
    /// The request as sent.
    pub(crate) request: String,
    /// The response message as received.
    pub(crate) text: String,
    pub(crate) message: Value,
    /// The JSON-RPC id the request carried.
    pub(crate) id: u64,
    pub(crate) sent: Instant,
    pub(crate) received: Instant,
    /// The exact text of `result`, if the response has one.
    pub(crate) result_raw: Option<String>,
    /// The exact text of `error`, if the response has one.
    pub(crate) error_raw: Option<String>,
}

impl Reply {
    fn new(
        request: String,
        id: u64,
        sent: Instant,
        text: String,
        received: Instant,
    ) -> anyhow::Result<Self> {
        #[derive(Deserialize)]
        struct Envelope<'a> {
            #[serde(borrow)]
            result: Option<&'a RawValue>,
            #[serde(borrow)]
            error: Option<&'a RawValue>,
        }
        let message: Value = serde_json::from_str(&text)
            .with_context(|| format!("the response is not JSON: {text}"))?;
        let envelope: Envelope<'_> = serde_json::from_str(&text)
            .with_context(|| format!("the response is not a JSON-RPC message: {text}"))?;
        Ok(Self {
            result_raw: envelope.result.map(|r| r.get().to_owned()),
            error_raw: envelope.error.map(|r| r.get().to_owned()),
            request,
            text,
            message,
            id,
            sent,
            received,
        })
    }

    /// The request as sent, with the constant `_meta` members of the current era elided.
    pub(crate) fn request_for_display(&self) -> String {
        match meta_members_text() {
            Some(members) => self
                .request
                .replace(&format!(r#""_meta":{{{members}"#), r#""_meta":{…"#),
            None => self.request.clone(),
        }
    }

    /// `result._meta["mcp-idem/replayed"]`: the key source of a replay that a key policy of the
    /// server decided (mcp-idem marks those; a SEP-key replay carries no marker).
    pub(crate) fn replay_marker(&self) -> Option<&str> {
        self.message
            .get("result")?
            .get("_meta")?
            .get(mcp_idempotency::REPLAYED_META)?
            .as_str()
    }

    /// The exact text of the outcome: `result`, else `error`.
    pub(crate) fn outcome_raw(&self) -> Option<&str> {
        self.result_raw.as_deref().or(self.error_raw.as_deref())
    }

    /// A successful result (not an error, not `isError: true`).
    pub(crate) fn is_success(&self) -> bool {
        self.message
            .get("result")
            .is_some_and(|r| r.get("isError") != Some(&Value::Bool(true)))
    }

    /// A JSON-RPC error, or a tool result with `isError: true`.
    pub(crate) fn is_error_outcome(&self) -> bool {
        self.message.get("error").is_some() || !self.is_success()
    }

    pub(crate) fn error_code(&self) -> Option<i64> {
        self.message.pointer("/error/code")?.as_i64()
    }

    /// `error.data.type`.
    pub(crate) fn error_type(&self) -> Option<&str> {
        self.message.pointer("/error/data/type")?.as_str()
    }

    /// `error.data.idempotencyKey`.
    pub(crate) fn error_key(&self) -> Option<&str> {
        self.message.pointer("/error/data/idempotencyKey")?.as_str()
    }

    /// Whether the response carries the id its request did.
    pub(crate) fn id_matches(&self) -> bool {
        self.message.get("id") == Some(&Value::from(self.id))
    }

    /// Milliseconds from `origin` until this response arrived.
    pub(crate) fn received_ms(&self, origin: Instant) -> u128 {
        self.received.duration_since(origin).as_millis()
    }
}

enum Transport {
    Stdio(Box<LineClient>),
    Http(Box<HttpClient>),
}

/// A request on its way, for the checks that send a duplicate meanwhile.
pub(crate) struct Pending {
    id: u64,
    request: String,
    sent: Instant,
    http: Option<tokio::task::JoinHandle<anyhow::Result<HttpAnswer>>>,
}

/// A connection in a known era.
pub(crate) struct Session {
    transport: Transport,
    pub(crate) era: Era,
    next_id: u64,
    pub(crate) timeout: Duration,
}

impl Session {
    /// A stdio session over a started server (not yet in any era: see [`Self::set_era`]).
    pub(crate) fn stdio(client: LineClient, timeout: Duration) -> Self {
        Self {
            transport: Transport::Stdio(Box::new(client)),
            era: Era::Current,
            next_id: 1,
            timeout,
        }
    }

    pub(crate) fn http(client: HttpClient, timeout: Duration) -> Self {
        Self {
            transport: Transport::Http(Box::new(client)),
            era: Era::Current,
            next_id: 1,
            timeout,
        }
    }

    /// `server/discover`, as the first request of the current era.
    pub(crate) async fn discover(&mut self, wait: Duration) -> anyhow::Result<Reply> {
        let params = protocol::discover_params().to_string();
        self.request(protocol::DISCOVER, None, params, wait).await
    }

    /// The legacy handshake: `initialize`, then (if it succeeded) `notifications/initialized`;
    /// on success the session is in the legacy era.
    pub(crate) async fn initialize(&mut self, wait: Duration) -> anyhow::Result<Reply> {
        let params =
            protocol::initialize_params(protocol::V_2025_06_18, "mcp-idem-check").to_string();
        let pending = self.start(protocol::INITIALIZE, None, params).await?;
        let (reply, headers) = self.finish_with_headers(pending, wait).await?;
        if reply.message.get("result").is_none() {
            return Ok(reply);
        }
        let version = protocol::negotiated_version(&reply.message)
            .unwrap_or(protocol::V_2025_06_18)
            .to_owned();
        match &mut self.transport {
            Transport::Stdio(client) => client.notify(protocol::INITIALIZED, json!({})).await?,
            Transport::Http(client) => {
                let session = headers.and_then(|h| h.get("mcp-session-id").cloned());
                client.use_legacy_session(&version, session);
                client
                    .post(
                        None,
                        protocol::INITIALIZED,
                        None,
                        protocol::INITIALIZED_NOTIFICATION.into(),
                        wait,
                    )
                    .await?;
            }
        }
        self.era = Era::Legacy(version);
        Ok(reply)
    }

    /// The params of a `tools/call`: `arguments` is JSON text, written as is.
    pub(crate) fn tool_params(
        &self,
        tool: &str,
        arguments: &str,
        key: &Key,
        extra: &str,
    ) -> String {
        let mut params = String::from("{");
        let mut meta_members: Vec<String> = Vec::new();
        if self.era == Era::Current {
            meta_members.extend(meta_members_text());
        }
        meta_members.extend(key.meta_member());
        if self.era == Era::Current || !meta_members.is_empty() {
            params.push_str(&format!(r#""_meta":{{{}}},"#, meta_members.join(",")));
        }
        params.push_str(&format!(
            r#""name":{},"arguments":{arguments}"#,
            Value::from(tool)
        ));
        if let Some(key) = key.json() {
            params.push_str(&format!(r#","idempotencyKey":{key}"#));
        }
        params.push_str(extra);
        params.push('}');
        params
    }

    /// Calls `tool` and waits for the response.
    pub(crate) async fn call(
        &mut self,
        tool: &str,
        arguments: &str,
        key: &Key,
    ) -> anyhow::Result<Reply> {
        let params = self.tool_params(tool, arguments, key, "");
        let pending = self.start("tools/call", Some(tool), params).await?;
        self.finish(pending, self.timeout).await
    }

    /// Sends a request and returns at once.
    pub(crate) async fn start(
        &mut self,
        method: &str,
        tool: Option<&str>,
        params: String,
    ) -> anyhow::Result<Pending> {
        let sent = Instant::now();
        match &mut self.transport {
            Transport::Stdio(client) => {
                let (id, request) = client.send_raw_line(method, &params).await?;
                Ok(Pending {
                    id,
                    request,
                    sent,
                    http: None,
                })
            }
            Transport::Http(client) => {
                let id = self.next_id;
                self.next_id += 1;
                let request = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":{},"params":{params}}}"#,
                    Value::from(method)
                );
                let (client, body, method, tool) = (
                    client.clone(),
                    request.clone(),
                    method.to_owned(),
                    tool.map(str::to_owned),
                );
                // Long enough for any request; `finish` applies the caller's limit.
                let wait = self.timeout * 4;
                let task = tokio::spawn(async move {
                    client
                        .post(Some(id), &method, tool.as_deref(), body, wait)
                        .await
                });
                Ok(Pending {
                    id,
                    request,
                    sent,
                    http: Some(task),
                })
            }
        }
    }

    /// Waits up to `wait` for the response to `pending`.
    pub(crate) async fn finish(
        &mut self,
        pending: Pending,
        wait: Duration,
    ) -> anyhow::Result<Reply> {
        Ok(self.finish_with_headers(pending, wait).await?.0)
    }

    async fn finish_with_headers(
        &mut self,
        pending: Pending,
        wait: Duration,
    ) -> anyhow::Result<(Reply, Option<http::HeaderMap>)> {
        let Pending {
            id,
            request,
            sent,
            http,
        } = pending;
        match (&mut self.transport, http) {
            (Transport::Stdio(client), _) => {
                let (_, line) = client.response_raw(id, wait).await?;
                let reply = Reply::new(request, id, sent, line, Instant::now())?;
                Ok((reply, None))
            }
            (Transport::Http(_), Some(task)) => {
                let answer = tokio::time::timeout(wait, task)
                    .await
                    .with_context(|| format!("no response to request {id} within {wait:?}"))?
                    .context("the HTTP request task failed")??;
                let reply = Reply::new(request, id, sent, answer.text, answer.received)?;
                Ok((reply, Some(answer.headers)))
            }
            (Transport::Http(_), None) => anyhow::bail!("an HTTP request without its task"),
        }
    }

    /// A request answered within `wait`.
    async fn request(
        &mut self,
        method: &str,
        tool: Option<&str>,
        params: String,
        wait: Duration,
    ) -> anyhow::Result<Reply> {
        let pending = self.start(method, tool, params).await?;
        self.finish(pending, wait).await
    }

    /// Whether the server still answers (any answer to a `ping`, even an error).
    pub(crate) async fn ping(&mut self) -> bool {
        let params = match self.era {
            Era::Current => json!({"_meta": meta()}),
            Era::Legacy(_) => json!({}),
        };
        let wait = Duration::from_secs(3);
        self.request("ping", None, params.to_string(), wait)
            .await
            .is_ok()
    }

    /// Ends the session: closes a stdio server's input and lets it exit (or kills it).
    pub(crate) async fn close(self) {
        if let Transport::Stdio(client) = self.transport {
            // On failure the client is dropped, which kills the child.
            let _ = client.close().await;
        }
    }
}

/// The `_meta` every 2026-07-28 request carries.
fn meta() -> Value {
    protocol::request_meta()
}

/// The members of [`meta`] as JSON text, without the braces (`None` if it has none), so that a
/// `_meta` idempotency key can be written beside them.
fn meta_members_text() -> Option<String> {
    let text = meta().to_string();
    text.strip_prefix('{')
        .and_then(|rest| rest.strip_suffix('}'))
        .filter(|members| !members.is_empty())
        .map(str::to_owned)
}
