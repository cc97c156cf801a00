//! A real rmcp Streamable HTTP server (stateless `StreamableHttpService` on axum) with
//! `IdempotencyLayer` in front: what a Rust server author writes to get SEP-3182 over HTTP, and
//! the tools' key policies for calls that carry no SEP key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcp_idempotency::http::principal::ScopeBy;
use mcp_idempotency::http::IdempotencyLayer;
use mcp_idempotency::policy::ToolPolicies;
use mcp_idempotency::store::MemoryStore;
use mcp_idempotency::{Deduplicator, EngineConfig, REPLAYED_META};
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

/// The counter server on rmcp's stateless Streamable HTTP, behind `layer`, on a free port: its
/// URL.
async fn serve(executions: &Arc<AtomicU64>, layer: IdempotencyLayer) -> String {
    let counter = Counter::new(Arc::clone(executions));
    let mcp = StreamableHttpService::new(
        move || Ok(counter.clone()),
        Arc::new(NeverSessionManager::default()),
        StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true),
    );
    let mcp = tower::ServiceBuilder::new().layer(layer).service(mcp);
    let app = axum::Router::new().route_service("/mcp", mcp);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rmcp_http_server_behind_the_layer_gets_sep_3182() {
    let executions = Arc::new(AtomicU64::new(0));
    // The one line that adds SEP-3182, records scoped by bearer token:
    let dedup = Deduplicator::new(EngineConfig::default(), Arc::new(MemoryStore::new()));
    let layer = IdempotencyLayer::new(dedup)
        .namespace("counter")
        .scope_by(ScopeBy::Bearer);
    let url = serve(&executions, layer).await;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_from_policy_protects_an_rmcp_http_servers_calls_without_a_key() {
    let executions = Arc::new(AtomicU64::new(0));
    let policies = ToolPolicies::from_json(&json!({"charge": {"key-from": ["/order_id"]}}))
        .unwrap()
        .with_meta_key("io.mcp-gateway/idempotency-key")
        .unwrap();
    let dedup = Deduplicator::new(EngineConfig::default(), Arc::new(MemoryStore::new()));
    let layer = IdempotencyLayer::new(dedup)
        .namespace("counter")
        .scope_by(ScopeBy::Bearer)
        .tool_policies(policies);
    let url = serve(&executions, layer).await;

    let charge = |id: u64, amount: u64, key: Option<&str>| {
        let mut params = json!({"_meta": meta(), "name": "charge",
                                "arguments": {"order_id": "ord-1", "amount": amount}});
        if let Some(key) = key {
            params["idempotencyKey"] = json!(key);
        }
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    };
    let first = post(&url, charge(1, 5, None), "alice").await;
    assert_eq!(
        first["result"]["content"][0]["text"], "execution 1: 5 for ord-1",
        "{first}"
    );
    assert!(first["result"]["_meta"].get(REPLAYED_META).is_none());

    // A model-style retry: a new request with the same arguments and no key, then one with a
    // fresh SEP key of its own (as `bridge` sends for each attempt): both get the first charge.
    for (id, key) in [(2, None), (3, Some("attempt-2"))] {
        let retry = post(&url, charge(id, 5, key), "alice").await;
        assert_eq!(retry["id"], id);
        assert_eq!(retry["result"]["content"], first["result"]["content"]);
        assert_eq!(
            retry["result"]["_meta"][REPLAYED_META], "key-from",
            "{retry}"
        );
    }
    // The identifier with another amount: a conflict naming it, and nothing runs.
    let conflict = post(&url, charge(4, 6, None), "alice").await;
    assert_eq!(
        conflict["error"]["data"]["type"],
        "idempotency_key_conflict"
    );
    let message = conflict["error"]["message"].as_str().unwrap();
    assert!(message.contains(r#"/order_id = "ord-1""#), "{message}");
    assert_eq!(executions.load(Ordering::SeqCst), 1);

    // The `_meta` carrier named by `with_meta_key` is a client's key too.
    let bump = |id: u64| {
        let mut params = json!({"_meta": meta(), "name": "bump", "arguments": {}});
        params["_meta"]["io.mcp-gateway/idempotency-key"] = json!("gw-1");
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    };
    let bumped = post(&url, bump(5), "alice").await;
    assert_eq!(
        post(&url, bump(6), "alice").await["result"],
        bumped["result"]
    );
    assert_eq!(executions.load(Ordering::SeqCst), 2);
}
