//! The response future of [`IdempotencyService`](super::IdempotencyService): one request, from
//! its body to the answer (passed through, answered here, or relayed from the upstream).

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_LENGTH, WWW_AUTHENTICATE};
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use tower_service::Service;

use super::body::{json_response, BoxError, ResponseBody};
use super::principal::ScopeBy;
use super::relay::{self, Exchange};
use super::shutdown::Shutdown;
use crate::default_scope::{LearnedNamespace, SERVER_NAME_TIMEOUT};
use crate::interceptor::{ClientAction, Decided, Interceptor, InterceptorConfig};
use crate::jsonrpc::{error_response, INVALID_REQUEST};
use crate::record::Scope;
use crate::Deduplicator;

/// The future of an [`IdempotencyService`](super::IdempotencyService)'s response.
pub(super) type ResponseFuture<E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, E>> + Send>>;

/// What every response future of a layer's services reads: the layer's settings and its
/// deduplicator and shutdown.
#[derive(Clone, Debug)]
pub(super) struct Shared {
    pub(super) dedup: Deduplicator,
    pub(super) namespace: Namespace,
    pub(super) scope_by: ScopeBy,
    pub(super) interceptor: InterceptorConfig,
    pub(super) max_body_bytes: usize,
    pub(super) body_timeout: Duration,
    pub(super) shutdown: Shutdown,
}

/// The namespace a layer's calls are decided under.
#[derive(Clone, Debug)]
pub(super) enum Namespace {
    /// Set when the layer was built.
    Fixed(Arc<str>),
    /// Learned after the start (the proxy's upstream's name): a call waits for it, up to
    /// [`SERVER_NAME_TIMEOUT`].
    Learned(LearnedNamespace),
}

impl Namespace {
    /// The namespace to decide a call under now; `None` if it was not learned in time.
    async fn now(&self) -> Option<Arc<str>> {
        match self {
            Self::Fixed(namespace) => Some(Arc::clone(namespace)),
            Self::Learned(learned) => learned.wait(SERVER_NAME_TIMEOUT).await,
        }
    }
}

