//! [`IdempotencyLayer`]: the tower [`Layer`] that puts SEP-3182 in front of a Streamable HTTP MCP
//! server, and its settings.

use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::future::{Namespace, Shared};
use super::principal::ScopeBy;
use super::service::IdempotencyService;
use super::shutdown::Shutdown;
use crate::default_scope::{LearnedNamespace, HTTP_LAYER_NAMESPACE};
use crate::interceptor::InterceptorConfig;
use crate::jsonrpc::DEFAULT_MAX_CLIENT_MESSAGE_BYTES;
use crate::policy::ToolPolicies;
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
/// Records belong to a [`Scope`](crate::Scope): this layer's namespace and the principal
/// [`ScopeBy`] finds in the request's headers. A keyed call without the required credential is
/// answered `401` before any record is read.
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

impl IdempotencyLayer {
    /// A layer deciding with `dedup`, namespace `"default"`, no principal ([`ScopeBy::None`]).
    pub fn new(dedup: Deduplicator) -> Self {
        Self {
            shared: Arc::new(Shared {
                dedup,
                namespace: Namespace::Fixed(Arc::from(HTTP_LAYER_NAMESPACE)),
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
        let namespace = Namespace::Fixed(namespace.into());
        self.with(|shared| shared.namespace = namespace)
    }

    /// A namespace learned after the start (what `mcp-idem proxy` does: its upstream's name,
    /// asked for in the background): a keyed call waits for it, up to
    /// [`SERVER_NAME_TIMEOUT`](crate::default_scope::SERVER_NAME_TIMEOUT), and is refused with
    /// `idempotency_scope_unknown` (nothing run, nothing claimed) if it has not come by then.
    pub fn learned_namespace(self, namespace: LearnedNamespace) -> Self {
        let namespace = Namespace::Learned(namespace);
        self.with(|shared| shared.namespace = namespace)
    }

    /// How the principal (the authorization boundary records are scoped to) is found.
    pub fn scope_by(self, scope_by: ScopeBy) -> Self {
        self.with(|shared| shared.scope_by = scope_by)
    }

    /// Key forwarding and cancellation settings, as for the stdio proxy (the tools' key policies
    /// too: set them with [`tool_policies`](Self::tool_policies) after this).
    pub fn interceptor_config(self, config: InterceptorConfig) -> Self {
        self.with(|shared| shared.interceptor = config)
    }

    /// The tools' key policies, for calls that carry no SEP-3182 key (a business identifier, a
    /// key argument, a duplicate window, per tool), and the `params._meta` members a client's key
    /// is read from ([`ToolPolicies::with_meta_key`]): what `mcp-idem wrap --tools` and
    /// `--meta-key`, and the bindings' `tools` and `meta-key` options, set. The other interceptor
    /// settings are kept. A key-less duplicate of a running call waits for its outcome (up to the
    /// tool's `wait`) in its own request, holding up no other.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// use mcp_idempotency::http::idempotent_layer;
    /// use mcp_idempotency::policy::ToolPolicies;
    ///
    /// // A model retrying `charge` with the same order id gets the first charge back.
    /// let policies = ToolPolicies::from_json(&serde_json::json!({
    ///     "charge": {"key-from": ["/order_id"], "required": true},
    ///     "send_email": {"window": "30s"},
    /// }))?
    /// .with_meta_key("io.mcp-gateway/idempotency-key")?;
    /// let layer = idempotent_layer("sqlite:/var/lib/my-server/idem.sqlite3")
    ///     .await?
    ///     .namespace("payments")
    ///     .tool_policies(policies);
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn tool_policies(self, policies: ToolPolicies) -> Self {
        self.with(|shared| {
            shared.interceptor = shared.interceptor.clone().tool_policies(policies);
        })
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
        IdempotencyService::new(inner, Arc::clone(&self.shared))
    }
}
