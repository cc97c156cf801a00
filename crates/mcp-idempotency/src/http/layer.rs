//! The tower [`Layer`] and [`Service`] that put SEP-3182 in front of a Streamable HTTP MCP server.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_LENGTH, WWW_AUTHENTICATE};
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use tower_layer::Layer;
use tower_service::Service;

use super::body::{json_response, BoxError, ResponseBody};
use super::principal::ScopeBy;
use super::relay::{self, Exchange};
use super::shutdown::Shutdown;
use crate::engine::Decision;
use crate::interceptor::{ClientAction, Decided, Interceptor, InterceptorConfig};
use crate::jsonrpc::{error_response, DEFAULT_MAX_CLIENT_MESSAGE_BYTES, INVALID_REQUEST};
use crate::record::Scope;
use crate::rejection::Rejection;
use crate::store::{self, StoreError, StoreUrl};
use crate::{Deduplicator, EngineConfig};

/// Default for [`IdempotencyLayer::body_timeout`].
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// A layer recording in the store at `store_url` (`memory`, `sqlite:PATH`, `redis://…`,
/// `postgres://…`) with the default engine settings: HTTP embedding in one statement, as
/// [`idempotent_stdio`](crate::stdio::idempotent_stdio) is for stdio. Set the namespace and the
/// scope on the result.
///
/// ```no_run
/// # async fn example() -> Result<(), mcp_idempotency::store::StoreError> {
/// use mcp_idempotency::http::idempotent_layer;
/// use mcp_idempotency::http::principal::ScopeBy;
///
/// let layer = idempotent_layer("redis://127.0.0.1:6379").await?
///     .namespace("payments")
///     .scope_by(ScopeBy::Bearer);
/// # let _ = layer; Ok(()) }
/// ```
pub async fn idempotent_layer(store_url: &str) -> Result<IdempotencyLayer, StoreError> {
    let store = store::open(&store_url.parse::<StoreUrl>()?).await?;
    Ok(IdempotencyLayer::new(Deduplicator::new(
        EngineConfig::default(),
        store,
    )))
}

/// Adds SEP-3182 request idempotency to a Streamable HTTP MCP service, such as rmcp's
/// `StreamableHttpService` or a reverse proxy to any MCP server.
///
/// For each POST carrying one JSON-RPC message, a `tools/call` with `params.idempotencyKey` is
/// decided by the [`Deduplicator`]: replays and rejections are answered here as `application/json`;
/// an executed call is forwarded (without the key, which goes to `params._meta`, see
/// [`crate::interceptor`]) and its response, plain JSON or an SSE stream, is recorded before the
/// client sees it. The upstream call runs in a task of its own, so a client that disconnects (how a
/// lost response looks) does not stop it: its outcome is recorded for the retry. `initialize` and
/// `server/discover` results get `capabilities.tools.idempotency`. A JSON-RPC batch (an array) that
/// holds a keyed `tools/call` is refused whole, answered `200` with a batch of `-32600` errors
/// ([`BATCH_REFUSED`](crate::interceptor::BATCH_REFUSED)). Everything else passes through.
///
/// Records belong to a [`Scope`]: this layer's namespace and the principal [`ScopeBy`] finds in the
/// request's headers. A keyed call without the required credential is answered `401` before any
/// record is read.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use mcp_idempotency::http::IdempotencyLayer;
/// use mcp_idempotency::http::principal::ScopeBy;
/// use mcp_idempotency::{store, Deduplicator, EngineConfig};
///
/// let store = store::open(&"sqlite:/var/lib/my-server/idem.sqlite3".parse()?).await?;
/// let layer = IdempotencyLayer::new(Deduplicator::new(EngineConfig::default(), store))
///     .namespace("my-server")
///     .scope_by(ScopeBy::Bearer);
/// // axum: Router::new().nest_service("/mcp", tower::ServiceBuilder::new().layer(layer).service(mcp_service))
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

#[derive(Clone, Debug)]
pub(super) struct Shared {
    pub(super) dedup: Deduplicator,
    namespace: Arc<str>,
    scope_by: ScopeBy,
    interceptor: InterceptorConfig,
    max_body_bytes: usize,
    body_timeout: Duration,
    shutdown: Shutdown,
}

