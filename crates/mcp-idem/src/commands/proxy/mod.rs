//! `mcp-idem proxy`: SEP-3182 in front of any Streamable HTTP MCP server.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use super::policy_args::PolicyArgs;
use anyhow::Context;
use clap::Args;
use hyper::body::Incoming;
use mcp_idempotency::default_scope::{upstream_namespace, LearnedNamespace, LegacyNamespaceReads};
use mcp_idempotency::http::{IdempotencyLayer, IdempotencyService};
use mcp_idempotency::interceptor::{CancelPolicy, InterceptorConfig};
use mcp_idempotency::{Deduplicator, Timestamp};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use http::{Request, Response};
use mcp_idempotency::http::ResponseBody;
use tower::{Layer, Service};

mod conn;
mod server_name;
mod tools_list;

use super::engine_args::EngineArgs;
use super::scope_args::ScopeArgs;
use crate::allowed_hosts::{AllowedHosts, GuardHosts};
use crate::http_line_client::HttpClient;
use crate::ops::{self, OpsArgs};
use crate::upstream::{bad_gateway, Upstream, UpstreamUrl};

/// Options of `mcp-idem proxy`.
#[derive(Debug, Args)]
pub(crate) struct ProxyArgs {
    /// Address to listen on, e.g. 127.0.0.1:8080 (port 0 picks a free port; the address is
    /// printed on stderr).
    #[arg(long, env = "MCP_IDEM_LISTEN", value_name = "ADDR")]
    listen: SocketAddr,

    /// The MCP server's endpoint URL, as clients name it: http[s]://HOST[:PORT][/path], e.g.
    /// http://127.0.0.1:8000/mcp. Requests for the proxy's /mcp go to that path; other paths (the
    /// OAuth metadata under /.well-known/, ...) go to the same path on the upstream's host. A URL
    /// without a path sends every path as it is.
    #[arg(long, env = "MCP_IDEM_UPSTREAM", value_name = "URL")]
    upstream: String,

    /// Also trust the CA certificates in this PEM file for an https:// upstream (a private CA);
    /// the system's roots are always trusted.
    #[arg(long, env = "MCP_IDEM_UPSTREAM_CA_CERT", value_name = "FILE")]
    upstream_ca_cert: Option<std::path::PathBuf>,

    /// Namespace of this server's records [default: `mcp-server:<name>`, the name the upstream
    /// gives itself, asked by the proxy at start (`server/discover`, else `initialize`), as every
    /// form keys a server's records: instances naming one server by other URLs share them.
    /// Records kept under `http:<upstream URL>` by earlier versions are still found; an upstream
    /// that will not give the proxy its name (it wants credentials) keeps that namespace].
    #[arg(long, env = "MCP_IDEM_NAMESPACE")]
    namespace: Option<String>,

    /// Also forward `idempotencyKey` in the params (it is always copied to
    /// `params._meta["mcp-idem/idempotencyKey"]`).
    #[arg(long, env = "MCP_IDEM_FORWARD_KEY")]
    forward_key: bool,

    /// Longest a request body may take to arrive; slower ones get 408 and are not forwarded.
    #[arg(long, env = "MCP_IDEM_BODY_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    body_timeout: std::time::Duration,

    /// Longest a client may take to send a request's head (from the connection's start, or on a
    /// kept-alive connection from the request's first byte); a slower one is disconnected.
    #[arg(long, env = "MCP_IDEM_HEADER_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    header_timeout: std::time::Duration,

    /// How long a kept-alive client connection may wait for its next request before it is closed.
    #[arg(long, env = "MCP_IDEM_IDLE_TIMEOUT", default_value = "120s", value_parser = humantime::parse_duration)]
    idle_timeout: std::time::Duration,

    /// Most client connections open at once; more wait (unaccepted) until one closes.
    #[arg(long, env = "MCP_IDEM_MAX_CONNECTIONS", default_value = "512", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,

