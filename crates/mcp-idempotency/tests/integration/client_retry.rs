//! The safe-retry client against real rmcp servers in process: with SEP-3182 in front
//! (`StdioProxy::spawn_in_process`, or `IdempotencyLayer` over Streamable HTTP) and without it.
//! A fault-injecting pipe between client and server drops `tools/call` responses after the
//! server executed the call, and may drop the connection with them; the tools count their
//! executions.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcp_idempotency::client::{
    CallOutcome, CallRequest, Client, ConnectError, Failure, GaveUp, RetryPolicy, Session,
    StdioConnector,
};
use mcp_idempotency::stdio::StdioProxy;
use mcp_idempotency::store::MemoryStore;
use mcp_idempotency::{Deduplicator, EngineConfig, Scope};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::watch;

/// How long a test waits for something that should happen soon.
const PATIENCE: Duration = Duration::from_secs(30);

#[derive(Clone)]
struct Tools {
    executions: Arc<AtomicU64>,
    gate: watch::Receiver<bool>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Tools {
    #[tool(description = "Counts its executions.")]
    async fn bump(&self) -> String {
        format!("execution {}", self.count())
    }

    #[tool(description = "Counts, then fails with a JSON-RPC error naming the execution.")]
    async fn fail(&self) -> Result<CallToolResult, ErrorData> {
        let n = self.count();
        Err(ErrorData::internal_error(
            format!("failure {n}"),
            Some(json!({"execution": n})),
        ))
    }

    #[tool(description = "Counts, then answers once the test opens the gate.")]
    async fn slow(&self) -> String {
        let n = self.count();
        let mut gate = self.gate.clone();
        let _ = gate.wait_for(|open| *open).await;
        format!("execution {n}")
    }

    #[tool(
        description = "Counts its executions; harmless to repeat.",
        annotations(idempotent_hint = true)
    )]
    async fn hinted(&self) -> String {
        format!("execution {}", self.count())
    }
}

