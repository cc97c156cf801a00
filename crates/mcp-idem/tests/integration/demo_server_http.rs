//! `mcp-idem demo-server --http 127.0.0.1:0`: the payment server over stateless Streamable HTTP,
//! driven by rmcp's own HTTP client and by plain POSTs.
//!
//! What the server answers (checked below; abridged):
//!
//! ```text
//! POST /mcp  MCP-Protocol-Version: 2026-07-28, Mcp-Method: server/discover
//!   {"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{...}}}
//! 200 application/json
//!   {"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","supportedVersions":[...,"2026-07-28"],
//!    "capabilities":{"tools":{}},...,"_meta":{"io.modelcontextprotocol/serverInfo":{...}}}}
//! POST /mcp  (legacy) {"jsonrpc":"2.0","id":2,"method":"initialize","params":{...}}
//! 200 application/json, no Mcp-Session-Id: stateless
//! POST /mcp  Host: evil.example   -> 403 (rmcp's DNS-rebinding guard)
//! GET /mcp                        -> 405, Allow: POST
//! ```

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use mcp_idempotency::client::RmcpHttpClient;
use rmcp::model::{CallToolRequestParams, ClientConfig, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{json, Value};

use crate::support::common::{ledger_lines, meta_2026, wait_for_ledger, TIMEOUT};
use crate::support::http::{content_type, ledger_in, HttpDemo, Raw};

async fn rmcp_client(url: &str) -> RunningService<RoleClient, ClientConfig> {
    let transport = StreamableHttpClientTransport::with_client(
        RmcpHttpClient::new(None).expect("an HTTP client"),
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()),
    );
    tokio::time::timeout(
        TIMEOUT,
        ClientConfig::default().serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        ),
    )
    .await
    .expect("discover in time")
    .expect("discover the demo server over HTTP")
}