    /// A host name clients may address this proxy by (repeatable), besides localhost, 127.0.0.1,
    /// ::1 and the listen address: requests whose Host or Origin names another host get 403, so
    /// that a web page cannot reach the proxy by DNS rebinding.
    #[arg(
        long = "allowed-host",
        env = "MCP_IDEM_ALLOWED_HOSTS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    allowed_hosts: Vec<String>,

    /// Accept any Host and Origin (behind a front proxy that checks them itself).
    #[arg(
        long,
        env = "MCP_IDEM_ALLOW_ANY_HOST",
        conflicts_with = "allowed_hosts"
    )]
    allow_any_host: bool,

    /// How long requests in flight get to be answered, and keyed calls recorded, once the proxy
    /// is stopping (SIGTERM or SIGINT): it stops accepting connections at once and answers new
    /// keyed calls `idempotency_shutting_down`. Calls still running then are recorded as
    /// outcome-unknown and answered so; the proxy exits with status 0.
    #[arg(long, env = "MCP_IDEM_SHUTDOWN_GRACE", default_value = "8s", value_parser = humantime::parse_duration)]
    shutdown_grace: std::time::Duration,

    /// Threads that serve requests [default: one per core]. `1` runs everything on one thread
    /// (as an nginx worker does), which costs the least CPU per request: no thread hands work
    /// to another.
    #[arg(long, env = "MCP_IDEM_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,

    #[command(flatten)]
    scope: ScopeArgs,

    #[command(flatten)]
    engine: EngineArgs,

    #[command(flatten)]
    ops: OpsArgs,

    #[command(flatten)]
    policy: PolicyArgs,
}

impl ProxyArgs {
    pub(crate) fn exec(self) -> anyhow::Result<ExitCode> {
        let mut builder = match self.threads {
            Some(1) => tokio::runtime::Builder::new_current_thread(),
            Some(n) => {
                let mut builder = tokio::runtime::Builder::new_multi_thread();
                builder.worker_threads(usize::from(n));
                builder
            }
            None => tokio::runtime::Builder::new_multi_thread(),
        };
        let runtime = builder
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        runtime.block_on(self.run())?;
        Ok(ExitCode::SUCCESS)
    }