impl Tools {
    fn count(&self) -> u64 {
        self.executions.fetch_add(1, Ordering::SeqCst) + 1
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// What the pipe between client and server does to `tools/call` responses.
#[derive(Default)]
struct Faults {
    /// How many more responses to drop.
    drop: AtomicU32,
    /// Also close the connection when dropping one.
    disconnect: AtomicBool,
    dropped: AtomicU32,
    in_progress: AtomicU32,
}

impl Faults {
    fn take_drop(&self) -> bool {
        self.drop
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// An rmcp server, with or without SEP-3182 in front, that hands out sessions through the
/// fault-injecting pipe. Every session runs a new server instance; with SEP-3182 they share
/// one record store, as processes sharing a SQLite file would.
struct Server {
    dedup: Option<Deduplicator>,
    executions: Arc<AtomicU64>,
    gate: watch::Sender<bool>,
    faults: Faults,
    sessions: AtomicU32,
}

impl Server {
    fn with_idempotency() -> Arc<Self> {
        let config =
            EngineConfig::default().with_in_progress_retry_after(Duration::from_millis(50));
        Self::new(Some(Deduplicator::new(
            config,
            Arc::new(MemoryStore::new()),
        )))
    }

    fn without_idempotency() -> Arc<Self> {
        Self::new(None)
    }

    fn new(dedup: Option<Deduplicator>) -> Arc<Self> {
        Arc::new(Self {
            dedup,
            executions: Arc::new(AtomicU64::new(0)),
            gate: watch::Sender::new(false),
            faults: Faults::default(),
            sessions: AtomicU32::new(0),
        })
    }

    fn executions(&self) -> u64 {
        self.executions.load(Ordering::SeqCst)
    }

    /// Drops the next `n` `tools/call` responses; with `disconnect`, closes the connection too.
    fn drop_responses(&self, n: u32, disconnect: bool) {
        self.faults.disconnect.store(disconnect, Ordering::SeqCst);
        self.faults.drop.store(n, Ordering::SeqCst);
    }

    async fn connect(self: Arc<Self>) -> Result<Session, ConnectError> {
        self.sessions.fetch_add(1, Ordering::SeqCst);
        let tools = Tools {
            executions: Arc::clone(&self.executions),
            gate: self.gate.subscribe(),
            tool_router: Tools::tool_router(),
        };
        let (client_end, pipe_client_end) = tokio::io::duplex(64 * 1024);
        let (pipe_server_end, server_end) = tokio::io::duplex(64 * 1024);
        let (server_in, server_out) = tokio::io::split(server_end);
        match &self.dedup {
            Some(dedup) => {
                let proxy = StdioProxy::new(dedup.clone(), Scope::new("client-test", "me"));
                let transport = proxy.spawn_in_process(server_in, server_out);
                tokio::spawn(async move {
                    if let Ok(running) = tools.serve(transport).await {
                        let _ = running.waiting().await;
                    }
                });
            }
            None => {
                tokio::spawn(async move {
                    if let Ok(running) = tools.serve((server_in, server_out)).await {
                        let _ = running.waiting().await;
                    }
                });
            }
        }
        tokio::spawn(pipe(pipe_client_end, pipe_server_end, Arc::clone(&self)));
        let (read, write) = tokio::io::split(client_end);
        Session::from_io(read, write).await
    }

    /// A client whose sessions come from this server.
    fn client(
        self: &Arc<Self>,
        policy: RetryPolicy,
    ) -> Client<impl mcp_idempotency::client::Connect> {
        let server = Arc::clone(self);
        Client::new(move || Arc::clone(&server).connect()).with_policy(policy)
    }
}

/// Copies lines both ways, dropping `tools/call` responses as `server.faults` says.
async fn pipe(client: DuplexStream, server_side: DuplexStream, server: Arc<Server>) {
    let (client_read, mut client_write) = tokio::io::split(client);
    let (server_read, mut server_write) = tokio::io::split(server_side);
    let calls = Mutex::new(HashSet::new());
    let up = async {
        let mut lines = BufReader::new(client_read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(message) = serde_json::from_str::<Value>(&line) {
                if message["method"] == "tools/call" {
                    calls.lock().unwrap().insert(message["id"].to_string());
                }
            }
            if server_write
                .write_all(format!("{line}\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
        }
    };
    let down = async {
        let mut lines = BufReader::new(server_read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let message: Value = serde_json::from_str(&line).unwrap_or_default();
            let is_call_response = message.get("method").is_none()
                && calls.lock().unwrap().remove(&message["id"].to_string());
            if is_call_response {
                if message["error"]["data"]["type"] == "idempotency_key_in_progress" {
                    server.faults.in_progress.fetch_add(1, Ordering::SeqCst);
                }
                if server.faults.take_drop() {
                    server.faults.dropped.fetch_add(1, Ordering::SeqCst);
                    if server.faults.disconnect.load(Ordering::SeqCst) {
                        return;
                    }
                    continue;
                }
            }
            if client_write
                .write_all(format!("{line}\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
        }
    };
    // Either side ending ends both: the halves are dropped, and each peer sees end of input.
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

fn patient() -> RetryPolicy {
    RetryPolicy::default()
        .with_max_attempts(20)
        .with_max_elapsed(PATIENCE)
        .with_backoff(Duration::from_millis(10), Duration::from_millis(100))
}

fn text(outcome: &CallOutcome) -> String {
    let (CallOutcome::Success(result) | CallOutcome::ToolError(result)) = outcome else {
        panic!("not a result: {outcome:?}");
    };
    match result.content.first() {
        Some(ContentBlock::Text(text)) => text.text.clone(),
        other => panic!("not text: {other:?}"),
    }
}

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {PATIENCE:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_lost_to_a_timeout_is_replayed_to_the_retry() {
    let server = Server::with_idempotency();
    let client = server.client(patient().with_attempt_timeout(Duration::from_millis(500)));
    assert!(client.advertises_idempotency().await.unwrap());
    server.drop_responses(1, false);

    let report = within(
        "the call",
        client.call_tool(CallRequest::new("bump").key("k-1")),
    )
    .await
    .expect("an outcome");
    assert_eq!(text(report.outcome()), "execution 1");
    assert_eq!(report.key(), "k-1");
    assert!(report.attempts() >= 2, "{report:?}");
    assert_eq!(server.faults.dropped.load(Ordering::SeqCst), 1);
    assert_eq!(
        server.executions(),
        1,
        "the retry was replayed, not executed"
    );
    assert_eq!(
        server.sessions.load(Ordering::SeqCst),
        1,
        "a timeout keeps the session"
    );
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_reconnects_and_gets_the_original_outcome() {
    let server = Server::with_idempotency();
    let client = server.client(patient());
    server.drop_responses(1, true);

    let report = within("the call", client.call_tool(CallRequest::new("bump")))
        .await
        .expect("an outcome");
    assert_eq!(text(report.outcome()), "execution 1");
    assert_eq!(report.attempts(), 2);
    assert_eq!(
        uuid_version(report.key()),
        Some(4),
        "a fresh UUID v4 key: {}",
        report.key()
    );
    assert_eq!(server.executions(), 1);
    assert_eq!(
        server.sessions.load(Ordering::SeqCst),
        2,
        "reconnected once"
    );

    // A new call gets a new key, and runs.
    let next = client.call_tool(CallRequest::new("bump")).await.unwrap();
    assert_ne!(next.key(), report.key());
    assert_eq!(text(next.outcome()), "execution 2");
    client.close().await;
}

fn uuid_version(key: &str) -> Option<usize> {
    uuid::Uuid::parse_str(key)
        .ok()
        .map(|uuid| uuid.get_version_num())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_progress_is_retried_until_it_completes() {
    let server = Server::with_idempotency();
    let first = server.client(patient());
    // Every "in progress" answer counts as an attempt.
    let second = server.client(patient().with_max_attempts(u32::MAX));

    let original = tokio::spawn(async move {
        first
            .call_tool(CallRequest::new("slow").key("k-slow"))
            .await
    });
    within("the first execution", async {
        while server.executions() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;

    let retry = tokio::spawn(async move {
        second
            .call_tool(CallRequest::new("slow").key("k-slow"))
            .await
    });
    within("an in-progress answer", async {
        while server.faults.in_progress.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    server.gate.send_replace(true);

    let original = within("the original call", original)
        .await
        .unwrap()
        .expect("the original's outcome");
    let retried = within("the retried call", retry)
        .await
        .unwrap()
        .expect("the retry's outcome");
    assert_eq!(text(original.outcome()), "execution 1");
    assert_eq!(retried.outcome(), original.outcome());
    assert!(retried.attempts() >= 2, "{retried:?}");
    assert_eq!(server.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_is_a_typed_error_after_one_attempt() {
    let server = Server::with_idempotency();
    let client = server.client(patient());
    let first = CallRequest::new("bump")
        .key("k-c")
        .arguments(json!({"n": 1}));
    client.call_tool(first).await.expect("the first call");

    let reused = CallRequest::new("bump")
        .key("k-c")
        .arguments(json!({"n": 2}));
    let error = client.call_tool(reused).await.expect_err("a conflict");
    assert!(matches!(error.failure(), Failure::Conflict(_)), "{error}");
    assert_eq!(error.attempts(), 1);
    assert_eq!(error.gave_up(), GaveUp::Final);
    assert_eq!(error.key(), "k-c");
    assert!(!error.may_have_run());
    let data = error.failure().error_data().unwrap().data.clone().unwrap();
    assert_eq!(data["type"], "idempotency_key_conflict");
    assert_eq!(server.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_error_is_the_outcome_and_is_replayed_not_retried() {
    let server = Server::with_idempotency();
    let client = server.client(patient());

    let report = client
        .call_tool(CallRequest::new("fail").key("k-f1"))
        .await
        .expect("an outcome");
    let CallOutcome::RpcError(error) = report.outcome() else {
        panic!("{report:?}")
    };
    assert_eq!(error.data, Some(json!({"execution": 1})));
    assert_eq!(report.attempts(), 1, "an error outcome is not retried");

    // The error's response is lost: the retry gets the same error, replayed.
    server.drop_responses(1, true);
    let report = within(
        "the call",
        client.call_tool(CallRequest::new("fail").key("k-f2")),
    )
    .await
    .expect("an outcome");
    let CallOutcome::RpcError(error) = report.outcome() else {
        panic!("{report:?}")
    };
    assert_eq!(error.data, Some(json!({"execution": 2})));
    assert_eq!(report.attempts(), 2);
    assert_eq!(server.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_capability_a_lost_call_is_not_retried() {
    let server = Server::without_idempotency();
    let client = server.client(
        patient()
            .with_attempt_timeout(Duration::from_millis(300))
            .with_trust_idempotent_hint(true),
    );
    assert!(!client.advertises_idempotency().await.unwrap());
    server.drop_responses(1, false);

    // `bump` has no idempotentHint: trusting hints does not make it retryable.
    let error = within("the call", client.call_tool(CallRequest::new("bump")))
        .await
        .expect_err("no outcome");
    assert!(matches!(error.failure(), Failure::Timeout(_)), "{error}");
    assert_eq!(error.gave_up(), GaveUp::Unsafe);
    assert_eq!(error.attempts(), 1);
    assert!(error.may_have_run());
    assert_eq!(server.executions(), 1);

    // Without the opt-in, an idempotentHint tool is not retried either.
    let cautious = server.client(patient().with_attempt_timeout(Duration::from_millis(300)));
    server.drop_responses(1, false);
    let error = within("the call", cautious.call_tool(CallRequest::new("hinted")))
        .await
        .expect_err("no outcome");
    assert_eq!(error.gave_up(), GaveUp::Unsafe);
    assert_eq!(server.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_opt_in_an_idempotent_hint_tool_is_retried() {
    let server = Server::without_idempotency();
    let client = server.client(patient().with_trust_idempotent_hint(true));
    server.drop_responses(1, true);

    let report = within("the call", client.call_tool(CallRequest::new("hinted")))
        .await
        .expect("an outcome");
    assert_eq!(report.attempts(), 2);
    // No SEP-3182 server: the tool really ran twice, as its annotation says is harmless.
    assert_eq!(text(report.outcome()), "execution 2");
    assert_eq!(server.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_attempts_is_respected() {
    let server = Server::with_idempotency();
    let client = server.client(patient().with_max_attempts(3));
    server.drop_responses(u32::MAX, true);

    let error = within("the call", client.call_tool(CallRequest::new("bump")))
        .await
        .expect_err("no outcome");
    assert!(matches!(error.failure(), Failure::Transport(_)), "{error}");
    assert_eq!(error.gave_up(), GaveUp::MaxAttempts);
    assert_eq!(error.attempts(), 3);
    assert_eq!(server.faults.dropped.load(Ordering::SeqCst), 3);
    assert_eq!(server.executions(), 1, "the retries were replays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_elapsed_is_respected() {
    let server = Server::with_idempotency();
    server.drop_responses(u32::MAX, true);
    let client = server.client(
        patient()
            .with_max_attempts(u32::MAX)
            .with_max_elapsed(Duration::from_millis(500)),
    );
    let error = within("the call", client.call_tool(CallRequest::new("bump")))
        .await
        .expect_err("no outcome");
    assert_eq!(error.gave_up(), GaveUp::MaxElapsed, "{error}");
    assert!(error.attempts() >= 1);

    // One attempt never waits past the total: its timeout is cut to the time left.
    server.drop_responses(u32::MAX, false);
    let client = server.client(
        patient()
            .with_attempt_timeout(Duration::from_secs(3600))
            .with_max_elapsed(Duration::from_millis(500)),
    );
    client
        .session()
        .await
        .expect("connected before the clock starts");
    let error = within("the call", client.call_tool(CallRequest::new("bump")))
        .await
        .expect_err("no outcome");
    assert!(matches!(error.failure(), Failure::Timeout(_)), "{error}");
    assert_eq!(error.gave_up(), GaveUp::MaxElapsed);
    assert_eq!(error.attempts(), 1);
}

#[tokio::test]
async fn a_server_that_cannot_start_is_a_final_connect_error() {
    let client = Client::new(StdioConnector::new("/nonexistent/mcp-server"));
    let error = client
        .call_tool(CallRequest::new("bump"))
        .await
        .expect_err("no server");
    assert!(
        matches!(
            error.failure(),
            Failure::Connect(ConnectError::Spawn { .. })
        ),
        "{error}"
    );
    assert_eq!(error.gave_up(), GaveUp::Final);
    assert_eq!(error.attempts(), 1);
    assert!(!error.may_have_run());
}

/// Streamable HTTP: a stateless rmcp server behind `IdempotencyLayer`, records scoped by bearer
/// token; the first `tools/call` response is replaced by a 502 after the layer recorded it.
#[cfg(feature = "http")]
mod over_http {
    use std::convert::Infallible;

    use axum::body::Body;
    use http_body_util::BodyExt;
    use mcp_idempotency::client::HttpConnector;
    use mcp_idempotency::http::principal::ScopeBy;
    use mcp_idempotency::http::IdempotencyLayer;
    use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    use tower::ServiceExt as _;

    use super::*;

    async fn serve(executions: Arc<AtomicU64>, fail_next_call: Arc<AtomicBool>) -> String {
        let (gate, _) = watch::channel(true);
        let tools = Tools {
            executions,
            gate: gate.subscribe(),
            tool_router: Tools::tool_router(),
        };
        let mcp = StreamableHttpService::new(
            move || Ok(tools.clone()),
            Arc::new(NeverSessionManager::default()),
            StreamableHttpServerConfig::default()
                .with_legacy_session_mode(false)
                .with_json_response(true),
        );
        let dedup = Deduplicator::new(EngineConfig::default(), Arc::new(MemoryStore::new()));
        let mcp = tower::ServiceBuilder::new()
            .layer(IdempotencyLayer::new(dedup).scope_by(ScopeBy::Bearer))
            .service(mcp);
        let faulty = tower::service_fn(move |request: http::Request<Body>| {
            let (mcp, fail_next_call) = (mcp.clone(), Arc::clone(&fail_next_call));
            async move {
                let (parts, body) = request.into_parts();
                let body = body.collect().await.unwrap().to_bytes();
                let is_call = String::from_utf8_lossy(&body).contains("\"tools/call\"");
                let response = mcp
                    .oneshot(http::Request::from_parts(parts, Body::from(body)))
                    .await?;
                if is_call && fail_next_call.swap(false, Ordering::SeqCst) {
                    // The call ran and was recorded; its answer is lost on the way back.
                    let _ = response.into_body().collect().await;
                    let lost = http::Response::builder()
                        .status(502)
                        .body(Body::from("bad gateway"))
                        .unwrap();
                    return Ok::<_, Infallible>(lost);
                }
                Ok(response.map(Body::new))
            }
        });
        let app = axum::Router::new().route_service("/mcp", faulty);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_http_a_lost_answer_is_retried_and_replayed_per_principal() {
        let executions = Arc::new(AtomicU64::new(0));
        let fail_next_call = Arc::new(AtomicBool::new(true));
        let url = serve(Arc::clone(&executions), Arc::clone(&fail_next_call)).await;

        let alice =
            Client::new(HttpConnector::new(&url).bearer_token("alice")).with_policy(patient());
        assert!(alice.advertises_idempotency().await.unwrap());
        let report = within(
            "the call",
            alice.call_tool(CallRequest::new("bump").key("k-h")),
        )
        .await
        .expect("an outcome");
        assert!(
            !fail_next_call.load(Ordering::SeqCst),
            "the fault was injected"
        );
        assert_eq!(text(report.outcome()), "execution 1");
        assert_eq!(report.attempts(), 2);
        assert_eq!(executions.load(Ordering::SeqCst), 1);

        // The header scopes the records: bob's identical key is another operation.
        let bob = Client::new(HttpConnector::new(&url).header("Authorization", "Bearer bob"));
        let report = bob
            .call_tool(CallRequest::new("bump").key("k-h"))
            .await
            .expect("an outcome");
        assert_eq!(text(report.outcome()), "execution 2");
        assert_eq!(executions.load(Ordering::SeqCst), 2);
        alice.close().await;
        bob.close().await;
    }

    #[tokio::test]
    async fn an_unreachable_server_is_retried_then_given_up() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        drop(listener);
        let client =
            Client::new(HttpConnector::new(url)).with_policy(patient().with_max_attempts(2));
        let error = client
            .call_tool(CallRequest::new("bump"))
            .await
            .expect_err("nothing listens");
        assert!(matches!(error.failure(), Failure::Connect(_)), "{error}");
        assert_eq!(error.gave_up(), GaveUp::MaxAttempts);
        assert_eq!(error.attempts(), 2);
        assert!(!error.may_have_run());
    }
}
