//! A real rmcp Streamable HTTP server (stateless `StreamableHttpService` on axum) with
//! `IdempotencyLayer` in front: what a Rust server author writes to get SEP-3182 over HTTP.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcp_idempotency::http::principal::ScopeBy;
use mcp_idempotency::http::IdempotencyLayer;
use mcp_idempotency::store::MemoryStore;
use mcp_idempotency::{Deduplicator, EngineConfig};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{json, Value};

use crate::counter_server::Counter;

async fn post(url: &str, message: Value, token: &str) -> Value {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = http::Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {token}"))
        .header("mcp-method", message["method"].as_str().unwrap());
    if message["method"] != "initialize" {
        request = request.header("mcp-protocol-version", "2026-07-28");
    }
    if let Some(name) = message["params"]["name"].as_str() {
        request = request.header("mcp-name", name);
    }
    let request = request
        .body(Full::new(Bytes::from(message.to_string())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"))
}

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rmcp_http_server_behind_the_layer_gets_sep_3182() {
    let executions = Arc::new(AtomicU64::new(0));
    let counter = Counter::new(Arc::clone(&executions));
    let mcp = StreamableHttpService::new(
        move || Ok(counter.clone()),
        Arc::new(NeverSessionManager::default()),
        StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true),
    );

    // The one line that adds SEP-3182, records scoped by bearer token:
    let dedup = Deduplicator::new(EngineConfig::default(), Arc::new(MemoryStore::new()));
    let mcp = tower::ServiceBuilder::new()
        .layer(
            IdempotencyLayer::new(dedup)
                .namespace("counter")
                .scope_by(ScopeBy::Bearer),
        )
        .service(mcp);

    let app = axum::Router::new().route_service("/mcp", mcp);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let discover = post(
        &url,
        json!({"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta": meta()}}),
        "alice",
    )
    .await;
    assert_eq!(
        discover["result"]["capabilities"]["tools"]["idempotency"],
        json!({})
    );

    let call = |id: u64| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
               "params":{"_meta": meta(),"name":"bump","arguments":{},"idempotencyKey":"k-1"}})
    };
    let first = post(&url, call(2), "alice").await;
    let retry = post(&url, call(3), "alice").await;
    assert_eq!(first["result"], retry["result"], "{first} / {retry}");
    assert_eq!(retry["id"], 3);
    assert_eq!(executions.load(Ordering::SeqCst), 1);

    // Another principal's identical key is another record.
    let bob = post(&url, call(4), "bob").await;
    assert_eq!(bob["result"]["content"][0]["text"], "execution 2");
    assert_eq!(executions.load(Ordering::SeqCst), 2);
}
