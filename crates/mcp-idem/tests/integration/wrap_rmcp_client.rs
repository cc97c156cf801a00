//! The case SEP-3182 exists for, with a real MCP client: rmcp 3.11 starts
//! `mcp-idem wrap -- mcp-idem demo-server` as a child process, sends a keyed `tools/call` with a
//! 300 ms timeout, gives up (rmcp then sends `notifications/cancelled`), and retries with the same
//! key. The charge runs once and the retry gets its original outcome.
//!
//! rmcp cannot send `idempotencyKey` through its typed `CallToolRequestParams` (no catch-all: the
//! field is dropped), so the call goes out as a `CustomRequest("tools/call", …)`; the reply parses
//! as a `CallToolResult`. rmcp's typed peer info drops `tools.idempotency` too, so the discovery
//! result is checked on the wire: `tee` on both sides of `wrap` records what rmcp sent and received,
//! and a second `tee` records what the upstream received.

use std::fs::File;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rmcp::model::{ClientRequest, CustomRequest, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, PeerRequestOptions, ServiceError};
use rmcp::transport::TokioChildProcess;
use serde_json::{json, Value};

use crate::support::common::ledger_lines;
use crate::support::wrap::{captured, sh_join, sh_quote, Sandbox, EXE};

/// What each `tee` recorded.
struct Captures {
    /// What rmcp sent to `wrap`.
    sent: PathBuf,
    /// What `wrap` sent back to rmcp.
    received: PathBuf,
    /// What the demo server received from `wrap`.
    upstream: PathBuf,
}

/// `sh -c "tee SENT | mcp-idem wrap --store S -- sh -c 'tee UPSTREAM | mcp-idem demo-server
/// --ledger L' | tee RECEIVED"`, as an rmcp child-process transport.
fn spawn_wrapped(sandbox: &Sandbox) -> (TokioChildProcess, Captures) {
    let captures = Captures {
        sent: sandbox.path("sent.jsonl"),
        received: sandbox.path("received.jsonl"),
        upstream: sandbox.path("upstream.jsonl"),
    };
    let demo = format!(
        "tee {} | {} demo-server --ledger {}",
        sh_quote(&captures.upstream),
        sh_quote(EXE),
        sh_quote(sandbox.ledger())
    );
    let store = sandbox.store();
    let wrap = sh_join(&[EXE, "wrap", "--store", &store, "--", "sh", "-c", &demo]);
    let script = format!(
        "tee {} | {wrap} | tee {}",
        sh_quote(&captures.sent),
        sh_quote(&captures.received)
    );
    let mut command = tokio::process::Command::new("sh");
    command.arg("-c").arg(script).env("MCP_IDEM_LOG", "warn");
    let stderr = File::create(sandbox.path("wrap.stderr")).unwrap();
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(stderr)
        .spawn()
        .expect("spawn the wrapped server");
    (transport, captures)
}

fn keyed_charge(key: &str) -> ClientRequest {
    ClientRequest::CustomRequest(CustomRequest::new(
        "tools/call",
        Some(json!({
            "name": "charge_payment",
            "arguments": {"amount": 4200, "currency": "usd", "delay_ms": 1500},
            "idempotencyKey": key,
        })),
    ))
}

