//! Client requests: the facts of a keyed call handed to the engine, and what the server receives
//! (the key moved into `_meta` or kept; calls without a key and MRTR continuations untouched).

use super::*;

// ---------------------------------------------------------------------------------------------
// Keyed calls: the facts handed to the engine
// ---------------------------------------------------------------------------------------------

const RICH_ARGUMENTS: &str = r#"{ "amount": 1.0, "exact": 1.000, "big": 12345678901234567890123, "note": "caf\u00e9 \"q\" \\ \n", "nested": {"b": [1, 2.50, -0e0], "a": null} }"#;

#[test]
fn keyed_call_is_decided_with_its_exact_facts() {
    let mut h = Harness::new();
    let line = format!(
        r#"{{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {{"name": "charge\u005fpayment", "arguments": {RICH_ARGUMENTS}, "idempotencyKey": "order-\u0034\u0032"}}}}"#
    );
    let call = h.keyed(&line);
    let facts = call.tool_call();
    assert_eq!(facts.tool_name, "charge_payment");
    assert_eq!(facts.arguments, Some(RICH_ARGUMENTS));
    assert_eq!(facts.idempotency_key, Some(&json!("order-42")));
    assert!(!facts.mrtr_continuation);
    assert_eq!(call.id().as_json(), "7");
}

#[test]
fn a_key_named_with_escapes_is_found() {
    // The interceptor skips reading `params` when the text cannot name the key; `\u` escapes can.
    let mut h = Harness::new();
    let call = h.keyed(
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t","idempotency\u004bey":"k"}}"#,
    );
    assert_eq!(call.tool_call().idempotency_key, Some(&json!("k")));
    let call = h.keyed(
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"t","\u0069\u0064empotencyKey":"k2"}}"#,
    );
    assert_eq!(call.tool_call().idempotency_key, Some(&json!("k2")));
}

#[test]
fn absent_arguments_are_none() {
    let mut h = Harness::new();
    let call = h.keyed(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ping","idempotencyKey":"k"}}"#,
    );
    assert_eq!(call.tool_call().arguments, None);
    let call = h.keyed(
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ping","arguments":null,"idempotencyKey":"k"}}"#,
    );
    assert_eq!(call.tool_call().arguments, Some("null"));
}

#[test]
fn mrtr_continuation_fields_are_flagged() {
    let mut h = Harness::new();
    for (i, extra) in [
        r#""requestState":"opaque-state""#,
        r#""inputResponses":{"confirm":{"action":"accept"}}"#,
        r#""requestState":null"#,
        r#""requestState":"s","inputResponses":[]"#,
    ]
    .iter()
    .enumerate()
    {
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"t","arguments":{{}},"idempotencyKey":"k",{extra}}}}}"#
        );
        let call = h.keyed(&line);
        assert!(call.tool_call().mrtr_continuation, "{line}");
    }
    // A continuation need not repeat the tool name.
    let call = h.keyed(
        r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"idempotencyKey":"k","requestState":"s"}}"#,
    );
    assert!(call.tool_call().mrtr_continuation);
}

#[test]
fn invalid_keys_are_decided_and_rejected_by_the_engine() {
    let mut h = Harness::new();
    for (id, key) in [(1, "42"), (2, "null"), (3, r#""""#), (4, r#"{"k":1}"#)] {
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"t","idempotencyKey":{key}}}}}"#
        );
        let call = h.keyed(&line);
        let decision = h.decision(&call, |_| panic!("an invalid key must not reach the store"));
        let Decided::Respond(response) = h.interceptor.on_decision(call, decision) else {
            panic!("expected Respond for key {key}");
        };
        let response = parse(&response);
        assert_eq!(response["id"], json!(id));
        assert_eq!(response["error"]["code"], json!(-32602));
        assert_eq!(
            response["error"]["data"]["type"],
            json!("idempotency_key_invalid")
        );
    }
    assert!(!h.interceptor.has_calls_in_flight());
}

