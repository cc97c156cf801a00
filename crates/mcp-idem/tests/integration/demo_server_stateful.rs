//! `mcp-idem demo-server --http 127.0.0.1:0 --http-stateful`: the payment server with sessions,
//! as servers of the `initialize` era run, driven by plain POSTs and by rmcp's own HTTP client.
//!
//! What the server answers (checked below; abridged):
//!
//! ```text
//! POST /mcp {"method":"initialize",...}         -> 200 text/event-stream, Mcp-Session-Id: S
//!   (stderr: "session opened: S")
//! POST /mcp Mcp-Session-Id: S  notifications/initialized -> 202
//! POST /mcp Mcp-Session-Id: S  tools/list        -> 200 SSE, the four tools + confirm_charge
//! POST /mcp (no session id)   tools/list         -> 400
//! POST /mcp Mcp-Session-Id: unknown, or S after a restart -> 404
//! GET  /mcp Mcp-Session-Id: S                    -> 200 text/event-stream (held open)
//! tools/call confirm_charge -> the server sends elicitation/create on the call's stream;
//!   accept -> one ledger line and the charge_payment answer; decline -> {charged: false}
//! ```

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use mcp_idempotency::client::RmcpHttpClient;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult,
    ElicitationAction, ErrorData, Implementation, ProtocolVersion,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RequestContext, RoleClient};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ClientHandler;
use serde_json::{json, Value};

use crate::support::bridge_sessions::{assert_sessions_opened, sessions_opened, streams_opened};
use crate::support::common::{free_port, ledger_lines, TIMEOUT};
use crate::support::http::{ledger_in, legacy_post, sse_messages, HttpDemo, Raw};