impl IdempotencyLayer {
    /// A layer deciding with `dedup`, namespace `"default"`, no principal ([`ScopeBy::None`]).
    pub fn new(dedup: Deduplicator) -> Self {
        Self {
            shared: Arc::new(Shared {
                dedup,
                namespace: Arc::from("default"),
                scope_by: ScopeBy::None,
                interceptor: InterceptorConfig::default(),
                max_body_bytes: DEFAULT_MAX_CLIENT_MESSAGE_BYTES,
                body_timeout: DEFAULT_BODY_TIMEOUT,
                shutdown: Shutdown::default(),
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Shared)) -> Self {
        change(Arc::make_mut(&mut self.shared));
        self
    }

    /// The namespace of this server's records: two servers sharing a store must use different ones.
    /// [`server_namespace`](crate::default_scope::server_namespace)`(name)` is the one `wrap`
    /// and the bindings use by default, so the server keeps its records across those forms.
    pub fn namespace(self, namespace: impl Into<Arc<str>>) -> Self {
        let namespace = namespace.into();
        self.with(|shared| shared.namespace = namespace)
    }

    /// How the principal (the authorization boundary records are scoped to) is found.
    pub fn scope_by(self, scope_by: ScopeBy) -> Self {
        self.with(|shared| shared.scope_by = scope_by)
    }

    /// Key forwarding and cancellation settings, as for the stdio proxy.
    pub fn interceptor_config(self, config: InterceptorConfig) -> Self {
        self.with(|shared| shared.interceptor = config)
    }

    /// Largest request body read (default [`DEFAULT_MAX_CLIENT_MESSAGE_BYTES`]); larger POSTs get
    /// `413`.
    pub fn max_body_bytes(self, max: usize) -> Self {
        self.with(|shared| shared.max_body_bytes = max)
    }

    /// The graceful stop of this layer and of every service made from it (call
    /// [`Shutdown::drain`] when the server stops). Settings changed after this call give a layer
    /// with the same shutdown.
    pub fn shutdown(&self) -> Shutdown {
        self.shared.shutdown.clone()
    }

    /// Longest a request body may take to arrive (default [`DEFAULT_BODY_TIMEOUT`]); a slower one
    /// gets `408` and is not forwarded, so a client trickling bytes cannot hold a task forever.
    pub fn body_timeout(self, timeout: Duration) -> Self {
        self.with(|shared| shared.body_timeout = timeout)
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps around an MCP HTTP service. The inner service gets every
/// request with its body read into memory.
#[derive(Clone, Debug)]
pub struct IdempotencyService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display + Send + 'static,
    ReqBody: Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone goes in place of the service made ready by `poll_ready`, which handles this call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(handle(shared, inner, request))
    }
}

async fn handle<S, ReqBody, ResBody>(
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
    let scope = Scope::new(Arc::clone(&shared.namespace), Arc::<str>::from(principal));
    let key = call.tool_call().idempotency_key.cloned();
    let Some(counted) = shared.shutdown.enter() else {
        let refusal = Decision::Reject(Rejection::shutting_down(key.as_ref()));
        #[cfg(feature = "metrics")]
        crate::metrics::on_decision(&refusal);
        // A rejection is always answered, never forwarded.
        return Ok(match interceptor.on_decision(call, refusal) {
            Decided::Respond(response) | Decided::Forward(response) => {
                json_response(StatusCode::OK, response)
            }
        });
    };
    let decision = match shared.dedup.begin(&scope, &call.tool_call()).await {
        // The shutdown grace ended while the key was being claimed: the call is not forwarded.
        Decision::Execute(claim) if shared.shutdown.grace_is_over() => {
            claim
                .release("the gateway shut down before forwarding the call")
                .await;
            Decision::Reject(Rejection::shutting_down(key.as_ref()))
        }
        decision => decision,
    };
    let request_id = call.id().as_json().to_owned();
    match interceptor.on_decision(call, decision) {
        Decided::Respond(response) => Ok(json_response(StatusCode::OK, response)),
        Decided::Forward(message) if interceptor.has_calls_in_flight() => {
            set_body_length(&mut parts, message.len());
            let request = Request::from_parts(parts, Full::new(Bytes::from(message)));
            Ok(relay::start(
                Exchange {
                    interceptor,
                    request_id,
                    call: Some(counted),
                },
                inner.call(request),
            )
            .await)
        }
        Decided::Forward(message) => {
            set_body_length(&mut parts, message.len());
            pass_through(&mut inner, parts, Bytes::from(message)).await
        }
    }
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

fn set_body_length(parts: &mut http::request::Parts, len: usize) {
    parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
}

/// A response for a request that is not a JSON-RPC message the layer could read.
fn plain_error(status: StatusCode, message: &str) -> Response<ResponseBody> {
    json_response(status, error_response("null", INVALID_REQUEST, message))
}