fn charge(amount: u64) -> CallToolRequestParams {
    let arguments = json!({"amount": amount, "currency": "EUR"});
    let Value::Object(arguments) = arguments else {
        unreachable!()
    };
    CallToolRequestParams::new("charge_payment").with_arguments(arguments)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_client_discovers_lists_and_charges() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let client = rmcp_client(&server.url).await;

    let info = client.peer_info().expect("the server's info");
    assert_eq!(
        info.server_info.as_ref().map(|s| s.name.as_str()),
        Some("mcp-idem-demo-server")
    );
    let mut tools: Vec<String> = client
        .list_all_tools()
        .await
        .expect("tools/list")
        .into_iter()
        .map(|tool| tool.name.into_owned())
        .collect();
    tools.sort();
    assert_eq!(tools, ["charge_payment", "get_balance", "noop", "work_1ms"]);

    let result = client.call_tool(charge(100)).await.expect("charge");
    let result = serde_json::to_value(result).unwrap();
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        result["structuredContent"]["chargeId"],
        lines[0]["chargeId"]
    );
    assert_eq!(result["structuredContent"]["amount"], 100);

    // No idempotency here: the same call charges again.
    client.call_tool(charge(100)).await.expect("charge again");
    assert_eq!(ledger_lines(&ledger).len(), 2);
    let balance = client
        .call_tool(CallToolRequestParams::new("get_balance"))
        .await
        .expect("get_balance");
    let balance = serde_json::to_value(balance).unwrap();
    assert_eq!(balance["structuredContent"]["charges"], 2, "{balance}");
    assert_eq!(
        balance["structuredContent"]["sums"]["EUR"], 200,
        "{balance}"
    );

    client.cancel().await.expect("close the client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_charges_append_one_whole_line_each() {
    const CALLS: u64 = 24;
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let client = rmcp_client(&server.url).await;

    let mut calls = tokio::task::JoinSet::new();
    for amount in 1..=CALLS {
        let peer = client.peer().clone();
        calls.spawn(async move { peer.call_tool(charge(amount)).await });
    }
    let mut charge_ids = std::collections::HashSet::new();
    while let Some(result) = calls.join_next().await {
        let result = serde_json::to_value(result.unwrap().expect("charge")).unwrap();
        let id = result["structuredContent"]["chargeId"].as_str().unwrap();
        assert!(charge_ids.insert(id.to_owned()), "{id} answered twice");
    }
    // Every line parses (ledger_lines panics otherwise), one per call, none lost or torn.
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len() as u64, CALLS);
    let recorded: std::collections::HashSet<String> = lines
        .iter()
        .map(|line| line["chargeId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(recorded, charge_ids);
    let total: u64 = lines.iter().map(|l| l["amount"].as_u64().unwrap()).sum();
    assert_eq!(total, CALLS * (CALLS + 1) / 2);

    client.cancel().await.expect("close the client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_posts_discover_initialize_and_charge() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let raw = Raw::new(&server);

    let discover = raw
        .call(json!({"jsonrpc":"2.0","id":1,"method":"server/discover",
                     "params":{"_meta": meta_2026()}}))
        .await;
    assert_eq!(discover.status, 200, "{}", discover.body);
    assert!(content_type(&discover).starts_with("application/json"));
    let result = &discover.json()["result"];
    assert_eq!(result["resultType"], "complete", "{result}");
    assert!(result["capabilities"]["tools"].is_object(), "{result}");
    assert!(result["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&json!("2026-07-28")));

    // The legacy handshake is answered too, without a session.
    let init = raw
        .call(
            json!({"jsonrpc":"2.0","id":2,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},
            "clientInfo":{"name":"mcp-idem-tests","version":"0"}}}),
        )
        .await;
    assert_eq!(init.status, 200, "{}", init.body);
    assert_eq!(init.json()["result"]["protocolVersion"], "2025-06-18");
    assert!(init.headers.get("mcp-session-id").is_none());

    let charge = raw
        .call(
            json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{
            "_meta": meta_2026(), "name":"charge_payment",
            "arguments":{"amount": 7, "currency":"USD"}, "idempotencyKey":"k-1"}}),
        )
        .await;
    assert_eq!(charge.status, 200, "{}", charge.body);
    let charge = charge.json();
    assert_eq!(charge["id"], 3);
    let charge_id = charge["result"]["structuredContent"]["chargeId"].clone();
    assert_eq!(ledger_lines(&ledger)[0]["chargeId"], charge_id);

    // fail_after_charge: the side effect happened, the call failed.
    let failed = raw
        .call(
            json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{
            "_meta": meta_2026(), "name":"charge_payment",
            "arguments":{"amount": 1, "currency":"USD", "fail_after_charge": true}}}),
        )
        .await
        .json();
    assert_eq!(failed["error"]["code"], -32603, "{failed}");
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 2);
    assert_eq!(failed["error"]["data"]["chargeId"], lines[1]["chargeId"]);

    // Host 127.0.0.1 with any port passes rmcp's allow-list (above); a foreign Host does not.
    let message = json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{
        "_meta": meta_2026(), "name":"noop"}});
    let mut foreign = raw.post(&message);
    foreign
        .headers_mut()
        .unwrap()
        .insert(http::header::HOST, "evil.example".parse().unwrap());
    let refused = raw.send(foreign, &message).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    let mut localhost = raw.post(&message);
    let port = raw.authority.rsplit(':').next().unwrap();
    localhost.headers_mut().unwrap().insert(
        http::header::HOST,
        format!("localhost:{port}").parse().unwrap(),
    );
    assert_eq!(raw.send(localhost, &message).await.status, 200);

    // Stateless: no GET stream, no DELETE.
    let get = http::Request::get(&raw.url)
        .header(http::header::HOST, &raw.authority)
        .header(http::header::ACCEPT, "text/event-stream");
    assert_eq!(raw.send(get, &json!(null)).await.status, 405);
    assert_eq!(ledger_lines(&ledger).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sse_answers_with_an_event_stream() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &["--http-sse"]);
    let raw = Raw::new(&server);
    let answer = raw
        .call(
            json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "_meta": meta_2026(), "name":"charge_payment",
            "arguments":{"amount": 3, "currency":"EUR"}}}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(content_type(&answer).starts_with("text/event-stream"));
    let data: Vec<Value> = answer
        .body
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter(|data| !data.trim().is_empty())
        .map(|data| serde_json::from_str(data.trim()).unwrap())
        .collect();
    let response = data
        .iter()
        .find(|message| message["id"] == 1)
        .unwrap_or_else(|| panic!("no response in {}", answer.body));
    assert_eq!(
        response["result"]["structuredContent"]["chargeId"],
        ledger_lines(&ledger)[0]["chargeId"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_charge_still_charges() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let raw = Raw::new(&server);
    let message = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
        "_meta": meta_2026(), "name":"charge_payment",
        "arguments":{"amount": 9, "currency":"EUR", "delay_ms": 400}}});
    let request = raw
        .post(&message)
        .body(Full::new(Bytes::from(message.to_string())))
        .unwrap();
    // Give up after 100 ms: dropping the request future closes the connection.
    let gave_up =
        tokio::time::timeout(Duration::from_millis(100), raw.client.request(request)).await;
    assert!(gave_up.is_err(), "the charge takes 400 ms");
    assert!(ledger_lines(&ledger).is_empty());
    // The response is lost, the side effect is not: the lost-response case SEP-3182 is about.
    let path = ledger.clone();
    let lines = tokio::task::spawn_blocking(move || wait_for_ledger(&path, 1))
        .await
        .unwrap();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["amount"], 9);
}