#[test]
fn keyed_call_without_a_string_name_is_invalid_params() {
    let mut h = Harness::new();
    for (id, params) in [
        (r#""a""#, r#"{"arguments":{},"idempotencyKey":"k"}"#),
        (r#""b""#, r#"{"name":5,"idempotencyKey":"k"}"#),
        (r#""c""#, r#"{"name":null,"idempotencyKey":"k"}"#),
    ] {
        let line =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{params}}}"#);
        let response = expect_respond(h.client(&line));
        assert_eq!(response["id"], parse(id));
        assert_eq!(response["error"]["code"], json!(-32602), "{line}");
    }
    assert!(!h.interceptor.has_calls_in_flight());
}

#[test]
fn keyed_call_with_an_untrackable_id_is_refused() {
    let mut h = Harness::new();
    for id in ["null", "true", "{}", "[1]", r#""\ud800""#] {
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"t","idempotencyKey":"k"}}}}"#
        );
        let response = expect_respond(h.client(&line));
        assert_eq!(response["id"], Value::Null, "{line}");
        assert_eq!(response["error"]["code"], json!(-32600), "{line}");
        // Without a key, such a call is none of our business.
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"t"}}}}"#
        );
        assert!(is_forward(&h.client(&line)), "{line}");
    }
    assert!(!h.interceptor.has_calls_in_flight());
}

// ---------------------------------------------------------------------------------------------
// What the server receives
// ---------------------------------------------------------------------------------------------

const META: &str = r#"{"progressToken": 12345678901234567890123, "io.modelcontextprotocol/protocolVersion": "2026-07-28"}"#;

fn rich_call(id: &str) -> String {
    format!(
        r#"{{"jsonrpc": "2.0", "id": {id}, "method": "tools/call", "params": {{"name": "charge", "arguments": {RICH_ARGUMENTS}, "idempotencyKey": "k\u002d1", "_meta": {META}, "task": {{"ttl": 60000.0}}, "x-vendor": [1.000, "\ud83d\ude00"]}}, "x-envelope": 1E3}}"#
    )
}