/// Handles one request: the work of its [`ResponseFuture`].
pub(super) async fn handle<S, ReqBody, ResBody>(
    shared: Arc<Shared>,
    mut inner: S,
    request: Request<ReqBody>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display + Send + 'static,
    ReqBody: Body + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    let mut read = pin!(Limited::new(body, shared.max_body_bytes).collect());
    // A small body usually came with the head: only one still arriving needs a timer.
    let read = match poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await {
        Poll::Ready(read) => read,
        Poll::Pending => match tokio::time::timeout(shared.body_timeout, read).await {
            Ok(read) => read,
            Err(_) => {
                return Ok(plain_error(
                    StatusCode::REQUEST_TIMEOUT,
                    &format!(
                        "the request body did not arrive within {} ms",
                        shared.body_timeout.as_millis()
                    ),
                ))
            }
        },
    };
    let bytes = match read {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            return Ok(plain_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("request body larger than {} bytes", shared.max_body_bytes),
            ));
        }
        Err(err) => {
            tracing::debug!(error = %err, "cannot read the request body");
            return Ok(plain_error(
                StatusCode::BAD_REQUEST,
                "the request body could not be read",
            ));
        }
    };
    let message = match std::str::from_utf8(&bytes) {
        Ok(text) if parts.method == Method::POST => text,
        _ => return pass_through(&mut inner, parts, bytes).await,
    };

    let mut interceptor = Interceptor::new(shared.interceptor.clone());
    interceptor.set_store_usable(shared.dedup.store_usable());
    if crate::call_span::CallSpan::wanted() {
        interceptor.set_transport(transport_trace(&parts.headers));
    }
    let call = match interceptor.on_client_message(message) {
        ClientAction::Forward if interceptor.awaits_discovery_result() => {
            let request = Request::from_parts(parts, Full::new(bytes));
            return Ok(relay::start(
                Exchange {
                    interceptor,
                    request_id: "null".into(),
                    call: None,
                },
                inner.call(request),
            )
            .await);
        }
        ClientAction::Forward => return pass_through(&mut inner, parts, bytes).await,
        ClientAction::Respond(response) => return Ok(json_response(StatusCode::OK, response)),
        // Only possible for a cancellation of a call in flight on the same interceptor (alone or
        // in a batch), and each POST has an interceptor of its own: cancellations pass through.
        ClientAction::Absorb | ClientAction::RecordThenForward(..) => {
            return pass_through(&mut inner, parts, bytes).await
        }
        ClientAction::ForwardTraced { id, message } => {
            let request_id = id.as_json().to_owned();
            return Ok(forward(inner, parts, interceptor, &id, message, request_id, None).await);
        }
        ClientAction::Decide(call) => call,
    };

    let principal = match shared.scope_by.principal(&parts.headers, SystemTime::now()) {
        Ok(principal) => principal,
        Err(unauthorized) => {
            let mut response = json_response(
                StatusCode::UNAUTHORIZED,
                error_response(call.id().as_json(), INVALID_REQUEST, unauthorized.reason()),
            );
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, unauthorized.www_authenticate());
            return Ok(response);
        }
    };
    let Some(namespace) = shared.namespace.now().await else {
        return Ok(match interceptor.refuse_unnamed(call) {
            Decided::Respond(response) | Decided::Forward(response) => {
                json_response(StatusCode::OK, response)
            }
        });
    };
    let scope = Scope::new(namespace, Arc::<str>::from(principal));
    let counted = shared.shutdown.enter();
    let decision = shared
        .dedup
        .begin_guarded(&scope, &call.tool_call(), call.span(), &counted)
        .await;
    let request_id = call.id().as_json().to_owned();
    let id = call.id().clone();
    match interceptor.on_decision(call, decision) {
        Decided::Respond(response) => Ok(json_response(StatusCode::OK, response)),
        Decided::Forward(message) if interceptor.has_calls_in_flight() => {
            Ok(forward(inner, parts, interceptor, &id, message, request_id, counted).await)
        }
        Decided::Forward(message) => {
            set_body_length(&mut parts, message.len());
            pass_through(&mut inner, parts, Bytes::from(message)).await
        }
    }
}

/// Sends `message` (the call `id`) upstream and relays the answer through the interceptor, which
/// waits for it (a claimed call, or a traced one); the `traceparent` header says what `_meta`
/// says, so that the upstream's span is a child of mcp-idem's.
async fn forward<S, ResBody>(
    mut inner: S,
    mut parts: http::request::Parts,
    interceptor: Interceptor<crate::RunningClaim>,
    id: &crate::interceptor::RequestId,
    message: String,
    request_id: String,
    call: Option<super::shutdown::CallGuard>,
) -> Response<ResponseBody>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display + Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    set_body_length(&mut parts, message.len());
    if let Some(traceparent) = interceptor
        .outgoing_traceparent(id)
        .and_then(|value| HeaderValue::from_str(&value).ok())
    {
        parts.headers.insert(TRACEPARENT, traceparent);
    }
    let request = Request::from_parts(parts, Full::new(Bytes::from(message)));
    relay::start(
        Exchange {
            interceptor,
            request_id,
            call,
        },
        inner.call(request),
    )
    .await
}

async fn pass_through<S, ResBody>(
    inner: &mut S,
    parts: http::request::Parts,
    body: Bytes,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let response = inner
        .call(Request::from_parts(parts, Full::new(body)))
        .await?;
    Ok(response.map(|body| body.map_err(Into::into).boxed_unsync()))
}

/// The W3C Trace Context header.
const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// What a request's headers say of its trace and session.
fn transport_trace(headers: &http::HeaderMap) -> crate::protocol::TransportTrace {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    crate::protocol::TransportTrace {
        traceparent: text("traceparent"),
        tracestate: text("tracestate"),
        session_id: text("mcp-session-id"),
        protocol_version: text("mcp-protocol-version"),
    }
}

fn set_body_length(parts: &mut http::request::Parts, len: usize) {
    parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
}

/// A response for a request that is not a JSON-RPC message the layer could read.
fn plain_error(status: StatusCode, message: &str) -> Response<ResponseBody> {
    json_response(status, error_response("null", INVALID_REQUEST, message))
}
