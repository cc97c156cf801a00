//! One HTTP exchange with the server: a POST of one message (or the GET stream, or the DELETE of
//! a session), and the JSON-RPC messages of its answer, plain JSON or an SSE stream, one at a
//! time as they arrive.

use std::collections::VecDeque;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;

use crate::http_client::error_causes as causes;
use crate::http_client::HttpsClient;
use crate::jsonrpc::MAX_SERVER_MESSAGE_BYTES;
use crate::sse::EventSplitter;

/// `Mcp-Session-Id`.
pub(crate) const SESSION_ID: &str = "mcp-session-id";

/// The server's endpoint and the headers every request carries.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    client: HttpsClient,
    uri: Uri,
    headers: HeaderMap,
}

/// A request that did not get an answer's head. Its message names every cause (hyper's own
/// message alone, "client error (SendRequest)", would not say what happened).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// No connection could be made: the server did not get the request.
    #[error("cannot connect: {}", causes(.0))]
    NotSent(#[source] hyper_util::client::legacy::Error),
    /// The connection failed after the request was (perhaps) sent.
    #[error("the connection failed: {}", causes(.0))]
    Failed(#[source] hyper_util::client::legacy::Error),
    /// The request could not be built (a header value the client gave).
    #[error("cannot build the request: {0}")]
    Build(#[from] http::Error),
}

impl SendError {
    fn of(error: hyper_util::client::legacy::Error) -> Self {
        if error.is_connect() {
            Self::NotSent(error)
        } else {
            Self::Failed(error)
        }
    }
}

/// An answer's body broke off or could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ReadError(String);

impl Endpoint {
    pub(crate) fn new(client: HttpsClient, uri: Uri, headers: HeaderMap) -> Self {
        Self {
            client,
            uri,
            headers,
        }
    }

    pub(crate) fn uri(&self) -> &Uri {
        &self.uri
    }

    fn request(
        &self,
        method: Method,
        extra: &[(&'static str, String)],
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>, SendError> {
        let mut request = Request::builder().method(method).uri(self.uri.clone());
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        for (name, value) in extra {
            let value = HeaderValue::try_from(value).map_err(http::Error::from)?;
            request = request.header(HeaderName::from_static(name), value);
        }
        Ok(request.body(Full::new(body))?)
    }

    /// POSTs one JSON-RPC message with the `extra` headers.
    pub(crate) async fn post(
        &self,
        message: &str,
        extra: &[(&'static str, String)],
    ) -> Result<Answer, SendError> {
        let mut request = self.request(Method::POST, extra, Bytes::from(message.to_owned()))?;
        let headers = request.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        let response = self.client.request(request).await.map_err(SendError::of)?;
        Ok(Answer::new(response))
    }

    /// Opens the server's GET stream for its own messages (legacy sessions).
    pub(crate) async fn get_stream(
        &self,
        extra: &[(&'static str, String)],
    ) -> Result<Answer, SendError> {
        let mut request = self.request(Method::GET, extra, Bytes::new())?;
        request
            .headers_mut()
            .insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        let response = self.client.request(request).await.map_err(SendError::of)?;
        Ok(Answer::new(response))
    }

    /// Ends a legacy session, as a client does when it leaves; failures are only logged.
    pub(crate) async fn delete(&self, extra: &[(&'static str, String)]) {
        let sent = match self.request(Method::DELETE, extra, Bytes::new()) {
            Ok(request) => self.client.request(request).await.map_err(SendError::of),
            Err(error) => Err(error),
        };
        match sent {
            Ok(response) => tracing::debug!(status = %response.status(), "session deleted"),
            Err(error) => tracing::debug!(%error, "cannot delete the session"),
        }
    }
}

/// An answer: its status, headers, and the messages of its body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    body: Body,
}

#[derive(Debug)]
enum Body {
    Json(Option<Incoming>),
    Sse {
        body: Incoming,
        splitter: EventSplitter,
        queue: VecDeque<String>,
        ended: bool,
    },
}

impl Answer {
    fn new(response: http::Response<Incoming>) -> Self {
        let (parts, body) = response.into_parts();
        let sse = parts
            .headers
            .get(CONTENT_TYPE)
            .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"));
        let body = if sse {
            Body::Sse {
                body,
                splitter: EventSplitter::new(MAX_SERVER_MESSAGE_BYTES),
                queue: VecDeque::new(),
                ended: false,
            }
        } else {
            Body::Json(Some(body))
        };
        Self {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// Whether the body is an SSE stream.
    pub(crate) fn is_sse(&self) -> bool {
        matches!(self.body, Body::Sse { .. })
    }

    /// A header's value, if it is text.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The next message of the body: the whole body once for plain JSON (`None` after it, or for
    /// an empty body), each event's data for SSE. `Err` when the body breaks off, or an SSE
    /// event is too large.
    pub(crate) async fn next_message(&mut self) -> Result<Option<String>, ReadError> {
        match &mut self.body {
            Body::Json(body) => {
                let Some(body) = body.take() else {
                    return Ok(None);
                };
                let bytes = Limited::new(body, MAX_SERVER_MESSAGE_BYTES)
                    .collect()
                    .await
                    .map_err(|e| ReadError(format!("the answer broke off: {e}")))?
                    .to_bytes();
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                String::from_utf8(bytes.to_vec())
                    .map(Some)
                    .map_err(|_| ReadError("the answer is not UTF-8".into()))
            }
            Body::Sse {
                body,
                splitter,
                queue,
                ended,
            } => loop {
                if let Some(message) = queue.pop_front() {
                    return Ok(Some(message));
                }
                if *ended {
                    return Ok(None);
                }
                let fed = match body.frame().await {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => splitter.feed(&data),
                        Err(_) => continue,
                    },
                    Some(Err(error)) => {
                        return Err(ReadError(format!("the event stream broke off: {error}")))
                    }
                    None => {
                        *ended = true;
                        splitter.finish()
                    }
                };
                if splitter.overflowed() {
                    return Err(ReadError(format!(
                        "an event of the stream is larger than {MAX_SERVER_MESSAGE_BYTES} bytes"
                    )));
                }
                queue.extend(
                    fed.events
                        .into_iter()
                        .filter_map(|event| event.data)
                        .filter(|data| !data.trim().is_empty()),
                );
            },
        }
    }
}
