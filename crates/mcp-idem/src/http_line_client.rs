//! A raw Streamable HTTP client (of `check --url`, and of `proxy`'s own `server/discover` to its
//! upstream): POSTs one JSON-RPC message, exactly as written, and returns the response message
//! exactly as received, from a plain JSON body or from the SSE event carrying it. It runs on the library's one HTTP client ([`mcp_idempotency::http_client`]: http and
//! https, the system's roots plus `--ca-cert`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use http::{HeaderMap, Uri};
use http_body_util::{BodyExt, Full};
use mcp_idempotency::http_client::{error_causes, https_client, HttpsClient};

use mcp_idempotency::protocol;

use crate::shown::abridge;

/// One MCP endpoint; cheap to clone (the connection pool is shared).
#[derive(Clone)]
pub(crate) struct HttpClient {
    client: HttpsClient,
    url: Uri,
    authority: String,
    /// `--header` values, sent on every request.
    headers: Vec<(HeaderName, HeaderValue)>,
    /// `MCP-Protocol-Version` for every request but `initialize`.
    protocol_version: String,
    /// `Mcp-Session-Id` a legacy server assigned at `initialize`.
    session: Option<HeaderValue>,
}

/// What a POST brought back.
pub(crate) struct HttpAnswer {
    /// The JSON-RPC response, as received (one SSE event's data for an event stream).
    pub(crate) text: String,
    pub(crate) headers: HeaderMap,
    /// When the response was complete.
    pub(crate) received: Instant,
}

impl HttpClient {
    /// A client for `url` (`http://` or `https://HOST:PORT/PATH`); `headers` are `Name: value`
    /// strings; `ca_cert` a PEM file of CAs trusted besides the system's.
    pub(crate) fn new(
        url: &str,
        headers: &[String],
        ca_cert: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let uri: Uri = url
            .parse()
            .with_context(|| format!("invalid URL {url:?}"))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => bail!("the URL must start with http:// or https://, got {url:?}"),
        }
        let authority = uri
            .authority()
            .with_context(|| format!("no host in {url:?}"))?
            .to_string();
        let headers = headers
            .iter()
            .map(|header| parse_header(header))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            client: https_client(ca_cert)?,
            url: uri,
            authority,
            headers,
            protocol_version: protocol::V_2026_07_28.to_owned(),
            session: None,
        })
    }

    /// Switches to a legacy session: this protocol version, and the session id if any.
    pub(crate) fn use_legacy_session(&mut self, version: &str, session: Option<HeaderValue>) {
        self.protocol_version = version.to_owned();
        self.session = session;
    }

    /// POSTs `body` (a request with this `id`, or a notification if `id` is `None`) and returns
    /// the response to `id`; for a notification, an empty answer.
    pub(crate) async fn post(
        &self,
        id: Option<u64>,
        method: &str,
        tool: Option<&str>,
        body: String,
        wait: Duration,
    ) -> anyhow::Result<HttpAnswer> {
        let mut request = http::Request::post(self.url.clone())
            .header(HOST, &self.authority)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json, text/event-stream")
            .header("mcp-method", method);
        if method != protocol::INITIALIZE {
            request = request.header("mcp-protocol-version", &self.protocol_version);
        }
        if let Some(tool) = tool {
            request = request.header("mcp-name", tool);
        }
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .context("cannot build the HTTP request")?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|error| {
                anyhow::anyhow!("POST {} failed: {}", self.url, error_causes(&error))
            })?;
            let status = response.status();
            let (parts, mut body) = response.into_parts();
            let sse = parts
                .headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let mut received = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.context("the response body broke off")?;
                if let Some(data) = frame.data_ref() {
                    received.extend_from_slice(data);
                }
                // An event stream may stay open after the response: stop once it is here.
                if sse && id.is_some_and(|id| sse_response(&received, id).is_some()) {
                    break;
                }
            }
            let text = String::from_utf8_lossy(&received).into_owned();
            let Some(id) = id else {
                return Ok(HttpAnswer {
                    text,
                    headers: parts.headers,
                    received: Instant::now(),
                });
            };
            let message = if sse {
                sse_response(&received, id)
            } else {
                Some(text.trim().to_owned()).filter(|t| t.starts_with('{'))
            };
            match message {
                Some(text) => Ok(HttpAnswer {
                    text,
                    headers: parts.headers,
                    received: Instant::now(),
                }),
                None => Err(NotJsonRpc {
                    status,
                    body: abridge(&text, 300),
                }
                .into()),
            }
        };
        tokio::time::timeout(wait, exchange)
            .await
            .with_context(|| format!("no answer from {} within {wait:?}", self.url))?
    }

    /// Ends a legacy session: `DELETE` with its `Mcp-Session-Id`, as a client leaving it does.
    pub(crate) async fn end_session(&self, session: &HeaderValue, wait: Duration) {
        let request = http::Request::delete(self.url.clone())
            .header(HOST, &self.authority)
            .header("mcp-session-id", session)
            .body(Full::new(Bytes::new()));
        let Ok(request) = request else { return };
        match tokio::time::timeout(wait, self.client.request(request)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::debug!(error = %error_causes(&error), "cannot end the session");
            }
            Err(_) => tracing::debug!("no answer to the DELETE that ends the session"),
        }
    }
}

/// An HTTP answer that carried no JSON-RPC response (an error status, mostly).
#[derive(Debug, thiserror::Error)]
#[error("HTTP {status} without a JSON-RPC response: {body}")]
pub(crate) struct NotJsonRpc {
    /// The status.
    pub(crate) status: http::StatusCode,
    /// The body, abridged.
    body: String,
}

/// `Name: value` as a header.
fn parse_header(header: &str) -> anyhow::Result<(HeaderName, HeaderValue)> {
    let (name, value) = header
        .split_once(':')
        .with_context(|| format!("--header {header:?} is not `Name: value`"))?;
    let name = HeaderName::try_from(name.trim())
        .with_context(|| format!("invalid header name in {header:?}"))?;
    let value = HeaderValue::try_from(value.trim())
        .with_context(|| format!("invalid header value in {header:?}"))?;
    Ok((name, value))
}

/// The data of the first SSE event in `stream` that is the response to request `id`.
fn sse_response(stream: &[u8], id: u64) -> Option<String> {
    mcp_idempotency::jsonrpc::sse_response(stream, Some(&id.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_response_event_among_others() {
        let stream = "id: 1\ndata:\n\n\
            data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n\
            data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"a\":1}}\n\n";
        assert_eq!(
            sse_response(stream.as_bytes(), 7).as_deref(),
            Some("{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"a\":1}}")
        );
        assert_eq!(sse_response(stream.as_bytes(), 8), None);
        // The final event is not complete until its blank line.
        assert_eq!(
            sse_response(b"data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\"", 7),
            None
        );
    }

    #[test]
    fn headers_and_urls_are_validated() {
        assert!(parse_header("Authorization: Bearer x").is_ok());
        assert!(parse_header("no colon").is_err());
        assert!(HttpClient::new("ftp://example.com/mcp", &[], None).is_err());
        assert!(HttpClient::new("http://127.0.0.1:1/mcp", &["X-A: b".into()], None).is_ok());
        assert!(HttpClient::new("https://example.com/mcp", &[], None).is_ok());
        let missing = Path::new("/nonexistent/ca.pem");
        assert!(HttpClient::new("https://example.com/mcp", &[], Some(missing)).is_err());
    }
}
