//! rmcp's Streamable HTTP transport on this crate's one HTTP client ([`crate::http_client`]):
//! [`RmcpHttpClient`] implements rmcp's `StreamableHttpClient`, so [`HttpConnector`] sessions
//! travel over the same hyper + rustls client, and trust the same certificates, as the bridge
//! and `mcp-idem proxy`.
//!
//! What it makes of each answer follows rmcp's own (reqwest) client: `202`/`204` accept,
//! a `401`/`403` with a challenge asks for authorization, `404` on a session means it expired,
//! `429` and `5xx` keep only their status (a JSON-RPC error in a `5xx` body is kept), a
//! legacy server's rejection of `server/discover` becomes a JSON-RPC error the handshake falls
//! back on, and bodies are read within rmcp's size limits. Redirects are not followed.
//!
//! [`HttpConnector`]: super::HttpConnector

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use http::header::{
    ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use rmcp::model::ServerJsonRpcMessage;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ErrorData, JsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, HttpStatusError, InsufficientScopeError, SseError, StreamableHttpClient,
    StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::Sse;

use crate::http_client::{error_causes, https_client, HttpsClient, TlsSetupError};
use crate::sse::EventSplitter;

/// `Mcp-Session-Id`.
const SESSION_ID: &str = "mcp-session-id";
/// `Last-Event-Id`.
const LAST_EVENT_ID: &str = "last-event-id";
/// What every request accepts.
const ACCEPTED_TYPES: &str = "text/event-stream, application/json";
/// Custom headers the transport sets itself (`MCP-Protocol-Version` is the worker's, and may
/// pass).
const RESERVED_HEADERS: [&str; 3] = ["accept", SESSION_ID, LAST_EVENT_ID];
/// Longest `Retry-After` value kept, as rmcp keeps it.
const MAX_RETRY_AFTER_BYTES: usize = 128;

type HttpResult<T> = Result<T, StreamableHttpError<RmcpHttpError>>;

/// This crate's HTTP client as rmcp's Streamable HTTP client:
/// `StreamableHttpClientTransport::with_client(RmcpHttpClient::new(None)?, config)`.
#[derive(Clone, Debug)]
pub struct RmcpHttpClient {
    client: HttpsClient,
}

/// What went wrong on the wire, with its causes (a refused connection, an unknown certificate
/// issuer).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RmcpHttpError {
    /// The request got no answer's head.
    #[error("{}", error_causes(.0))]
    Request(#[source] hyper_util::client::legacy::Error),
    /// The answer's body broke off.
    #[error("the answer broke off: {0}")]
    Body(#[source] hyper::Error),
    /// The request could not be built (a header value).
    #[error("cannot build the request: {0}")]
    Build(#[from] http::Error),
    /// The message could not be written as JSON.
    #[error("cannot write the message: {0}")]
    Json(#[from] serde_json::Error),
}

impl RmcpHttpClient {
    /// A client trusting the system's roots and the certificates in `ca_file`, if given.
    pub fn new(ca_file: Option<&Path>) -> Result<Self, TlsSetupError> {
        Ok(Self::from_client(https_client(ca_file)?))
    }

    /// The client on an HTTP client built by [`https_client`].
    pub fn from_client(client: HttpsClient) -> Self {
        Self { client }
    }

    /// The underlying HTTP client.
    pub fn http(&self) -> &HttpsClient {
        &self.client
    }

    /// A request to `uri` with the headers every request carries.
    fn builder(
        method: Method,
        uri: &str,
        session_id: Option<&str>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<http::request::Builder> {
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(token) = auth_token {
            builder = builder.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        for (name, value) in custom_headers {
            if RESERVED_HEADERS
                .iter()
                .any(|reserved| name.as_str().eq_ignore_ascii_case(reserved))
            {
                return Err(StreamableHttpError::ReservedHeaderConflict(
                    name.to_string(),
                ));
            }
            builder = builder.header(name, value);
        }
        if let Some(session_id) = session_id {
            builder = builder.header(SESSION_ID, session_id);
        }
        Ok(builder)
    }

    async fn send(
        &self,
        builder: http::request::Builder,
        body: Bytes,
    ) -> HttpResult<Response<Incoming>> {
        let request = builder
            .body(Full::new(body))
            .map_err(|e| StreamableHttpError::Client(e.into()))?;
        self.client
            .request(request)
            .await
            .map_err(|e| StreamableHttpError::Client(RmcpHttpError::Request(e)))
    }
}

impl StreamableHttpClient for RmcpHttpClient {
    type Error = RmcpHttpError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<StreamableHttpPostResponse> {
        let limits = StreamableHttpResponseLimits::default();
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_token,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> HttpResult<StreamableHttpPostResponse> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_token,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> HttpResult<StreamableHttpPostResponse> {
        let session_was_attached = session_id.is_some();
        let body =
            serde_json::to_vec(&message).map_err(|e| StreamableHttpError::Client(e.into()))?;
        let builder = Self::builder(
            Method::POST,
            &uri,
            session_id.as_deref(),
            auth_token,
            custom_headers,
        )?
        .header(ACCEPT, ACCEPTED_TYPES)
        .header(CONTENT_TYPE, "application/json");
        let response = self.send(builder, Bytes::from(body)).await?;
        let status = response.status();
        authorization_failure(status, response.headers())?;
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && session_was_attached {
            return Err(StreamableHttpError::SessionExpired);
        }
        let content_type = response.headers().get(CONTENT_TYPE).cloned();
        let is_json = is_media_type(content_type.as_ref(), "application/json");
        // Rate limits and non-JSON failures keep only their status; a JSON `5xx` may hold the
        // JSON-RPC error.
        let status_error = match (http_status_error(status, response.headers()), is_json) {
            (Some(error), is_json) if !is_json || status == StatusCode::TOO_MANY_REQUESTS => {
                return Err(error.into())
            }
            (error, _) => error,
        };
        let content_length = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let answer_session = response
            .headers()
            .get(SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // A notification or a response awaits no answer: nothing in the body matters.
        let awaits_no_response = !matches!(message, JsonRpcMessage::Request(_));
        if status.is_success() && content_length == Some(0) && awaits_no_response {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        let body = response.into_body();
        if !status.is_success() {
            let is_auth_failure =
                matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
            let text = if is_json && !is_auth_failure {
                match read_bounded(body, content_length, limits.max_json_response_size).await {
                    Ok(bytes) => {
                        let text = String::from_utf8_lossy(&bytes).into_owned();
                        if let Ok(error @ JsonRpcMessage::Error(_)) =
                            serde_json::from_str::<ServerJsonRpcMessage>(&text)
                        {
                            if let Some(response) =
                                discover_rejection(&message, session_was_attached, status, &text)
                            {
                                return Ok(response);
                            }
                            return Ok(StreamableHttpPostResponse::Json(error, answer_session));
                        }
                        tracing::warn!("HTTP {status}: the JSON body is no JSON-RPC error");
                        truncate(text, limits.max_error_response_size)
                    }
                    Err(error @ StreamableHttpError::ResponseBodyTooLarge { .. }) => {
                        return Err(status_error.map(StreamableHttpError::from).unwrap_or(error))
                    }
                    Err(StreamableHttpError::Client(_)) => String::new(),
                    Err(error) => return Err(error),
                }
            } else {
                let prefix = read_prefix(body, limits.max_error_response_size).await;
                String::from_utf8_lossy(&prefix).into_owned()
            };
            if let Some(response) =
                discover_rejection(&message, session_was_attached, status, &text)
            {
                return Ok(response);
            }
            if let Some(error) = status_error {
                return Err(error.into());
            }
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("HTTP {status}: {text}"),
            )));
        }
        if is_media_type(content_type.as_ref(), "text/event-stream") {
            return Ok(StreamableHttpPostResponse::Sse(
                event_stream(body, limits.max_sse_event_size),
                answer_session,
            ));
        }
        if is_json {
            let bytes = read_bounded(body, content_length, limits.max_json_response_size).await?;
            return match serde_json::from_slice::<ServerJsonRpcMessage>(&bytes) {
                Ok(parsed) => Ok(StreamableHttpPostResponse::Json(parsed, answer_session)),
                Err(error) if awaits_no_response => {
                    tracing::warn!(%error, "an unreadable JSON answer to a notification; taken as accepted");
                    Ok(StreamableHttpPostResponse::Accepted)
                }
                Err(error) => Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                    format!(
                        "the answer is no JSON-RPC message: {error}: {}",
                        truncate(String::from_utf8_lossy(&bytes).into_owned(), 256)
                    ),
                ))),
            };
        }
        if awaits_no_response {
            tracing::warn!(
                ?content_type,
                "an answer of an unexpected type to a notification; taken as accepted"
            );
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        Err(StreamableHttpError::UnexpectedContentType(
            content_type.map(|ct| String::from_utf8_lossy(ct.as_bytes()).into_owned()),
        ))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<()> {
        let builder = Self::builder(
            Method::DELETE,
            &uri,
            Some(&session_id),
            auth_token,
            custom_headers,
        )?;
        let response = self.send(builder, Bytes::new()).await?;
        let status = response.status();
        if status == StatusCode::METHOD_NOT_ALLOWED {
            tracing::debug!("the server does not delete sessions");
            return Ok(());
        }
        if !status.is_success() {
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("deleting the session: HTTP {status}"),
            )));
        }
        Ok(())
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<BoxStream<'static, Result<Sse, SseError>>> {
        let limits = StreamableHttpResponseLimits::default();
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_token,
            custom_headers,
            limits.max_sse_event_size,
        )
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_token: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> HttpResult<BoxStream<'static, Result<Sse, SseError>>> {
        let mut builder = Self::builder(
            Method::GET,
            &uri,
            session_id.as_deref(),
            auth_token,
            custom_headers,
        )?
        .header(ACCEPT, ACCEPTED_TYPES);
        if let Some(last_event_id) = last_event_id {
            builder = builder.header(LAST_EVENT_ID, last_event_id);
        }
        let response = self.send(builder, Bytes::new()).await?;
        let status = response.status();
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        authorization_failure(status, response.headers())?;
        if let Some(error) = http_status_error(status, response.headers()) {
            return Err(error.into());
        }
        if !status.is_success() {
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("opening the event stream: HTTP {status}"),
            )));
        }
        let content_type = response.headers().get(CONTENT_TYPE);
        if !is_media_type(content_type, "text/event-stream")
            && !is_media_type(content_type, "application/json")
        {
            return Err(StreamableHttpError::UnexpectedContentType(
                content_type.map(|ct| String::from_utf8_lossy(ct.as_bytes()).into_owned()),
            ));
        }
        Ok(event_stream(response.into_body(), max_sse_event_size))
    }
}

