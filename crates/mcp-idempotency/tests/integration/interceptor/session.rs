//! Cancellation (absorbed or forwarded), the idempotency capability injected into `initialize` and
//! `server/discover` results, and the server going away with calls in flight.

use super::*;

fn expect_rewritten(action: ServerAction) -> String {
    match action {
        ServerAction::ForwardRewritten(message) => message,
        other => panic!("expected ForwardRewritten, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Cancellation
// ---------------------------------------------------------------------------------------------

fn cancelled(id: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id},"reason":"timeout"}}}}"#
    )
}

#[test]
fn cancellation_of_a_claimed_call_is_absorbed_by_default() {
    let mut h = Harness::new();
    let (claim, _) = h.execute(&call_line(r#""c-1""#, "k"));
    assert!(matches!(
        h.client(&cancelled(r#""c-1""#)),
        ClientAction::Absorb
    ));
    // The call still runs; its response is recorded but not sent to the client.
    let (recorded, outcome, forward) =
        expect_record(h.server(r#"{"jsonrpc":"2.0","id":"c-1","result":{"ok":true}}"#));
    assert_eq!(recorded, claim);
    assert_eq!(outcome, Outcome::Success(r#"{"ok":true}"#.into()));
    assert!(!forward);
}

#[test]
fn cancellation_can_be_forwarded_and_recorded_as_unknown() {
    let mut h = Harness::with(InterceptorConfig::default().cancel_policy(CancelPolicy::Forward));
    let (claim, _) = h.execute(&call_line("8", "k"));
    match h.client(&cancelled("8")) {
        ClientAction::RecordThenForward(recorded, Outcome::Unknown { .. }) => {
            assert_eq!(recorded, claim);
        }
        other => panic!("expected RecordThenForward, got {other:?}"),
    }
    assert!(!h.interceptor.has_calls_in_flight());
    // A late response is no longer the claimed call's.
    assert!(is_server_forward(
        &h.server(r#"{"jsonrpc":"2.0","id":8,"result":{}}"#)
    ));
}

#[test]
fn cancellation_of_anything_else_passes() {
    for policy in [CancelPolicy::Absorb, CancelPolicy::Forward] {
        let mut h = Harness::with(InterceptorConfig::default().cancel_policy(policy));
        h.execute(&call_line("1", "k"));
        for line in [
            cancelled("2"),
            cancelled(r#""1""#),
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#.into(),
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"reason":"x"}}"#
                .into(),
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":[1]}"#.into(),
        ] {
            assert!(is_forward(&h.client(&line)), "{policy:?} {line}");
        }
        assert!(h.interceptor.has_calls_in_flight());
    }
}

// ---------------------------------------------------------------------------------------------
// Capability injection
// ---------------------------------------------------------------------------------------------

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#;
const INITIALIZE_RESULT: &str = r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{"listChanged":true},"logging":{}},"serverInfo":{"name":"s","version":"1.0"},"instructions":"use \u00e9"}}"#;
const DISCOVER: &str = r#"{"jsonrpc":"2.0","id":"d-1","method":"server/discover","params":{}}"#;
const DISCOVER_RESULT: &str = r#"{"jsonrpc":"2.0","id":"d-1","result":{"resultType":"complete","supportedVersions":["2026-07-28","2025-11-25"],"capabilities":{"tools":{"listChanged":true},"resources":{}},"ttlMs":60000,"x-unknown":{"n":1.000},"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"s"}}}}"#;

#[test]
fn initialize_result_advertises_idempotency() {
    let mut h = Harness::new();
    assert!(is_forward(&h.client(INITIALIZE)));
    let rewritten = expect_rewritten(h.server(INITIALIZE_RESULT));
    let mut expected = parse(INITIALIZE_RESULT);
    expected["result"]["capabilities"]["tools"]["idempotency"] = json!({});
    assert_eq!(parse(&rewritten), expected);
}

#[test]
fn discover_result_advertises_idempotency_and_keeps_every_member() {
    let mut h = Harness::new();
    assert!(is_forward(&h.client(DISCOVER)));
    let rewritten = expect_rewritten(h.server(DISCOVER_RESULT));
    let mut expected = parse(DISCOVER_RESULT);
    expected["result"]["capabilities"]["tools"]["idempotency"] = json!({});
    assert_eq!(parse(&rewritten), expected);
    let result = raw_members(&raw_members(&rewritten)["result"]);
    assert_eq!(result["ttlMs"], "60000");
    assert_eq!(result["x-unknown"], r#"{"n":1.000}"#);
    assert_eq!(result["resultType"], r#""complete""#);
    // Only once per request.
    assert!(is_server_forward(&h.server(DISCOVER_RESULT)));
}

#[test]
fn no_capability_without_tools_or_for_other_results() {
    let mut h = Harness::new();
    // No tools capability.
    assert!(is_forward(&h.client(INITIALIZE)));
    assert!(is_server_forward(&h.server(
        r#"{"jsonrpc":"2.0","id":0,"result":{"capabilities":{"resources":{}}}}"#
    )));
    assert!(is_forward(&h.client(INITIALIZE)));
    assert!(is_server_forward(&h.server(
        r#"{"jsonrpc":"2.0","id":0,"result":{"capabilities":{"tools":true}}}"#
    )));
    // An error to initialize.
    assert!(is_forward(&h.client(INITIALIZE)));
    assert!(is_server_forward(&h.server(
        r#"{"jsonrpc":"2.0","id":0,"error":{"code":-32602,"message":"unsupported version"}}"#
    )));
    // A result with capabilities for a request that was not initialize or discover.
    assert!(is_forward(
        &h.client(r#"{"jsonrpc":"2.0","id":0,"method":"tools/list"}"#)
    ));
    assert!(is_server_forward(&h.server(INITIALIZE_RESULT)));
    // The id of a discover request, as a number rather than a string.
    assert!(is_forward(&h.client(DISCOVER)));
    assert!(is_server_forward(
        &h.server(&DISCOVER_RESULT.replace(r#""id":"d-1""#, r#""id":1"#))
    ));
    // A discover notification (no id) does not arm anything.
    assert!(is_forward(
        &h.client(r#"{"jsonrpc":"2.0","method":"server/discover"}"#)
    ));
    assert!(is_server_forward(&h.server(
        &DISCOVER_RESULT.replace(r#""id":"d-1""#, r#""id":null"#)
    )));
}

#[test]
fn no_capability_while_the_store_is_unusable() {
    let mut h = Harness::new();
    h.interceptor.set_store_usable(false);
    assert!(is_forward(&h.client(DISCOVER)));
    assert!(is_server_forward(&h.server(DISCOVER_RESULT)));

    h.interceptor.set_store_usable(true);
    assert!(is_forward(&h.client(DISCOVER)));
    expect_rewritten(h.server(DISCOVER_RESULT));

    // A decision alone changes nothing: the deduplicator owns the store's health and the driver
    // tells the interceptor (`deduplicator::failing_store::failing_claim_fails_closed`).
    let call = h.keyed(&call_line("1", "k"));
    let decision = h.decision(&call, |_| {
        Err(StoreError::Unavailable {
            message: "disk on fire".into(),
            source: None,
        })
    });
    let response = respond_json(h.interceptor.on_decision(call, decision));
    assert_eq!(response["error"]["code"], json!(-32603));
    assert_eq!(
        response["error"]["data"]["type"],
        json!("idempotency_store_unavailable")
    );
    assert!(is_forward(&h.client(INITIALIZE)));
    expect_rewritten(h.server(INITIALIZE_RESULT));
    h.interceptor.set_store_usable(false);
    h.execute(&call_line("2", "k"));
    assert!(is_forward(&h.client(INITIALIZE)));
    assert!(is_server_forward(&h.server(INITIALIZE_RESULT)));
}

// ---------------------------------------------------------------------------------------------
// The server going away
// ---------------------------------------------------------------------------------------------

#[test]
fn server_gone_orphans_calls_in_flight() {
    let mut h = Harness::new();
    let (running, _) = h.execute(&call_line("1", "k-running"));
    let (cancelled_claim, _) = h.execute(&call_line(r#""two""#, "k-cancelled"));
    assert!(matches!(
        h.client(&cancelled(r#""two""#)),
        ClientAction::Absorb
    ));
    h.execute(&call_line("3", "k-done"));
    expect_record(h.server(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#));

    let mut orphans = h.interceptor.on_server_gone("the MCP server exited");
    assert_eq!(orphans.len(), 2);
    orphans.sort_by_key(|orphan| orphan.claim.id().key.as_str().to_owned());
    assert_eq!(orphans[0].claim, cancelled_claim);
    assert_eq!(orphans[0].response, None);
    assert_eq!(orphans[1].claim, running);
    let response = parse(orphans[1].response.as_deref().unwrap());
    assert_eq!(response["jsonrpc"], json!("2.0"));
    assert_eq!(response["id"], json!(1));
    assert_eq!(response["error"]["code"], json!(-32603));
    assert_eq!(
        response["error"]["data"]["type"],
        json!("idempotency_outcome_unknown")
    );
    assert_eq!(
        response["error"]["data"]["idempotencyKey"],
        json!("k-running")
    );
    assert!(!h.interceptor.has_calls_in_flight());
    assert!(h.interceptor.on_server_gone("again").is_empty());
    // Late answers are not recorded.
    assert!(is_server_forward(
        &h.server(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#)
    ));
}

#[test]
fn server_gone_forgets_pending_discovery() {
    let mut h = Harness::new();
    assert!(is_forward(&h.client(DISCOVER)));
    assert!(h.interceptor.on_server_gone("gone").is_empty());
    assert!(is_server_forward(&h.server(DISCOVER_RESULT)));
}

// ---------------------------------------------------------------------------------------------
// The server's name
// ---------------------------------------------------------------------------------------------

#[test]
fn the_server_names_itself_in_its_initialize_result() {
    let mut h = Harness::new();
    assert_eq!(h.interceptor.server_name(), None);
    // A result with a name that answers no discovery request teaches nothing.
    assert!(is_server_forward(&h.server(INITIALIZE_RESULT)));
    assert_eq!(h.interceptor.server_name(), None);
    assert!(is_forward(&h.client(INITIALIZE)));
    let _ = expect_rewritten(h.server(INITIALIZE_RESULT));
    assert_eq!(h.interceptor.server_name(), Some("s"));
    // The first name stays.
    assert!(is_forward(&h.client(INITIALIZE)));
    let _ =
        expect_rewritten(h.server(&INITIALIZE_RESULT.replace(r#""name":"s""#, r#""name":"t""#)));
    assert_eq!(h.interceptor.server_name(), Some("s"));
}

#[test]
fn the_server_names_itself_in_its_discover_result_even_without_tools() {
    let mut h = Harness::new();
    assert!(is_forward(&h.client(DISCOVER)));
    let _ = expect_rewritten(h.server(DISCOVER_RESULT));
    assert_eq!(h.interceptor.server_name(), Some("s"));

    let mut h = Harness::new();
    assert!(is_forward(&h.client(INITIALIZE)));
    let no_tools = r#"{"jsonrpc":"2.0","id":0,"result":{"capabilities":{},"serverInfo":{"name":"pay\u006dents"}}}"#;
    assert!(is_server_forward(&h.server(no_tools)));
    assert_eq!(h.interceptor.server_name(), Some("payments"));
}

#[test]
fn a_result_without_a_string_name_names_nothing() {
    let mut h = Harness::new();
    for result in [
        r#"{"jsonrpc":"2.0","id":0,"result":{"capabilities":{"tools":{}}}}"#,
        r#"{"jsonrpc":"2.0","id":0,"result":{"capabilities":{"tools":{}},"serverInfo":{"name":7}}}"#,
        r#"{"jsonrpc":"2.0","id":0,"result":{"serverInfo":"s"}}"#,
        r#"{"jsonrpc":"2.0","id":0,"error":{"code":-32602,"message":"no"}}"#,
    ] {
        assert!(is_forward(&h.client(INITIALIZE)));
        let _ = h.server(result);
        assert_eq!(h.interceptor.server_name(), None, "{result}");
    }
}

// ---------------------------------------------------------------------------------------------
// Learning the server's name before a call (the gateway's own `server/discover`)
// ---------------------------------------------------------------------------------------------

/// The gateway's own request, from [`LearnName::Send`].
fn probe(step: LearnName) -> Value {
    match step {
        LearnName::Send(request) => serde_json::from_str(&request).unwrap(),
        other => panic!("expected a request to send, got {other:?}"),
    }
}

#[test]
fn the_gateway_asks_the_server_its_name_once_and_absorbs_the_answer() {
    let mut h = Harness::new();
    let request = probe(h.interceptor.learn_server_name());
    assert_eq!(request["method"], "server/discover");
    assert_eq!(request["id"], "mcp-idem/server-name-1");
    // Asked again while the answer is awaited: wait, nothing more is sent.
    assert_eq!(h.interceptor.learn_server_name(), LearnName::Wait);
    let answer = DISCOVER_RESULT.replace(r#""id":"d-1""#, r#""id":"mcp-idem/server-name-1""#);
    assert!(matches!(h.server(&answer), ServerAction::Absorb));
    assert_eq!(h.interceptor.server_name(), Some("s"));
    assert_eq!(h.interceptor.learn_server_name(), LearnName::Known);
    assert!(!h.interceptor.has_requests_in_flight());
}

#[test]
fn a_client_handshake_on_its_way_is_waited_for_instead_of_asking() {
    let mut h = Harness::new();
    assert!(is_forward(&h.client(INITIALIZE)));
    assert_eq!(h.interceptor.learn_server_name(), LearnName::Wait);
    let _ = expect_rewritten(h.server(INITIALIZE_RESULT));
    assert_eq!(h.interceptor.learn_server_name(), LearnName::Known);
}

#[test]
fn a_server_that_answers_without_its_name_fails_until_a_client_handshake_names_it() {
    let mut h = Harness::new();
    probe(h.interceptor.learn_server_name());
    let error = r#"{"jsonrpc":"2.0","id":"mcp-idem/server-name-1","error":{"code":-32601,"message":"Method not found"}}"#;
    assert!(matches!(h.server(error), ServerAction::Absorb));
    assert_eq!(h.interceptor.learn_server_name(), LearnName::Failed);
    // Not asked again; a client's `initialize` still names it.
    assert_eq!(h.interceptor.learn_server_name(), LearnName::Failed);
    assert!(is_forward(&h.client(INITIALIZE)));
    let _ = expect_rewritten(h.server(INITIALIZE_RESULT));
    assert_eq!(h.interceptor.learn_server_name(), LearnName::Known);
}

#[test]
fn the_probe_id_never_takes_one_a_client_request_uses() {
    let mut h = Harness::new();
    let taken = r#"{"jsonrpc":"2.0","id":"mcp-idem/server-name-1","method":"ping"}"#;
    assert!(is_forward(&h.client(taken)));
    let request = probe(h.interceptor.learn_server_name());
    assert_eq!(request["id"], "mcp-idem/server-name-2");
}
