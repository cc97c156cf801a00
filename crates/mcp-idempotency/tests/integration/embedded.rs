//! `embedded`: the message-at-a-time driver the Python and TypeScript bindings carry messages
//! through. The same decisions as `mcp-idem wrap`, one connection per transport, records shared
//! by every connection of a gateway.

use std::sync::Arc;
use std::time::Duration;

use mcp_idempotency::embedded::{
    Answer, Connection, Embedded, FromClient, FromServer, Settings, SetupError,
};
use serde_json::{json, Value};

async fn gateway(options: &[(&str, &str)]) -> Embedded {
    let mut settings = Settings::new("embedded:test");
    settings.set("store", "memory").unwrap();
    for (name, value) in options {
        settings.set(name, value).unwrap();
    }
    settings.open().await.unwrap()
}

fn call(id: u64, key: &str, amount: u64) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "charge", "arguments": {"amount": amount}, "idempotencyKey": key}})
    .to_string()
}

pub(crate) fn answer(id: u64, text: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}})
        .to_string()
}

pub(crate) fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

pub(crate) fn forwarded(route: FromClient) -> Value {
    match route {
        FromClient::ForwardRewritten(message) => parse(&message),
        other => panic!("expected the call forwarded, got {other:?}"),
    }
}

pub(crate) fn responded(route: FromClient) -> Value {
    match route {
        FromClient::Respond(message) => parse(&message),
        other => panic!("expected an answer to the client, got {other:?}"),
    }
}

pub(crate) fn error_type(response: &Value) -> &str {
    response["error"]["data"]["type"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_claimed_call_is_recorded_and_replayed_on_another_connection() {
    let gateway = gateway(&[]).await;
    let first = gateway.connect(None);
    let to_server = forwarded(first.from_client(&call(1, "k", 5)).await);
    assert_eq!(to_server["params"]["_meta"]["mcp-idem/idempotencyKey"], "k");
    assert!(to_server["params"].get("idempotencyKey").is_none());
    assert_eq!(
        first.from_server(&answer(1, "ch_1")).await,
        FromServer::Forward
    );

    // A stateless HTTP retry arrives on a connection of its own.
    let retry = gateway.connect(None);
    let replay = responded(retry.from_client(&call(9, "k", 5)).await);
    assert_eq!(replay["id"], 9);
    assert_eq!(replay["result"]["content"][0]["text"], "ch_1");

    let conflict = responded(retry.from_client(&call(10, "k", 6)).await);
    assert_eq!(error_type(&conflict), "idempotency_key_conflict");
    assert_eq!(conflict["error"]["code"], -32602);
}

#[tokio::test]
async fn a_duplicate_of_a_running_call_is_rejected_at_once() {
    let gateway = gateway(&[]).await;
    let a = gateway.connect(None);
    let b = gateway.connect(None);
    let _ = forwarded(a.from_client(&call(1, "k", 5)).await);
    let busy = responded(b.from_client(&call(1, "k", 5)).await);
    assert_eq!(error_type(&busy), "idempotency_key_in_progress");
    assert!(a.has_calls_in_flight());
}

#[tokio::test]
async fn closing_with_a_call_in_flight_records_it_as_outcome_unknown() {
    let gateway = gateway(&[]).await;
    let connection = gateway.connect(None);
    let _ = forwarded(connection.from_client(&call(3, "k", 5)).await);
    let answers = connection.close().await;
    assert_eq!(answers.len(), 1);
    let orphan = parse(&answers[0]);
    assert_eq!(orphan["id"], 3);
    assert_eq!(error_type(&orphan), "idempotency_outcome_unknown");

    // Nothing new is claimed on a closed connection, and nothing reaches the server.
    let refused = responded(connection.from_client(&call(4, "k2", 5)).await);
    assert_eq!(error_type(&refused), "idempotency_shutting_down");

    // The retry is told the truth, never executed a second time.
    let retry = gateway.connect(None);
    let unknown = responded(retry.from_client(&call(5, "k", 5)).await);
    assert_eq!(error_type(&unknown), "idempotency_outcome_unknown");
}

#[tokio::test]
async fn a_connection_dropped_with_a_call_in_flight_abandons_its_claim() {
    let gateway = gateway(&[]).await;
    let connection = gateway.connect(None);
    let _ = forwarded(connection.from_client(&call(3, "k", 5)).await);
    drop(connection);
    let retry = gateway.connect(None);
    for _ in 0..100 {
        let answer = responded(retry.from_client(&call(4, "k", 5)).await);
        match error_type(&answer) {
            "idempotency_key_in_progress" => tokio::time::sleep(Duration::from_millis(10)).await,
            kind => return assert_eq!(kind, "idempotency_outcome_unknown"),
        }
    }
    panic!("the dropped claim was never abandoned");
}

#[tokio::test]
async fn discovery_results_advertise_the_capability_and_other_messages_pass() {
    let gateway = gateway(&[]).await;
    let connection = gateway.connect(None);
    let discover = r#"{"jsonrpc":"2.0","id":"d","method":"server/discover","params":{}}"#;
    assert_eq!(connection.from_client(discover).await, FromClient::Forward);
    let result = json!({"jsonrpc": "2.0", "id": "d", "result": {"capabilities": {"tools": {}}}});
    let FromServer::ForwardRewritten(rewritten) = connection.from_server(&result.to_string()).await
    else {
        panic!("the discovery result was not rewritten")
    };
    assert_eq!(
        parse(&rewritten)["result"]["capabilities"]["tools"]["idempotency"],
        json!({})
    );
    let unkeyed = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x"}}"#;
    assert_eq!(connection.from_client(unkeyed).await, FromClient::Forward);
    assert_eq!(
        connection.from_server(&answer(2, "x")).await,
        FromServer::Forward
    );
}

#[tokio::test]
async fn an_absorbed_cancellation_still_records_the_outcome() {
    let gateway = gateway(&[]).await;
    let connection = gateway.connect(None);
    let _ = forwarded(connection.from_client(&call(7, "k", 5)).await);
    let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#;
    assert_eq!(connection.from_client(cancel).await, FromClient::Drop);
    assert_eq!(
        connection.from_server(&answer(7, "ch_7")).await,
        FromServer::Drop
    );
    let replay = responded(connection.from_client(&call(8, "k", 5)).await);
    assert_eq!(replay["result"]["content"][0]["text"], "ch_7");
}

#[tokio::test]
async fn principals_keep_their_records_apart() {
    let gateway = gateway(&[]).await;
    let alice = gateway.connect(Some("alice"));
    let _ = forwarded(alice.from_client(&call(1, "k", 5)).await);
    let _ = alice.from_server(&answer(1, "alice's")).await;
    let bob = gateway.connect(Some("bob"));
    let _ = forwarded(bob.from_client(&call(1, "k", 6)).await);
}

#[tokio::test]
async fn limits_come_from_wraps_option_names() {
    let gateway = gateway(&[("max-key-bytes", "4"), ("max_argument_bytes", "16")]).await;
    let connection = gateway.connect(None);
    let long_key = responded(connection.from_client(&call(1, "12345", 5)).await);
    assert_eq!(error_type(&long_key), "idempotency_key_invalid");
    let big = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"name": "charge", "arguments": {"memo": "x".repeat(64)}, "idempotencyKey": "k"}});
    let too_large = responded(connection.from_client(&big.to_string()).await);
    assert_eq!(error_type(&too_large), "idempotency_arguments_too_large");
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_store_that_is_down_at_start_is_a_setup_error() {
    let mut settings = Settings::new("embedded:test");
    settings
        .set("store", "postgres://postgres@127.0.0.1:1/test")
        .unwrap();
    let err = settings.open().await.unwrap_err();
    assert!(
        matches!(err, SetupError::Store { url: Some(_), .. }),
        "{err:?}"
    );
    assert_eq!(err.error_type(), "idempotency_store_unavailable");
    assert_eq!(err.code(), -32603);
    assert!(
        err.to_string()
            .starts_with("cannot open the record store postgres://postgres@127.0.0.1:1/test: "),
        "{err}"
    );
}