/// Whether a `Content-Type` is `expected`, whatever its case and parameters.
fn is_media_type(content_type: Option<&HeaderValue>, expected: &str) -> bool {
    content_type
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case(expected))
}

/// A `401` or `403` with a `WWW-Authenticate` challenge, as rmcp's errors.
fn authorization_failure(status: StatusCode, headers: &HeaderMap) -> HttpResult<()> {
    let Some(challenge) = headers.get(WWW_AUTHENTICATE) else {
        return Ok(());
    };
    if !matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
        return Ok(());
    }
    let challenge = challenge.to_str().map_err(|_| {
        StreamableHttpError::UnexpectedServerResponse(
            "invalid www-authenticate header value".into(),
        )
    })?;
    if status == StatusCode::UNAUTHORIZED {
        return Err(StreamableHttpError::AuthRequired(AuthRequiredError::new(
            challenge.to_owned(),
        )));
    }
    Err(StreamableHttpError::InsufficientScope(
        InsufficientScopeError::new(challenge.to_owned(), scope_of(challenge)),
    ))
}

/// The `scope=` parameter of a `WWW-Authenticate` challenge, quoted or not.
fn scope_of(challenge: &str) -> Option<String> {
    let start = challenge.to_ascii_lowercase().find("scope=")? + "scope=".len();
    let value = &challenge[start..];
    let scope = match value.strip_prefix('"') {
        Some(quoted) => &quoted[..quoted.find('"')?],
        None => {
            let end = value
                .find(|c: char| c == ',' || c == ';' || c.is_whitespace())
                .unwrap_or(value.len());
            &value[..end]
        }
    };
    (!scope.is_empty()).then(|| scope.to_owned())
}