fn initialize(id: u64, capabilities: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":capabilities,
        "clientInfo":{"name":"mcp-idem-tests","version":"0"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_opens_a_session_that_later_posts_carry_and_a_restart_forgets() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let listen = format!("127.0.0.1:{}", free_port());
    let server = HttpDemo::spawn_on(&listen, &ledger, &["--http-stateful"]);
    let raw = Raw::new(&server);

    let init = raw
        .send(legacy_post(&raw, None), &initialize(1, json!({})))
        .await;
    assert_eq!(init.status, http::StatusCode::OK, "{}", init.body);
    assert!(init.is_sse(), "{:?}", init.headers);
    let session = init
        .headers
        .get("mcp-session-id")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_else(|| panic!("no Mcp-Session-Id: {:?}", init.headers))
        .to_owned();
    assert_eq!(init.json()["result"]["protocolVersion"], "2025-06-18");
    assert!(init.json()["result"]["capabilities"]["tools"].is_object());

    let initialized = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
    let accepted = raw
        .send(legacy_post(&raw, Some(&session)), &initialized)
        .await;
    assert_eq!(accepted.status, http::StatusCode::ACCEPTED, "{accepted:?}");

    let list = json!({"jsonrpc":"2.0","id":2,"method":"tools/list"});
    let tools = raw.send(legacy_post(&raw, Some(&session)), &list).await;
    assert!(tools.is_sse(), "{tools:?}");
    let mut names: Vec<String> = tools.json()["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {}", tools.body))
        .iter()
        .map(|tool| tool["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "charge_payment",
            "confirm_charge",
            "get_balance",
            "noop",
            "work_1ms"
        ]
    );

    let call = json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{
        "name":"charge_payment","arguments":{"amount":7,"currency":"EUR"}}});
    let charged = raw.send(legacy_post(&raw, Some(&session)), &call).await;
    let charge_id = charged.charge_id().unwrap_or_else(|| panic!("{charged:?}"));
    assert_eq!(ledger_lines(&ledger).len(), 1);
    assert_eq!(ledger_lines(&ledger)[0]["chargeId"], charge_id.as_str());

    // The GET stream of the session: its head arrives, the body stays open.
    let get = http::Request::get(&raw.url)
        .header(http::header::HOST, &raw.authority)
        .header(http::header::ACCEPT, "text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-06-18")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let stream = tokio::time::timeout(TIMEOUT, raw.client.request(get))
        .await
        .expect("the GET head in time")
        .expect("a GET answer");
    assert_eq!(stream.status(), http::StatusCode::OK);
    assert!(stream.headers()[http::header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    drop(stream);
    let deadline = std::time::Instant::now() + TIMEOUT;
    while streams_opened(&server).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(streams_opened(&server), std::slice::from_ref(&session));

    // Without a session id, or with one the server never issued: refused.
    let missing = raw.send(legacy_post(&raw, None), &list).await;
    assert_eq!(missing.status, http::StatusCode::BAD_REQUEST, "{missing:?}");
    let unknown = raw.send(legacy_post(&raw, Some("no-such")), &list).await;
    assert_eq!(unknown.status, http::StatusCode::NOT_FOUND, "{unknown:?}");
    assert_sessions_opened(&server, std::slice::from_ref(&session));

    // Restarted on the same port, the server has forgotten the session.
    drop(server);
    let server = HttpDemo::spawn_on(&listen, &ledger, &["--http-stateful"]);
    let raw = Raw::new(&server);
    let forgotten = raw.send(legacy_post(&raw, Some(&session)), &list).await;
    assert_eq!(
        forgotten.status,
        http::StatusCode::NOT_FOUND,
        "{forgotten:?}"
    );
    let again = raw
        .send(legacy_post(&raw, None), &initialize(4, json!({})))
        .await;
    let renewed = again.headers["mcp-session-id"].to_str().unwrap().to_owned();
    assert_ne!(renewed, session);
    assert_sessions_opened(&server, &[renewed]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_charge_asks_on_the_calls_stream_and_charges_only_when_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &["--http-stateful"]);
    let raw = Raw::new(&server);
    let init = raw
        .send(
            legacy_post(&raw, None),
            &initialize(1, json!({"elicitation":{}})),
        )
        .await;
    let session = init.headers["mcp-session-id"].to_str().unwrap().to_owned();
    let initialized = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
    raw.send(legacy_post(&raw, Some(&session)), &initialized)
        .await;

    for (id, amount, action) in [(10, 5, "accept"), (11, 6, "decline")] {
        let call = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
            "name":"confirm_charge","arguments":{"amount":amount,"currency":"EUR"}}});
        let request = legacy_post(&raw, Some(&session))
            .body(Full::new(Bytes::from(call.to_string())))
            .unwrap();
        let response = tokio::time::timeout(TIMEOUT, raw.client.request(request))
            .await
            .expect("the call's head in time")
            .expect("an answer");
        assert_eq!(response.status(), http::StatusCode::OK);
        let mut body = response.into_body();
        let mut stream = String::new();
        let mut answered = false;
        let result = loop {
            let frame = tokio::time::timeout(TIMEOUT, http_body_util::BodyExt::frame(&mut body))
                .await
                .unwrap_or_else(|_| panic!("the stream stalled: {stream}"))
                .unwrap_or_else(|| panic!("the stream ended: {stream}"))
                .expect("a body frame");
            if let Ok(data) = frame.into_data() {
                stream.push_str(std::str::from_utf8(&data).unwrap());
            }
            let messages = sse_messages(&stream);
            if let Some(result) = messages.iter().find(|m| m["id"] == id) {
                break result.clone();
            }
            if answered {
                continue;
            }
            if let Some(question) = messages
                .iter()
                .find(|m| m["method"] == "elicitation/create")
            {
                assert_eq!(question["params"]["mode"], "form", "{question}");
                let text = question["params"]["message"].as_str().unwrap();
                assert!(text.contains(&format!("{amount} EUR")), "{question}");
                let answer = json!({"jsonrpc":"2.0","id":question["id"],
                    "result":{"action":action,"content":{}}});
                let posted = raw.send(legacy_post(&raw, Some(&session)), &answer).await;
                assert_eq!(posted.status, http::StatusCode::ACCEPTED, "{posted:?}");
                answered = true;
            }
        };
        assert!(
            answered,
            "no elicitation/create before the result: {stream}"
        );
        let structured = &result["result"]["structuredContent"];
        match action {
            "accept" => {
                assert_eq!(structured["amount"], amount, "{result}");
                let lines = ledger_lines(&ledger);
                assert_eq!(lines.len(), 1, "{lines:?}");
                assert_eq!(lines[0]["chargeId"], structured["chargeId"]);
            }
            _ => {
                assert_eq!(
                    structured,
                    &json!({"charged": false, "action": "decline"}),
                    "{result}"
                );
                assert_eq!(ledger_lines(&ledger).len(), 1, "decline charges nothing");
            }
        }
    }
}

