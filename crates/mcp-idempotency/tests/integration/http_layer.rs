//! The HTTP layer over an in-process upstream that behaves like a Streamable HTTP MCP server:
//! decisions, recording of JSON and SSE answers, disconnects, upstream failures, principals.
//! (End-to-end tests with the real `mcp-idem proxy` and demo server live in the binary crate.)

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use mcp_idempotency::http::principal::ScopeBy;
use mcp_idempotency::http::{IdempotencyLayer, ResponseBody};
use mcp_idempotency::store::MemoryStore;
use mcp_idempotency::{Deduplicator, EngineConfig};
use serde_json::{json, Value};
use tower_layer::Layer;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type UpBody = UnsyncBoxBody<Bytes, BoxError>;

/// How the fake upstream answers `tools/call`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Json,
    Sse,
    /// Refuses the connection: the request never arrives.
    Unreachable,
    /// Runs the tool, then fails with HTTP 500.
    ServerError,
    /// Answers 400 without running anything.
    BadRequest,
}

#[derive(Clone)]
struct FakeServer {
    executed: Arc<AtomicUsize>,
    mode: Mode,
    delay: Duration,
    last_request: Arc<std::sync::Mutex<Option<Value>>>,
}

impl FakeServer {
    fn new(mode: Mode) -> Self {
        Self {
            executed: Arc::new(AtomicUsize::new(0)),
            mode,
            delay: Duration::ZERO,
            last_request: Arc::default(),
        }
    }

    fn executed(&self) -> usize {
        self.executed.load(Ordering::SeqCst)
    }
}

#[derive(Debug)]
struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection refused")
    }
}

fn body(bytes: impl Into<Bytes>) -> UpBody {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

fn json_ok(text: String) -> Response<UpBody> {
    Response::builder()
        .header("content-type", "application/json")
        .body(body(text))
        .unwrap()
}

impl Service<Request<Full<Bytes>>> for FakeServer {
    type Response = Response<UpBody>;
    type Error = Refused;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Refused>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Refused>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let bytes = request.into_body().collect().await.unwrap().to_bytes();
            let message: Value = serde_json::from_slice(&bytes).unwrap();
            *this.last_request.lock().unwrap() = Some(message.clone());
            let id = message["id"].clone();
            match message["method"].as_str() {
                Some("server/discover") => {
                    let result = json!({"jsonrpc":"2.0","id":id,"result":{"resultType":"complete","capabilities":{"tools":{"listChanged":true}},"supportedVersions":["2026-07-28"]}});
                    if this.mode == Mode::Sse {
                        return Ok(sse(vec![format!("data: {result}\n\n")]));
                    }
                    return Ok(json_ok(result.to_string()));
                }
                Some("tools/call") => {}
                _ => {
                    return Ok(Response::builder()
                        .status(StatusCode::ACCEPTED)
                        .body(body(""))
                        .unwrap())
                }
            }
            match this.mode {
                Mode::Unreachable => return Err(Refused),
                Mode::BadRequest => {
                    return Ok(Response::builder()
                        .status(StatusCode::BAD_REQUEST)
                        .body(body("bad header"))
                        .unwrap())
                }
                _ => {}
            }
            tokio::time::sleep(this.delay).await;
            let n = this.executed.fetch_add(1, Ordering::SeqCst) + 1;
            let result = json!({"jsonrpc":"2.0","id":id,"result":{"content":[{"type":"text","text":format!("charge {n}")}]}});
            match this.mode {
                Mode::Sse => Ok(sse(vec![
                    format!(
                        "event: message\ndata: {}\n\n",
                        json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}})
                    ),
                    format!("event: message\ndata: {result}\n\n"),
                ])),
                Mode::ServerError => Ok(Response::builder()
                    .status(StatusCode::INTERNAL_SERVER_ERROR)
                    .body(body("boom"))
                    .unwrap()),
                _ => Ok(json_ok(result.to_string())),
            }
        })
    }
}

fn sse(events: Vec<String>) -> Response<UpBody> {
    let stream = futures_util::stream::iter(
        events
            .into_iter()
            .map(|e| Ok::<_, BoxError>(http_body::Frame::data(Bytes::from(e)))),
    );
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(http_body_util::StreamBody::new(stream).boxed_unsync())
        .unwrap()
}