/// `429` and `5xx` as status metadata (with a short `Retry-After`), as rmcp reports them.
fn http_status_error(status: StatusCode, headers: &HeaderMap) -> Option<HttpStatusError> {
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let retry_after = headers
        .get(RETRY_AFTER)
        .filter(|value| value.as_bytes().len() <= MAX_RETRY_AFTER_BYTES)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    Some(HttpStatusError::new(status.as_u16(), retry_after))
}

/// A legacy server's `4xx` to a session-less `server/discover`, as a JSON-RPC error under the
/// request's id, which rmcp's handshake reads as "fall back to `initialize`". The server's own
/// error is kept when the body has one.
fn discover_rejection(
    message: &ClientJsonRpcMessage,
    session_was_attached: bool,
    status: StatusCode,
    body: &str,
) -> Option<StreamableHttpPostResponse> {
    if session_was_attached
        || !status.is_client_error()
        || matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
    {
        return None;
    }
    let JsonRpcMessage::Request(request) = message else {
        return None;
    };
    if !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return None;
    }
    let error = match serde_json::from_str::<ServerJsonRpcMessage>(body) {
        Ok(JsonRpcMessage::Error(error)) => error.error,
        _ => ErrorData::invalid_request(
            format!("server/discover rejected with HTTP {status}: {body}"),
            None,
        ),
    };
    Some(StreamableHttpPostResponse::Json(
        ServerJsonRpcMessage::error(error, Some(request.id.clone())),
        None,
    ))
}