/// An rmcp client that declares form elicitation and answers every question with `action`,
/// remembering the questions.
#[derive(Clone)]
struct Confirming {
    action: ElicitationAction,
    questions: Arc<Mutex<Vec<String>>>,
}

impl ClientHandler for Confirming {
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        if let ElicitRequestParams::FormElicitationParams { message, .. } = request {
            self.questions.lock().unwrap().push(message);
        }
        let mut result = ElicitResult::new(self.action.clone());
        if matches!(self.action, ElicitationAction::Accept) {
            result = result.with_content(json!({}));
        }
        Ok(result)
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::builder().enable_elicitation().build(),
            Implementation::new("mcp-idem-tests", "0"),
        )
        .with_protocol_version(ProtocolVersion::V_2025_06_18)
    }
}

fn confirm(amount: u64) -> CallToolRequestParams {
    let Value::Object(arguments) = json!({"amount": amount, "currency": "EUR"}) else {
        unreachable!()
    };
    CallToolRequestParams::new("confirm_charge").with_arguments(arguments)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rmcp_client_in_a_session_confirms_or_declines() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &["--http-stateful"]);
    for (action, amount, lines) in [
        (ElicitationAction::Accept, 5, 1),
        (ElicitationAction::Decline, 6, 1),
        (ElicitationAction::Cancel, 7, 1),
    ] {
        let handler = Confirming {
            action: action.clone(),
            questions: Arc::default(),
        };
        let transport = StreamableHttpClientTransport::with_client(
            RmcpHttpClient::new(None).expect("an HTTP client"),
            StreamableHttpClientTransportConfig::with_uri(server.url.clone()),
        );
        let client = tokio::time::timeout(
            TIMEOUT,
            handler
                .clone()
                .serve_with_lifecycle(transport, ClientLifecycleMode::Initialize),
        )
        .await
        .expect("initialize in time")
        .expect("initialize the stateful demo server");
        let result = tokio::time::timeout(TIMEOUT, client.call_tool(confirm(amount)))
            .await
            .expect("the call in time")
            .expect("confirm_charge");
        let result = serde_json::to_value(result).unwrap();
        assert_eq!(
            *handler.questions.lock().unwrap(),
            [format!("Charge {amount} EUR?")]
        );
        assert_eq!(ledger_lines(&ledger).len(), lines, "{action:?}: {result}");
        if matches!(action, ElicitationAction::Accept) {
            assert_eq!(
                ledger_lines(&ledger)[0]["chargeId"],
                result["structuredContent"]["chargeId"]
            );
        } else {
            assert_eq!(result["structuredContent"]["charged"], false, "{result}");
        }
        client.cancel().await.expect("close the session");
    }
    assert_eq!(sessions_opened(&server).len(), 3, "{}", server.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_charge_without_the_elicitation_capability_fails_and_charges_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &["--http-stateful"]);
    let raw = Raw::new(&server);
    let init = raw
        .send(legacy_post(&raw, None), &initialize(1, json!({})))
        .await;
    let session = init.headers["mcp-session-id"].to_str().unwrap().to_owned();
    let initialized = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
    raw.send(legacy_post(&raw, Some(&session)), &initialized)
        .await;
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
        "name":"confirm_charge","arguments":{"amount":5,"currency":"EUR"}}});
    let answer = raw.send(legacy_post(&raw, Some(&session)), &call).await;
    let error = &answer.json()["error"];
    assert!(
        error["message"].as_str().unwrap().contains("elicitation"),
        "{}",
        answer.body
    );
    assert!(ledger_lines(&ledger).is_empty());
}