fn layer() -> IdempotencyLayer {
    let dedup = Deduplicator::new(EngineConfig::default(), Arc::new(MemoryStore::new()));
    IdempotencyLayer::new(dedup).namespace("test")
}

fn call(id: u64, key: &str, amount: u64) -> Request<Full<Bytes>> {
    post(
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"charge","arguments":{"amount":amount},"idempotencyKey":key}}),
        None,
    )
}

fn post(message: Value, token: Option<&str>) -> Request<Full<Bytes>> {
    let mut builder = Request::post("/mcp")
        .header("content-type", "application/json")
        .header("mcp-method", message["method"].as_str().unwrap_or(""));
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    builder
        .body(Full::new(Bytes::from(message.to_string())))
        .unwrap()
}

async fn send<S>(service: &mut S, request: Request<Full<Bytes>>) -> (StatusCode, String)
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResponseBody>>,
    S::Error: std::fmt::Debug,
{
    let response = service.call(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test]
async fn executes_once_and_replays_under_the_new_id() {
    let server = FakeServer::new(Mode::Json);
    let mut service = layer().layer(server.clone());
    let (status, first) = send(&mut service, call(1, "k1", 10)).await;
    assert_eq!(status, StatusCode::OK);
    let (_, again) = send(&mut service, call(2, "k1", 10)).await;
    assert_eq!(server.executed(), 1);
    let (first, again) = (parse(&first), parse(&again));
    assert_eq!(first["result"], again["result"]);
    assert_eq!(again["id"], 2);
    // The upstream saw the key in _meta, not in params.
    let forwarded = server.last_request.lock().unwrap().clone().unwrap();
    assert!(forwarded["params"].get("idempotencyKey").is_none());
    assert_eq!(
        forwarded["params"]["_meta"]["mcp-idem/idempotencyKey"],
        "k1"
    );

    let (_, conflict) = send(&mut service, call(3, "k1", 11)).await;
    assert_eq!(
        parse(&conflict)["error"]["data"]["type"],
        "idempotency_key_conflict"
    );
    assert_eq!(server.executed(), 1);
}

#[tokio::test]
async fn sse_answers_stream_through_and_the_final_response_is_recorded() {
    let server = FakeServer::new(Mode::Sse);
    let mut service = layer().layer(server.clone());
    let response = service.call(call(1, "k1", 10)).await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(text.contains("notifications/progress"), "{text}");
    assert!(text.contains("charge 1"), "{text}");

    let (status, replay) = send(&mut service, call(2, "k1", 10)).await;
    assert_eq!(status, StatusCode::OK);
    let replay = parse(&replay);
    assert_eq!(replay["id"], 2);
    assert_eq!(replay["result"]["content"][0]["text"], "charge 1");
    assert_eq!(server.executed(), 1);
}

#[tokio::test]
async fn a_client_that_disconnects_gets_the_outcome_on_retry() {
    let mut server = FakeServer::new(Mode::Sse);
    server.delay = Duration::from_millis(300);
    let mut service = layer().layer(server.clone());
    // The client gives up before the upstream answers: its request future is dropped.
    let attempt =
        tokio::time::timeout(Duration::from_millis(50), service.call(call(1, "k1", 10))).await;
    assert!(attempt.is_err(), "the first attempt must time out");
    let (_, busy) = send(&mut service, call(2, "k1", 10)).await;
    assert_eq!(
        parse(&busy)["error"]["data"]["type"],
        "idempotency_key_in_progress"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (_, replay) = send(&mut service, call(3, "k1", 10)).await;
    assert_eq!(parse(&replay)["result"]["content"][0]["text"], "charge 1");
    assert_eq!(server.executed(), 1);
}

#[tokio::test]
async fn unreachable_upstream_releases_the_claim() {
    let layer = layer();
    let mut service = layer.layer(FakeServer::new(Mode::Unreachable));
    let (status, body) = send(&mut service, call(1, "k1", 10)).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(parse(&body)["id"], 1);
    // The key is free again: a retry through a healthy upstream runs.
    let healthy = FakeServer::new(Mode::Json);
    let mut service = layer.layer(healthy.clone());
    let (_, _) = send(&mut service, call(2, "k1", 10)).await;
    assert_eq!(healthy.executed(), 1);
}

#[tokio::test]
async fn claims_are_released_after_an_upstream_refusal_and_kept_unknown_after_a_crash() {
    let dedup = Deduplicator::new(EngineConfig::default(), Arc::new(MemoryStore::new()));
    let layer = IdempotencyLayer::new(dedup).namespace("test");

    let mut refusing = layer.layer(FakeServer::new(Mode::BadRequest));
    let (status, _) = send(&mut refusing, call(1, "k1", 10)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let healthy = FakeServer::new(Mode::Json);
    let mut service = layer.layer(healthy.clone());
    send(&mut service, call(2, "k1", 10)).await;
    assert_eq!(healthy.executed(), 1, "a refused call leaves its key free");

    let failing = FakeServer::new(Mode::ServerError);
    let mut service = layer.layer(failing.clone());
    let (status, _) = send(&mut service, call(3, "k2", 10)).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let mut service = layer.layer(healthy.clone());
    let (_, retry) = send(&mut service, call(4, "k2", 10)).await;
    assert_eq!(
        parse(&retry)["error"]["data"]["type"],
        "idempotency_outcome_unknown"
    );
    assert_eq!(
        healthy.executed(),
        1,
        "an HTTP 500 may have run the tool: never again"
    );
}

#[tokio::test]
async fn discovery_results_get_the_capability_json_and_sse() {
    for mode in [Mode::Json, Mode::Sse] {
        let mut service = layer().layer(FakeServer::new(mode));
        let discover = post(
            json!({"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}),
            None,
        );
        let (_, body) = send(&mut service, discover).await;
        let message = match mode {
            Mode::Sse => {
                let data = body
                    .lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .unwrap()
                    .to_owned();
                parse(&data)
            }
            _ => parse(&body),
        };
        assert_eq!(
            message["result"]["capabilities"]["tools"],
            json!({"listChanged": true, "idempotency": {}}),
            "{mode:?}"
        );
    }
}

#[tokio::test]
async fn principals_are_isolated_and_credentials_required() {
    let server = FakeServer::new(Mode::Json);
    let mut service = layer().scope_by(ScopeBy::Bearer).layer(server.clone());
    let keyed = |id, token| {
        post(
            json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"charge","arguments":{"amount":1},"idempotencyKey":"shared"}}),
            token,
        )
    };
    let (status, _) = send(&mut service, keyed(1, None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(server.executed(), 0);

    let (_, alice) = send(&mut service, keyed(2, Some("alice-token"))).await;
    let (_, bob) = send(&mut service, keyed(3, Some("bob-token"))).await;
    assert_eq!(
        server.executed(),
        2,
        "the same key of two principals runs twice"
    );
    assert_ne!(parse(&alice)["result"], parse(&bob)["result"]);
    let (_, alice_again) = send(&mut service, keyed(4, Some("alice-token"))).await;
    assert_eq!(parse(&alice_again)["result"], parse(&alice)["result"]);
    assert_eq!(server.executed(), 2);
}

#[tokio::test]
async fn other_messages_pass_through_and_big_bodies_are_refused() {
    let server = FakeServer::new(Mode::Json);
    let mut service = layer().max_body_bytes(1024).layer(server.clone());
    let notification = post(
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        None,
    );
    let (status, _) = send(&mut service, notification).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let unkeyed = || {
        post(
            json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{}}}),
            None,
        )
    };
    send(&mut service, unkeyed()).await;
    send(&mut service, unkeyed()).await;
    assert_eq!(
        server.executed(),
        2,
        "calls without a key are not deduplicated"
    );
    let big = post(
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{"pad":"x".repeat(2000)},"idempotencyKey":"k"}}),
        None,
    );
    let (status, _) = send(&mut service, big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(server.executed(), 2);
}

#[tokio::test]
async fn a_body_that_never_finishes_gets_408_and_is_not_forwarded() {
    let server = FakeServer::new(Mode::Json);
    let mut service = layer()
        .body_timeout(Duration::from_millis(100))
        .layer(server.clone());
    // A body that sends a few bytes and then nothing more, like a client trickling its request.
    let stream = futures_util::stream::iter([Ok::<_, Infallible>(http_body::Frame::data(
        Bytes::from_static(b"{\"jsonrpc\":"),
    ))])
    .chain(futures_util::stream::pending());
    let request = Request::post("/mcp")
        .header("content-type", "application/json")
        .body(http_body_util::StreamBody::new(stream))
        .unwrap();
    let response = service.call(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(server.executed(), 0);
    assert!(server.last_request.lock().unwrap().is_none());
}