/// The whole body, refused past `max_size` bytes.
async fn read_bounded(
    mut body: Incoming,
    content_length: Option<u64>,
    max_size: usize,
) -> HttpResult<Vec<u8>> {
    let too_large = StreamableHttpError::ResponseBodyTooLarge { max_size };
    if content_length.is_some_and(|length| length > max_size as u64) {
        return Err(too_large);
    }
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| StreamableHttpError::Client(RmcpHttpError::Body(e)))?;
        if let Ok(data) = frame.into_data() {
            if data.len() > max_size - bytes.len() {
                return Err(too_large);
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}

/// At most `max_size` bytes of the body, for a diagnostic; what was read if it breaks off.
async fn read_prefix(mut body: Incoming, max_size: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    while bytes.len() < max_size {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let room = max_size - bytes.len();
                    bytes.extend_from_slice(&data[..data.len().min(room)]);
                }
            }
            _ => break,
        }
    }
    bytes
}

/// `text` cut to at most `max_bytes`, on a character boundary.
fn truncate(mut text: String, max_bytes: usize) -> String {
    if text.len() > max_bytes {
        let mut end = max_bytes;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// The events of an SSE body, cut by the crate's [`EventSplitter`]; an event larger than
/// `max_event_size` ends the stream with an error.
fn event_stream(
    body: Incoming,
    max_event_size: usize,
) -> BoxStream<'static, Result<Sse, SseError>> {
    struct State {
        body: Incoming,
        splitter: EventSplitter,
        events: VecDeque<Sse>,
        /// The error that ends the stream once the events before it are out.
        failure: Option<SseError>,
        ended: bool,
    }
    let state = State {
        body,
        splitter: EventSplitter::new(max_event_size),
        events: VecDeque::new(),
        failure: None,
        ended: false,
    };
    stream::unfold(state, move |mut state| async move {
        loop {
            if let Some(event) = state.events.pop_front() {
                return Some((Ok(event), state));
            }
            if let Some(failure) = state.failure.take() {
                state.ended = true;
                return Some((Err(failure), state));
            }
            if state.ended {
                return None;
            }
            let fed = match state.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => state.splitter.feed(&data),
                    Err(_) => continue,
                },
                Some(Err(error)) => {
                    state.failure = Some(SseError::Body(Box::new(error)));
                    continue;
                }
                None => {
                    state.ended = true;
                    state.splitter.finish()
                }
            };
            state
                .events
                .extend(fed.events.into_iter().filter_map(|event| {
                    let sse = Sse {
                        event: event.event,
                        data: event.data,
                        id: event.id,
                        retry: event.retry,
                    };
                    // A comment-only event carries nothing.
                    let empty = sse.event.is_none()
                        && sse.data.is_none()
                        && sse.id.is_none()
                        && sse.retry.is_none();
                    (!empty).then_some(sse)
                }));
            if state.splitter.overflowed() {
                state.failure = Some(SseError::Body(
                    format!("an event of the stream is larger than {max_event_size} bytes").into(),
                ));
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_and_scopes_are_read() {
        let json = HeaderValue::from_static("Application/JSON; charset=utf-8");
        assert!(is_media_type(Some(&json), "application/json"));
        assert!(!is_media_type(Some(&json), "text/event-stream"));
        assert!(!is_media_type(None, "application/json"));
        assert_eq!(
            scope_of(r#"Bearer scope="files:read files:write", error="x""#).as_deref(),
            Some("files:read files:write")
        );
        assert_eq!(
            scope_of("Bearer scope=read:data, x=y").as_deref(),
            Some("read:data")
        );
        assert_eq!(scope_of("Bearer realm=x"), None);
    }

    #[test]
    fn only_rate_limits_and_server_errors_keep_their_status() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        let error = http_status_error(StatusCode::TOO_MANY_REQUESTS, &headers).unwrap();
        assert_eq!(
            (error.status, error.retry_after.as_deref()),
            (429, Some("3"))
        );
        assert!(http_status_error(StatusCode::BAD_GATEWAY, &HeaderMap::new()).is_some());
        assert!(http_status_error(StatusCode::BAD_REQUEST, &HeaderMap::new()).is_none());
    }

    #[test]
    fn reserved_headers_are_refused() {
        let mut headers = HashMap::new();
        headers.insert(
            HeaderName::from_static("accept"),
            HeaderValue::from_static("text/plain"),
        );
        let refused = RmcpHttpClient::builder(Method::GET, "http://h/mcp", None, None, headers);
        assert!(matches!(
            refused,
            Err(StreamableHttpError::ReservedHeaderConflict(_))
        ));
        let mut headers = HashMap::new();
        headers.insert(
            HeaderName::from_static("mcp-protocol-version"),
            HeaderValue::from_static("2025-11-25"),
        );
        assert!(RmcpHttpClient::builder(Method::GET, "http://h/mcp", None, None, headers).is_ok());
    }
}