/// A client's message handed over as a binding does: decided at once when it can be.
fn client_now(connection: &Arc<Connection>, message: &str) -> Answer<FromClient> {
    let received = connection.receive(message);
    let may_wait = received.may_wait();
    let deciding = Arc::clone(connection);
    connection.answer(async move { deciding.decide(received).await }, may_wait)
}

/// A server's message handed over as a binding does.
fn server_now(connection: &Arc<Connection>, message: &str) -> Answer<FromServer> {
    let deciding = Arc::clone(connection);
    let message = message.to_owned();
    connection.answer(async move { deciding.from_server(&message).await }, false)
}

/// The answer, and whether it came at once (else it is awaited on the runtime).
fn settled<T>(runtime: &tokio::runtime::Runtime, answer: Answer<T>) -> (T, bool) {
    match answer {
        Answer::Ready(value) => (value, true),
        Answer::Pending(later) => (runtime.block_on(later), false),
    }
}

/// `store-io = inline`: a claim and a completion that wait on SQLite are run to their end on the
/// binding's thread (no hand-off to the runtime), with the same replay and conflict as under the
/// default, where they are handed to the runtime.
#[cfg(feature = "sqlite")]
#[test]
fn inline_store_io_runs_sqlite_on_the_callers_thread_with_the_same_answers() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for store_io in ["runtime", "inline"] {
        let mut settings = Settings::new(format!("embedded:{store_io}"));
        let file = dir.path().join(format!("{store_io}.sqlite3"));
        settings
            .set("store", &format!("sqlite:{}", file.display()))
            .unwrap();
        settings.set("store_io", store_io).unwrap();
        let gateway = runtime.block_on(settings.open()).unwrap();
        // The binding's thread, inside the runtime's context but not one of its workers.
        let _entered = runtime.enter();
        let inline = store_io == "inline";
        let first = Arc::new(gateway.connect(None));
        let (claimed, at_once) = settled(&runtime, client_now(&first, &call(1, "k", 5)));
        assert_eq!(
            forwarded(claimed)["params"]["_meta"]["mcp-idem/idempotencyKey"],
            "k"
        );
        assert_eq!(at_once, inline, "the claim under store-io = {store_io}");
        let (recorded, at_once) = settled(&runtime, server_now(&first, &answer(1, "ch_1")));
        assert_eq!(recorded, FromServer::Forward);
        assert_eq!(
            at_once, inline,
            "the completion under store-io = {store_io}"
        );

        let retry = Arc::new(gateway.connect(None));
        let (replayed, _) = settled(&runtime, client_now(&retry, &call(2, "k", 5)));
        assert_eq!(responded(replayed)["result"]["content"][0]["text"], "ch_1");
        let (conflict, _) = settled(&runtime, client_now(&retry, &call(3, "k", 6)));
        assert_eq!(error_type(&responded(conflict)), "idempotency_key_conflict");
    }
}