    async fn run(self) -> anyhow::Result<()> {
        let upstream_url = UpstreamUrl::parse(&self.upstream)?;
        let upstream = Upstream::new(upstream_url.clone(), self.upstream_ca_cert.as_deref())
            .context("cannot set up the upstream's HTTP client (--upstream-ca-cert)")?;
        let scope_by = self.scope.scope_by()?;
        let policies = self.policy.policies()?;
        PolicyArgs::log(&policies);
        let telemetry = ops::start_telemetry()?;
        let mut store = self
            .ops
            .start(self.engine.open_store().await?, telemetry.as_ref())
            .await?;
        let legacy = upstream_namespace(&upstream_url.to_string());
        if self.namespace.is_none() {
            store =
                Arc::new(LegacyNamespaceReads::open(store, &legacy, None, Timestamp::now()).await);
        }
        let dedup = Deduplicator::new(self.engine.engine_config(), store);
        let namespace = match &self.namespace {
            Some(namespace) => {
                tracing::info!(%namespace, upstream = %upstream_url, "proxying");
                LayerNamespace::Fixed(namespace.clone())
            }
            None => {
                tracing::info!(upstream = %upstream_url, "proxying; asking the upstream its name");
                let (learner, learned) = LearnedNamespace::new();
                let client = HttpClient::new(
                    &upstream_url.endpoint(),
                    &[],
                    self.upstream_ca_cert.as_deref(),
                )?;
                tokio::spawn(server_name::learn(
                    client,
                    upstream_url.to_string(),
                    learner,
                ));
                LayerNamespace::Learned(learned)
            }
        };

        // Before the listener opens: from now on SIGTERM and SIGINT start the graceful stop.
        let (stop, stopped_at) = super::noting_when(super::stop_signal());
        let layer = match namespace {
            LayerNamespace::Fixed(namespace) => {
                IdempotencyLayer::new(dedup.clone()).namespace(namespace)
            }
            LayerNamespace::Learned(learned) => {
                IdempotencyLayer::new(dedup.clone()).learned_namespace(learned)
            }
        };
        let interceptor = InterceptorConfig::default()
            .forward_key(self.forward_key)
            .cancel_policy(CancelPolicy::Absorb)
            .tool_policies(policies)
            .policy_command(format!("mcp-idem tools --url {}", upstream_url.endpoint()));
        if interceptor.policies().is_suggested() {
            let client = HttpClient::new(
                &upstream_url.endpoint(),
                &[],
                self.upstream_ca_cert.as_deref(),
            )?;
            tokio::spawn(tools_list::keep_listed(client, interceptor.clone()));
        }
        let layer = layer
            .scope_by(scope_by)
            .body_timeout(self.body_timeout)
            .interceptor_config(interceptor);
        let calls = layer.shutdown();
        let hosts = if self.allow_any_host {
            AllowedHosts::any()
        } else {
            AllowedHosts::new(self.listen, &self.allowed_hosts)
        };
        let routes = Routes {
            health: ops::health_routes(Arc::clone(dedup.store())),
            proxy: GuardHosts::new(AnswerErrors(layer.layer(upstream)), hosts),
        };

        let listener = tokio::net::TcpListener::bind(self.listen)
            .await
            .with_context(|| format!("cannot listen on {}", self.listen))?;
        let local = listener
            .local_addr()
            .context("cannot read the bound address")?;
        eprintln!("mcp-idem proxy: listening on http://{local}");
        let limits = conn::Limits {
            max_connections: self.max_connections as usize,
            header_timeout: self.header_timeout,
            idle_timeout: self.idle_timeout,
        };
        tokio::select! {
            () = conn::serve(listener, routes, limits, stop, calls, self.shutdown_grace) => {}
            never = mcp_idempotency::upkeep::purge_periodically(dedup.clone()) => match never {},
        }
        super::settle_completions(&dedup, self.shutdown_grace, stopped_at.get().copied()).await;
        ops::stop_telemetry(
            telemetry,
            super::grace_left(self.shutdown_grace, stopped_at.get().copied()),
        )
        .await;
        Ok(())
    }
}

/// The namespace the proxy's layer decides under.
enum LayerNamespace {
    /// `--namespace`.
    Fixed(String),
    /// The upstream's name, once it gave it.
    Learned(LearnedNamespace),
}

/// The proxy's two services: `/healthz` and `/readyz` ([`ops::health_routes`]), and the proxy for
/// every other path. Told apart by a string comparison: a router would match each request's path
/// against a tree and store the match in its extensions, for two fixed paths.
#[derive(Clone)]
pub(crate) struct Routes {
    health: axum::Router,
    proxy: GuardHosts<AnswerErrors<IdempotencyService<Upstream>>>,
}

impl Routes {
    fn is_health(path: &str) -> bool {
        matches!(path, ops::HEALTHZ | ops::READYZ)
    }
}

impl Service<Request<Incoming>> for Routes {
    type Response = Response<axum::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        // The health router is always ready.
        Service::<Request<Incoming>>::poll_ready(&mut self.proxy, cx)
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        if Self::is_health(request.uri().path()) {
            let call = self.health.call(request);
            return Box::pin(call);
        }
        let call = self.proxy.call(request);
        Box::pin(async move { Ok(call.await?.map(axum::body::Body::new)) })
    }
}

/// Answers a failed request `502 Bad Gateway` instead of failing the connection: the server needs
/// a service that never fails.
#[derive(Clone, Debug)]
struct AnswerErrors<S>(S);

impl<S, B> Service<Request<B>> for AnswerErrors<S>
where
    S: Service<Request<B>, Response = Response<ResponseBody>>,
    S::Error: std::fmt::Display,
    S::Future: Send + 'static,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        // A service that cannot get ready fails its call, which is answered below.
        self.0.poll_ready(cx).map(|_| Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let call = self.0.call(request);
        Box::pin(async move {
            Ok(call.await.unwrap_or_else(|err| {
                tracing::warn!(error = %err, "upstream unreachable");
                bad_gateway(&err.to_string())
            }))
        })
    }
}