#[test]
fn executed_call_reaches_the_server_without_its_key_and_with_it_in_meta() {
    let mut h = Harness::new();
    let (claim, request) = h.execute(&rich_call("7"));
    assert_eq!(claim.id().key.as_str(), "k-1");

    let envelope = raw_members(&request);
    assert_eq!(envelope["jsonrpc"], r#""2.0""#);
    assert_eq!(envelope["id"], "7");
    assert_eq!(envelope["method"], r#""tools/call""#);
    assert_eq!(envelope["x-envelope"], "1E3");

    let params = raw_members(&envelope["params"]);
    assert!(!params.contains_key("idempotencyKey"), "{request}");
    assert_eq!(params["name"], r#""charge""#);
    assert_eq!(params["arguments"], RICH_ARGUMENTS);
    assert_eq!(params["task"], r#"{"ttl": 60000.0}"#);
    assert_eq!(params["x-vendor"], r#"[1.000, "\ud83d\ude00"]"#);

    let meta = raw_members(&params["_meta"]);
    assert_eq!(meta["progressToken"], "12345678901234567890123");
    assert_eq!(
        meta["io.modelcontextprotocol/protocolVersion"],
        r#""2026-07-28""#
    );
    assert_eq!(parse(&meta[META_KEY]), json!("k-1"));
    assert_eq!(meta.len(), 3);
    assert!(h.interceptor.has_calls_in_flight());
}

#[test]
fn a_call_naming_params_twice_reaches_the_server_with_the_params_it_was_decided_on() {
    // serde_json, and the interceptor, take the last `params`; some servers take the first. The
    // request forwarded names it once, the one the call was decided on.
    let mut h = Harness::new();
    let line = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"other"},"params":{"name":"charge","arguments":{"amount":1},"idempotencyKey":"twice"}}"#;
    let (claim, request) = h.execute(line);
    assert_eq!(claim.id().key.as_str(), "twice");
    assert_eq!(request.matches(r#""params""#).count(), 1, "{request}");
    assert_eq!(
        parse(&request)["params"],
        json!({"name": "charge", "arguments": {"amount": 1}, "_meta": {META_KEY: "twice"}})
    );
}

#[test]
fn an_executed_call_keeps_the_envelopes_text_around_its_params() {
    let mut h = Harness::new();
    let line = r#"{ "jsonrpc" : "2.0", "params" : {"name":"charge","idempotencyKey":"k"} , "id": 1, "method": "tools/call", "x": 1.50 }"#;
    let (_, request) = h.execute(line);
    assert!(
        request.starts_with(r#"{ "jsonrpc" : "2.0", "params" : {"#),
        "{request}"
    );
    assert!(
        request.ends_with(r#"} , "id": 1, "method": "tools/call", "x": 1.50 }"#),
        "{request}"
    );
    assert_eq!(
        parse(&request)["params"],
        json!({"name": "charge", "_meta": {META_KEY: "k"}})
    );
}

#[test]
fn executed_call_without_meta_gets_one() {
    let mut h = Harness::new();
    let (_, request) = h.execute(&call_line("1", "plain"));
    let request = parse(&request);
    assert_eq!(
        request["params"],
        json!({"name": "charge", "arguments": {"amount": 1}, "_meta": {META_KEY: "plain"}})
    );
}

#[test]
fn executed_call_keeps_its_key_when_configured() {
    let mut h = Harness::with(InterceptorConfig::default().forward_key(true));
    let (_, request) = h.execute(&rich_call(r#""req-1""#));
    let envelope = raw_members(&request);
    let params = raw_members(&envelope["params"]);
    assert_eq!(params["idempotencyKey"], r#""k\u002d1""#);
    assert_eq!(params["arguments"], RICH_ARGUMENTS);
    let meta = raw_members(&params["_meta"]);
    assert_eq!(parse(&meta[META_KEY]), json!("k-1"));
    assert_eq!(meta["progressToken"], "12345678901234567890123");
}

#[test]
fn mrtr_continuation_bypasses_and_loses_its_key() {
    let line = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t","arguments":{"n": 1.50},"idempotencyKey":"k","requestState":"abc","inputResponses":{"x":{"v":12345678901234567890123}}}}"#;

    let mut h = Harness::new();
    let call = h.keyed(line);
    let decision = h.decision(&call, |_| panic!("a continuation must not reach the store"));
    assert_eq!(decision, Decision::Bypass(BypassReason::MrtrContinuation));
    let Decided::Forward(request) = h.interceptor.on_decision(call, decision) else {
        panic!("expected Forward");
    };
    let params = raw_members(&raw_members(&request)["params"]);
    assert!(!params.contains_key("idempotencyKey"));
    assert!(!params.contains_key("_meta"));
    assert_eq!(params["arguments"], r#"{"n": 1.50}"#);
    assert_eq!(params["requestState"], r#""abc""#);
    assert_eq!(
        params["inputResponses"],
        r#"{"x":{"v":12345678901234567890123}}"#
    );
    assert!(!h.interceptor.has_calls_in_flight());
    // Its response is not recorded.
    assert!(is_server_forward(
        &h.server(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#)
    ));

    let mut h = Harness::with(InterceptorConfig::default().forward_key(true));
    let call = h.keyed(line);
    let decision = h.decision(&call, |_| unreachable!());
    assert_eq!(
        h.interceptor.on_decision(call, decision),
        Decided::Forward(line.to_owned())
    );
}

#[test]
fn calls_without_a_key_pass_untouched() {
    let mut h = Harness::new();
    for line in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"a":1.0}}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t","_meta":{"other":"k"}}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t","arguments":{"idempotencyKey":"k"}}}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call"}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":["t","k"]}"#,
        r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"t","idempotencyKey":"k"}}"#,
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/list","params":{"idempotencyKey":"k"}}"#,
    ] {
        assert!(is_forward(&h.client(line)), "{line}");
    }
    assert!(!h.interceptor.has_calls_in_flight());
    assert!(is_server_forward(
        &h.server(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#)
    ));
}