async fn timed_out_call_then_retry(lifecycle: ClientLifecycleMode, discovery_method: &str) {
    let sandbox = Sandbox::new();
    let (transport, captures) = spawn_wrapped(&sandbox);
    let client = tokio::time::timeout(
        Duration::from_secs(20),
        ().serve_with_lifecycle(transport, lifecycle),
    )
    .await
    .expect("connect in time")
    .expect("connect to the wrapped server");
    let info = client.peer_info().expect("the server's info");
    assert_eq!(
        info.server_info.as_ref().map(|server| server.name.as_str()),
        Some("mcp-idem-demo-server")
    );
    assert!(info.capabilities.tools.is_some());

    let key = "rmcp-order-1";
    let started = Instant::now();
    let first = client
        .send_request_with_option(
            keyed_charge(key),
            PeerRequestOptions::with_timeout(Duration::from_millis(300)),
        )
        .await
        .expect("send the call");
    let first_id = serde_json::to_value(&first.id).unwrap();
    let timed_out = first.await_response().await;
    assert!(
        matches!(timed_out, Err(ServiceError::Timeout { .. })),
        "{timed_out:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(1200));

    // Retry with the same key as a client should: while the first call runs, `wrap` answers
    // idempotency_key_in_progress with retryAfterMs; then the recorded outcome.
    let mut in_progress = 0;
    let result = loop {
        assert!(started.elapsed() < Duration::from_secs(15), "no outcome");
        let retry = client
            .send_request_with_option(
                keyed_charge(key),
                PeerRequestOptions::with_timeout(Duration::from_secs(5)),
            )
            .await
            .expect("send the retry");
        match retry.await_response().await {
            Ok(result) => break serde_json::to_value(result).unwrap(),
            Err(ServiceError::McpError(error)) => {
                let data = error.data.clone().unwrap_or_default();
                assert_eq!(data["type"], "idempotency_key_in_progress", "{error:?}");
                assert_eq!(data["idempotencyKey"], key);
                in_progress += 1;
                let after = data["retryAfterMs"].as_u64().expect("retryAfterMs");
                tokio::time::sleep(Duration::from_millis(after.min(1000))).await;
            }
            Err(other) => panic!("retry failed: {other}"),
        }
    };
    assert!(in_progress >= 1, "the first retry came while the call ran");
    assert!(started.elapsed() >= Duration::from_millis(1500));

    let lines = ledger_lines(&sandbox.ledger());
    assert_eq!(lines.len(), 1, "one charge: {lines:?}");
    assert_eq!(
        result["structuredContent"]["chargeId"], lines[0]["chargeId"],
        "the retry got the original outcome: {result}"
    );
    assert_eq!(result["structuredContent"]["amount"], 4200);

    // Close stdin; everything exits and the captures are complete.
    client.cancel().await.expect("close the client");

    // rmcp really cancelled the timed-out call ...
    let sent = captured(&captures.sent);
    assert!(
        sent.iter()
            .any(|message| message["method"] == "notifications/cancelled"
                && message["params"]["requestId"] == first_id),
        "rmcp sent notifications/cancelled for request {first_id}: {sent:?}"
    );
    // ... and `wrap` absorbed it: the upstream ran the call once and never saw the cancellation.
    let upstream = captured(&captures.upstream);
    let methods: Vec<&str> = upstream
        .iter()
        .filter_map(|message| message["method"].as_str())
        .collect();
    assert_eq!(
        methods.iter().filter(|m| **m == "tools/call").count(),
        1,
        "{upstream:?}"
    );
    assert!(
        !methods.contains(&"notifications/cancelled"),
        "{upstream:?}"
    );
    // The outcome recorded for the cancelled call was not sent to rmcp (it gave up on it).
    let received = captured(&captures.received);
    assert!(
        received
            .iter()
            .all(|message| message["id"] != first_id || message.get("result").is_none()),
        "{received:?}"
    );

    // What rmcp received at discovery carried the capability, though its typed view drops it.
    let discovery_id = sent
        .iter()
        .find(|message| message["method"] == discovery_method)
        .map(|message| message["id"].clone())
        .expect("a discovery request");
    let discovery: &Value = received
        .iter()
        .find(|message| message["id"] == discovery_id && message.get("result").is_some())
        .expect("a discovery result");
    assert_eq!(
        discovery["result"]["capabilities"]["tools"]["idempotency"],
        json!({}),
        "{discovery}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_legacy_client_times_out_then_retries_and_gets_the_original_outcome() {
    timed_out_call_then_retry(ClientLifecycleMode::Initialize, "initialize").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_2026_client_times_out_then_retries_and_gets_the_original_outcome() {
    timed_out_call_then_retry(
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
        "server/discover",
    )
    .await;
}