#[tokio::test]
async fn inline_store_io_is_refused_for_a_network_store() {
    let mut settings = Settings::new("embedded:test");
    settings.set("store", "redis://127.0.0.1:1").unwrap();
    settings.set("storeIo", "inline").unwrap();
    let err = settings.open().await.unwrap_err();
    assert_eq!(err.error_type(), "idempotency_invalid_option");
    // Named as it was given.
    assert!(
        err.to_string()
            .starts_with("storeIo: only the sqlite: and memory stores run on the host's thread"),
        "{err}"
    );
    let mut settings = Settings::new("embedded:test");
    assert!(settings.set("store-io", "elsewhere").is_err());
}

/// With `tools = "suggested"`, a connection asks the host to list the server's tools (every page)
/// before it decides a `tools/call`, and keeps the answers to itself; a key-less retry of a tool
/// that may change things is then replayed on a new connection, a read-only tool left alone.
#[tokio::test]
async fn suggested_policies_need_no_client_to_list_the_tools() {
    let gateway = gateway(&[("tools", "suggested")]).await;
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}, "progressToken": 1});
    let keyless = |id: u64, name: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"_meta": meta, "name": name, "arguments": {"amount": 5}}})
        .to_string()
    };
    let pages = [
        json!({"tools": [{"name": "charge", "inputSchema": {"type": "object"}}],
               "nextCursor": "page-2"}),
        json!({"tools": [{"name": "balance", "annotations": {"readOnlyHint": true}}]}),
    ];
    let first = gateway.connect(None);
    let message = keyless(1, "charge");
    for (page, result) in pages.iter().enumerate() {
        let asked = parse(&first.tools_request(&message).expect("a tools/list to run"));
        assert_eq!(asked["method"], "tools/list");
        // The protocol members of the call's `_meta`, and no other.
        assert_eq!(
            asked["params"]["_meta"],
            json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                   "io.modelcontextprotocol/clientCapabilities": {}})
        );
        let cursor = asked["params"].get("cursor").cloned();
        assert_eq!(cursor, (page == 1).then(|| json!("page-2")), "{asked}");
        let listed = json!({"jsonrpc": "2.0", "id": asked["id"], "result": result});
        assert_eq!(
            first.from_server(&listed.to_string()).await,
            FromServer::Drop
        );
    }
    assert_eq!(first.tools_request(&message), None);
    assert!(matches!(
        first.from_client(&message).await,
        FromClient::ForwardRewritten(_)
    ));
    assert_eq!(
        first.from_server(&answer(1, "ch_1")).await,
        FromServer::Forward
    );

    // Known now: a new connection asks for nothing, and the retry is the first call's replay.
    let retry = gateway.connect(None);
    assert_eq!(retry.tools_request(&keyless(2, "charge")), None);
    let replay = responded(retry.from_client(&keyless(2, "charge")).await);
    assert_eq!(replay["result"]["content"][0]["text"], "ch_1");
    assert_eq!(replay["result"]["_meta"]["mcp-idem/replayed"], "window");
    for id in [3, 4] {
        assert_eq!(
            retry.from_client(&keyless(id, "balance")).await,
            FromClient::Forward
        );
        assert_eq!(
            retry.from_server(&answer(id, "0")).await,
            FromServer::Forward
        );
    }
}

/// Without `tools = "suggested"`, or for what is not a `tools/call`, nothing is listed.
#[tokio::test]
async fn without_the_suggestion_nothing_is_listed() {
    let plain = gateway(&[]).await.connect(None);
    assert_eq!(plain.tools_request(&call(1, "k", 5)), None);
    let suggested = gateway(&[("tools", "suggested")]).await.connect(None);
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string();
    assert_eq!(suggested.tools_request(&ping), None);
}
