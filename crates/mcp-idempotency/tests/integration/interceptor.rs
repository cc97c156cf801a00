//! Sans-IO tests of the JSON-RPC [`Interceptor`]: lines in, actions out, with a real [`Engine`]
//! stepped by hand in place of a store. No runtime, no I/O.

use std::collections::BTreeMap;

use mcp_idempotency::interceptor::{
    CancelPolicy, ClientAction, Decided, Interceptor, InterceptorConfig, KeyedCall, ServerAction,
    META_KEY,
};
use mcp_idempotency::store::{ClaimOutcome, StoreError};
use mcp_idempotency::{
    BypassReason, Claim, Decision, Engine, EngineConfig, FencingToken, Fingerprint, Outcome,
    Record, RecordState, Replay, Scope, Step, Timestamp,
};
use proptest::prelude::*;
use serde_json::value::RawValue;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn scope() -> Scope {
    Scope::new("interceptor-tests", "alice")
}

fn now() -> Timestamp {
    Timestamp::from_millis(1_700_000_000_000)
}

/// An interceptor and an engine, with the store's answers supplied by each test.
struct Harness {
    interceptor: Interceptor,
    engine: Engine,
}

impl Harness {
    fn new() -> Self {
        Self::with(InterceptorConfig::default())
    }

    fn with(config: InterceptorConfig) -> Self {
        Self {
            interceptor: Interceptor::new(config),
            engine: Engine::new(EngineConfig::default()),
        }
    }

    /// The line must be a keyed call to decide.
    fn keyed(&mut self, line: &str) -> KeyedCall {
        match self.interceptor.on_client_message(line) {
            ClientAction::Decide(call) => call,
            other => panic!("expected Decide for {line}, got {other:?}"),
        }
    }

    /// The decision the engine makes for `call` when the store answers `answer` to its claim.
    fn decision(
        &self,
        call: &KeyedCall,
        answer: impl FnOnce(&mcp_idempotency::store::ClaimRequest) -> Result<ClaimOutcome, StoreError>,
    ) -> Decision {
        match self
            .engine
            .begin(&scope(), &call.tool_call(), FencingToken::random(), now())
        {
            Step::Done(decision) => decision,
            Step::TryClaim(req) => {
                let answer = answer(&req);
                match self.engine.on_claim(req, answer) {
                    Step::Done(decision) => decision,
                    other => panic!("unexpected step {other:?}"),
                }
            }
            Step::TakeOver(req) => panic!("unexpected take-over {req:?}"),
        }
    }

    /// Claims `call` (the store answers "claimed") and returns the claim and the request for the
    /// server.
    fn execute_call(&mut self, call: KeyedCall) -> (Claim, String) {
        let decision = self.decision(&call, |_| Ok(ClaimOutcome::Claimed));
        let Decision::Execute(claim) = decision.clone() else {
            panic!("expected Execute, got {decision:?}");
        };
        match self.interceptor.on_decision(call, decision) {
            Decided::Forward(request) => (claim, request),
            other => panic!("expected Forward, got {other:?}"),
        }
    }

    /// Sends a keyed line and claims it.
    fn execute(&mut self, line: &str) -> (Claim, String) {
        let call = self.keyed(line);
        self.execute_call(call)
    }

    /// Sends a keyed line whose key the store already holds with `state`, same fingerprint.
    fn existing(&mut self, line: &str, state: RecordState) -> Decided {
        let call = self.keyed(line);
        let decision = self.decision(&call, |req| {
            Ok(ClaimOutcome::Existing(Record {
                id: req.id.clone(),
                fingerprint: req.fingerprint,
                tool_name: req.tool_name.to_string(),
                state,
                created_at: now(),
                expires_at: now().saturating_add(std::time::Duration::from_secs(3600)),
            }))
        });
        self.interceptor.on_decision(call, decision)
    }

    fn server(&mut self, line: &str) -> ServerAction {
        self.interceptor.on_server_message(line)
    }

    fn client(&mut self, line: &str) -> ClientAction {
        self.interceptor.on_client_message(line)
    }
}

fn call_line(id: &str, key: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"charge","arguments":{{"amount":1}},"idempotencyKey":"{key}"}}}}"#
    )
}

fn completed(outcome: Outcome) -> RecordState {
    RecordState::Completed {
        outcome,
        completed_at: now(),
    }
}

/// The members of a JSON object with their raw text, last one winning.
fn raw_members(text: &str) -> BTreeMap<String, String> {
    let members: BTreeMap<String, Box<RawValue>> =
        serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}: {text}"));
    members
        .into_iter()
        .map(|(name, raw)| (name, raw.get().to_owned()))
        .collect()
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}: {text}"))
}

fn expect_respond(action: ClientAction) -> Value {
    match action {
        ClientAction::Respond(response) => parse(&response),
        other => panic!("expected Respond, got {other:?}"),
    }
}

fn expect_record(action: ServerAction) -> (Claim, Outcome, bool) {
    match action {
        ServerAction::Record {
            claim,
            outcome,
            forward,
        } => (claim, outcome, forward),
        other => panic!("expected Record, got {other:?}"),
    }
}

fn expect_rewritten(action: ServerAction) -> String {
    match action {
        ServerAction::ForwardRewritten(message) => message,
        other => panic!("expected ForwardRewritten, got {other:?}"),
    }
}

fn is_forward(action: &ClientAction) -> bool {
    matches!(action, ClientAction::Forward)
}

fn is_server_forward(action: &ServerAction) -> bool {
    matches!(action, ServerAction::Forward)
}

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
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t","_meta":{"idempotencyKey":"k"}}}"#,
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

// ---------------------------------------------------------------------------------------------
// What the server answers
// ---------------------------------------------------------------------------------------------

#[test]
fn response_to_a_claimed_call_is_recorded_exactly() {
    let mut h = Harness::new();
    let (claim, _) = h.execute(&call_line("1", "k-ok"));
    let result = r#"{ "content": [{"type": "text", "text": "charged \u20ac1.0"}], "isError": false, "n": 12345678901234567890123 }"#;
    let response = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#);
    let (recorded, outcome, forward) = expect_record(h.server(&response));
    assert_eq!(recorded, claim);
    assert_eq!(outcome, Outcome::Success(result.to_owned()));
    assert!(forward);
    assert!(!h.interceptor.has_calls_in_flight());
    // A second response for the same id is not the claimed call's any more.
    assert!(is_server_forward(&h.server(&response)));

    let (claim, _) = h.execute(&call_line("2", "k-err"));
    let error = r#"{"code": -32000, "message": "card declined", "data": {"retry": false}}"#;
    let response = format!(r#"{{"error":{error},"id":2,"jsonrpc":"2.0"}}"#);
    let (recorded, outcome, forward) = expect_record(h.server(&response));
    assert_eq!(recorded, claim);
    assert_eq!(outcome, Outcome::Error(error.to_owned()));
    assert!(forward);
}

#[test]
fn response_with_neither_or_both_members_is_recorded_as_unknown() {
    let mut h = Harness::new();
    h.execute(&call_line("1", "k1"));
    h.execute(&call_line("2", "k2"));
    let (_, outcome, forward) = expect_record(h.server(r#"{"jsonrpc":"2.0","id":1}"#));
    assert!(matches!(outcome, Outcome::Unknown { .. }), "{outcome:?}");
    assert!(forward);
    let (_, outcome, _) = expect_record(
        h.server(r#"{"jsonrpc":"2.0","id":2,"result":{},"error":{"code":1,"message":"m"}}"#),
    );
    assert!(matches!(outcome, Outcome::Unknown { .. }), "{outcome:?}");
}

#[test]
fn null_companion_member_is_ignored() {
    let mut h = Harness::new();
    h.execute(&call_line("1", "k1"));
    h.execute(&call_line("2", "k2"));
    h.execute(&call_line("3", "k3"));
    let (_, outcome, _) =
        expect_record(h.server(r#"{"jsonrpc":"2.0","id":1,"result":{"ok":1.0},"error":null}"#));
    assert_eq!(outcome, Outcome::Success(r#"{"ok":1.0}"#.into()));
    let (_, outcome, _) = expect_record(
        h.server(r#"{"jsonrpc":"2.0","id":2,"result":null,"error":{"code":-1,"message":"m"}}"#),
    );
    assert_eq!(
        outcome,
        Outcome::Error(r#"{"code":-1,"message":"m"}"#.into())
    );
    // A lone null result is a result.
    let (_, outcome, _) = expect_record(h.server(r#"{"jsonrpc":"2.0","id":3,"result":null}"#));
    assert_eq!(outcome, Outcome::Success("null".into()));
}

#[test]
fn out_of_order_responses_match_their_claims() {
    let mut h = Harness::new();
    let ids = ["1", r#""two""#, "3", r#""4""#];
    let mut claims = BTreeMap::new();
    for (n, id) in ids.iter().enumerate() {
        let (claim, _) = h.execute(&call_line(id, &format!("key-{n}")));
        claims.insert(*id, claim);
    }
    assert_eq!(h.interceptor.claims_in_flight().len(), 4);
    for id in [r#""4""#, "3", "1", r#""two""#] {
        let response = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"for":{id}}}}}"#);
        let (claim, outcome, _) = expect_record(h.server(&response));
        assert_eq!(claim, claims[id], "response {id}");
        assert_eq!(outcome, Outcome::Success(format!(r#"{{"for":{id}}}"#)));
    }
    assert!(!h.interceptor.has_calls_in_flight());
}

#[test]
fn response_for_an_unknown_id_passes() {
    let mut h = Harness::new();
    h.execute(&call_line("1", "k"));
    for line in [
        r#"{"jsonrpc":"2.0","id":2,"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}"#,
        r#"{"jsonrpc":"2.0","result":{}}"#,
        r#"{"jsonrpc":"2.0","id":1.0,"result":{}}"#,
    ] {
        assert!(is_server_forward(&h.server(line)), "{line}");
    }
    assert!(h.interceptor.has_calls_in_flight());
}

#[test]
fn server_requests_and_notifications_pass_even_with_a_claimed_id() {
    let mut h = Harness::new();
    h.execute(&call_line("1", "k"));
    for line in [
        r#"{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":0.5}}"#,
    ] {
        assert!(is_server_forward(&h.server(line)), "{line}");
    }
    assert!(h.interceptor.has_calls_in_flight());
    // The client's answer to the server's request has the same id but no method: it passes.
    assert!(is_forward(&h.client(
        r#"{"jsonrpc":"2.0","id":1,"result":{"role":"assistant"}}"#
    )));
    assert!(h.interceptor.has_calls_in_flight());
}

#[test]
fn string_and_number_ids_are_different_calls() {
    let mut h = Harness::new();
    let (string_claim, _) = h.execute(&call_line(r#""1""#, "k-string"));
    // Number 1 is not the id in flight.
    let (number_claim, _) = h.execute(&call_line("1", "k-number"));
    let (claim, _, _) = expect_record(h.server(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
    assert_eq!(claim, number_claim);
    assert!(is_server_forward(
        &h.server(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#)
    ));
    let (claim, _, _) = expect_record(h.server(r#"{"jsonrpc":"2.0","id":"1","result":{}}"#));
    assert_eq!(claim, string_claim);
}

#[test]
fn escaped_string_ids_match() {
    let mut h = Harness::new();
    let (claim, _) = h.execute(&call_line(r#""a""#, "k"));
    // Reusing the id, spelled differently, is still reusing it.
    let response = expect_respond(h.client(&call_line(r#""\u0061""#, "k2")));
    assert_eq!(response["error"]["code"], json!(-32600));
    assert_eq!(response["id"], json!("a"));
    let (recorded, _, _) =
        expect_record(h.server(r#"{"jsonrpc":"2.0","id":"\u0061","result":{}}"#));
    assert_eq!(recorded, claim);

    let (claim, _) = h.execute(&call_line(r#""\u00e9\n""#, "k3"));
    let (recorded, _, _) =
        expect_record(h.server("{\"jsonrpc\":\"2.0\",\"id\":\"\u{e9}\\n\",\"result\":{}}"));
    assert_eq!(recorded, claim);
}

// ---------------------------------------------------------------------------------------------
// Answers the interceptor gives itself
// ---------------------------------------------------------------------------------------------

#[test]
fn replay_answers_with_the_new_id_and_the_stored_bytes() {
    let mut h = Harness::new();
    let result = r#"{ "content": [ {"type":"text","text":"done \u2713"} ], "total": 1.000 }"#;
    let decided = h.existing(
        &call_line(r#""retry-2""#, "k"),
        completed(Outcome::Success(result.into())),
    );
    assert_eq!(
        decided,
        Decided::Respond(format!(
            r#"{{"jsonrpc":"2.0","id":"retry-2","result":{result}}}"#
        ))
    );

    let error = r#"{"code":-32000,"message":"declined","data":{"n":1.0}}"#;
    let decided = h.existing(
        &call_line("9", "k"),
        completed(Outcome::Error(error.into())),
    );
    assert_eq!(
        decided,
        Decided::Respond(format!(r#"{{"jsonrpc":"2.0","id":9,"error":{error}}}"#))
    );
    assert!(!h.interceptor.has_calls_in_flight());

    // A replay built by hand is answered the same way.
    let call = h.keyed(&call_line("10", "k"));
    let decided = h
        .interceptor
        .on_decision(call, Decision::Replay(Replay::Result("[]".into())));
    assert_eq!(
        decided,
        Decided::Respond(r#"{"jsonrpc":"2.0","id":10,"result":[]}"#.into())
    );
}

fn respond_json(decided: Decided) -> Value {
    match decided {
        Decided::Respond(response) => parse(&response),
        Decided::Forward(request) => panic!("expected Respond, got Forward({request})"),
    }
}

#[test]
fn rejections_are_json_rpc_errors() {
    let mut h = Harness::new();

    // Same key, different arguments.
    let call = h.keyed(&call_line(r#""c""#, "k-conflict"));
    let decision = h.decision(&call, |req| {
        Ok(ClaimOutcome::Existing(Record {
            id: req.id.clone(),
            fingerprint: Fingerprint::from_hex(&"ab".repeat(32)).unwrap(),
            tool_name: "charge".into(),
            state: completed(Outcome::Success("{}".into())),
            created_at: now(),
            expires_at: now().saturating_add(std::time::Duration::from_secs(60)),
        }))
    });
    let response = respond_json(h.interceptor.on_decision(call, decision));
    assert_eq!(response["jsonrpc"], json!("2.0"));
    assert_eq!(response["id"], json!("c"));
    assert_eq!(response["error"]["code"], json!(-32602));
    assert_eq!(
        response["error"]["data"]["type"],
        json!("idempotency_key_conflict")
    );
    assert_eq!(
        response["error"]["data"]["idempotencyKey"],
        json!("k-conflict")
    );
    assert!(response["error"]["message"].is_string());

    // Still running elsewhere.
    let response = respond_json(h.existing(
        &call_line("2", "k-busy"),
        RecordState::InProgress {
            owner: FencingToken::random(),
            lease_expires_at: now().saturating_add(std::time::Duration::from_secs(30)),
        },
    ));
    assert_eq!(response["id"], json!(2));
    assert_eq!(
        response["error"]["data"]["type"],
        json!("idempotency_key_in_progress")
    );
    assert!(response["error"]["data"]["retryAfterMs"].is_u64());

    // Its owner died (default policy: reject).
    let response = respond_json(h.existing(
        &call_line("3", "k-dead"),
        RecordState::InProgress {
            owner: FencingToken::random(),
            lease_expires_at: Timestamp::from_millis(1),
        },
    ));
    assert_eq!(response["error"]["code"], json!(-32603));
    assert_eq!(
        response["error"]["data"]["type"],
        json!("idempotency_outcome_unknown")
    );

    // Recorded as unknown.
    let response = respond_json(h.existing(
        &call_line("4", "k-unknown"),
        completed(Outcome::Unknown {
            reason: "the server exited".into(),
        }),
    ));
    assert_eq!(
        response["error"]["data"]["type"],
        json!("idempotency_outcome_unknown")
    );
    assert!(!h.interceptor.has_calls_in_flight());
}

#[test]
fn reused_id_of_a_call_in_flight_is_invalid_request() {
    let mut h = Harness::new();
    let (claim, _) = h.execute(&call_line("5", "first"));
    for line in [
        call_line("5", "second"),
        call_line("5", "first"),
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"t"}}"#.into(),
        r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#.into(),
    ] {
        let response = expect_respond(h.client(&line));
        assert_eq!(response["id"], json!(5), "{line}");
        assert_eq!(response["error"]["code"], json!(-32600), "{line}");
    }
    // The original call is untouched and still recorded when its answer comes.
    assert_eq!(h.interceptor.claims_in_flight(), vec![claim.clone()]);
    let (recorded, _, _) = expect_record(h.server(r#"{"jsonrpc":"2.0","id":5,"result":{}}"#));
    assert_eq!(recorded, claim);
    // Once answered, the id is free again.
    h.keyed(&call_line("5", "third"));
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
    // tells the interceptor (tests/deduplicator.rs, failing_claim_fails_closed).
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
// Garbage
// ---------------------------------------------------------------------------------------------

#[test]
fn garbage_passes_both_ways() {
    let deep_array = "[".repeat(100_000);
    let deep_object = r#"{"a":"#.repeat(100_000);
    let deep_params = format!(
        r#"{{"jsonrpc":"2.0","id":99,"method":"ping","params":{{"a":{}{}}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let garbage: Vec<String> = vec![
        String::new(),
        " ".into(),
        "not json".into(),
        "{".into(),
        "}".into(),
        "{}".into(),
        "[]".into(),
        "null".into(),
        "true".into(),
        "42".into(),
        "-1.5e300".into(),
        r#""a string""#.into(),
        r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","idempotencyKey":"k"}}]"#.into(),
        r#"[{"jsonrpc":"2.0","id":1,"result":{}}]"#.into(),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","idempotencyKey":"k"}"#.into(),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","idempotencyKey":"k"}} trailing"#.into(),
        r#"{"id":1,"method":5,"params":{"name":"t","idempotencyKey":"k"}}"#.into(),
        r#"{"id":1,"method":"tools/call","params":"{\"name\":\"t\",\"idempotencyKey\":\"k\"}"}"#.into(),
        "{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"t\",\"idempotencyKey\":\"k\u{0}\"".into(),
        "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}".into(),
        deep_array,
        deep_object,
        deep_params,
    ];
    let mut h = Harness::new();
    h.execute(&call_line("1000", "k-live"));
    for line in &garbage {
        let short = &line[..line.len().min(80)];
        assert!(is_forward(&h.client(line)), "client: {short}");
        assert!(is_server_forward(&h.server(line)), "server: {short}");
    }
    assert!(h.interceptor.has_calls_in_flight());
}

#[test]
fn deeply_nested_arguments_are_refused_not_overflowed() {
    let mut h = Harness::new();
    let arguments = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t","arguments":{arguments},"idempotencyKey":"k"}}}}"#
    );
    let call = h.keyed(&line);
    assert_eq!(call.tool_call().arguments, Some(arguments.as_str()));
    let decision = h.decision(&call, |_| {
        panic!("unfingerprintable arguments must not be claimed")
    });
    let response = respond_json(h.interceptor.on_decision(call, decision));
    assert_eq!(
        response["error"]["data"]["type"],
        json!("idempotency_arguments_invalid")
    );

    // A deep result is recorded as it is.
    h.execute(&call_line("2", "k2"));
    let result = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let (_, outcome, _) =
        expect_record(h.server(&format!(r#"{{"jsonrpc":"2.0","id":2,"result":{result}}}"#)));
    assert_eq!(outcome, Outcome::Success(result));
}

// ---------------------------------------------------------------------------------------------
// Nothing panics
// ---------------------------------------------------------------------------------------------

/// JSON-ish values whose object members are drawn mostly from the names the interceptor looks at.
fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop_oneof![
            Just("tools/call"),
            Just("initialize"),
            Just("server/discover"),
            Just("notifications/cancelled"),
            Just("k"),
            Just("2.0"),
            Just("1"),
            Just(""),
        ]
        .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((arb_member_name(), inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

fn arb_member_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("jsonrpc".to_owned()),
        Just("id".to_owned()),
        Just("method".to_owned()),
        Just("params".to_owned()),
        Just("result".to_owned()),
        Just("error".to_owned()),
        Just("name".to_owned()),
        Just("arguments".to_owned()),
        Just("idempotencyKey".to_owned()),
        Just("requestState".to_owned()),
        Just("inputResponses".to_owned()),
        Just("requestId".to_owned()),
        Just("_meta".to_owned()),
        Just("capabilities".to_owned()),
        Just("tools".to_owned()),
        "[a-z]{1,6}",
    ]
}

/// A message shaped like JSON-RPC, with arbitrary values in its members.
fn arb_message() -> impl Strategy<Value = String> {
    let id = prop_oneof![
        (0i64..4).prop_map(Value::from),
        prop_oneof![Just("1"), Just("a"), Just("\u{e9}")].prop_map(Value::from),
        arb_value(),
    ];
    let method = prop_oneof![
        Just(json!("tools/call")),
        Just(json!("initialize")),
        Just(json!("server/discover")),
        Just(json!("notifications/cancelled")),
        arb_value(),
    ];
    let params = prop_oneof![
        (arb_value(), arb_value(), arb_value(), any::<bool>()).prop_map(
            |(name, arguments, key, mrtr)| {
                let mut params =
                    json!({"name": name, "arguments": arguments, "idempotencyKey": key});
                if mrtr {
                    params["requestState"] = json!("s");
                }
                params
            }
        ),
        (0i64..4).prop_map(|id| json!({"requestId": id})),
        arb_value(),
    ];
    let body = prop_oneof![
        arb_value().prop_map(|v| ("result", v)),
        arb_value().prop_map(|v| ("error", v)),
        Just((
            "result",
            json!({"capabilities": {"tools": {}}, "ttlMs": 60000})
        )),
    ];
    (
        prop::option::of(id),
        prop::option::of(method),
        prop::option::of(params),
        prop::option::of(body),
    )
        .prop_map(|(id, method, params, body)| {
            let mut message = serde_json::Map::new();
            message.insert("jsonrpc".into(), json!("2.0"));
            if let Some(id) = id {
                message.insert("id".into(), id);
            }
            if let Some(method) = method {
                message.insert("method".into(), method);
            }
            if let Some(params) = params {
                message.insert("params".into(), params);
            }
            if let Some((member, value)) = body {
                message.insert(member.into(), value);
            }
            Value::Object(message).to_string()
        })
}

/// Feeds one message each way, acting on every action as a driver would.
fn drive(h: &mut Harness, from_client: &str, from_server: &str) {
    match h.interceptor.on_client_message(from_client) {
        ClientAction::Decide(call) => {
            let decision = h.decision(&call, |_| Ok(ClaimOutcome::Claimed));
            match h.interceptor.on_decision(call, decision) {
                Decided::Forward(request) | Decided::Respond(request) => {
                    serde_json::from_str::<Value>(&request).expect("valid JSON out");
                }
            }
        }
        ClientAction::Respond(response) => {
            serde_json::from_str::<Value>(&response).expect("valid JSON out");
        }
        ClientAction::Forward | ClientAction::Absorb | ClientAction::RecordThenForward(..) => {}
    }
    if let ServerAction::ForwardRewritten(message) = h.interceptor.on_server_message(from_server) {
        serde_json::from_str::<Value>(&message).expect("valid JSON out");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_strings_never_panic(client in ".{0,200}", server in ".{0,200}") {
        let mut h = Harness::new();
        drive(&mut h, &client, &server);
        drive(&mut h, &server, &client);
    }

    #[test]
    fn arbitrary_messages_never_panic(
        messages in prop::collection::vec((arb_message(), arb_message()), 1..12),
        forward_key: bool,
        forward_cancel: bool,
    ) {
        let policy = if forward_cancel { CancelPolicy::Forward } else { CancelPolicy::Absorb };
        let mut h = Harness::with(
            InterceptorConfig::default().forward_key(forward_key).cancel_policy(policy),
        );
        for (client, server) in &messages {
            drive(&mut h, client, server);
        }
        for orphan in h.interceptor.on_server_gone("gone") {
            if let Some(response) = orphan.response {
                serde_json::from_str::<Value>(&response).expect("valid JSON out");
            }
        }
        prop_assert!(!h.interceptor.has_calls_in_flight());
    }

    #[test]
    fn arbitrary_values_never_panic(client in arb_value(), server in arb_value()) {
        let mut h = Harness::new();
        drive(&mut h, &client.to_string(), &server.to_string());
    }
}

#[test]
fn a_keyed_call_may_not_reuse_the_id_of_an_unanswered_request() {
    let mut interceptor: Interceptor = Interceptor::new(InterceptorConfig::default());
    let unkeyed =
        r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"slow","arguments":{}}}"#;
    assert!(matches!(
        interceptor.on_client_message(unkeyed),
        ClientAction::Forward
    ));
    let keyed = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"charge","arguments":{},"idempotencyKey":"k"}}"#;
    let ClientAction::Respond(response) = interceptor.on_client_message(keyed) else {
        panic!("a keyed call reusing a pending id must be refused");
    };
    let response: serde_json::Value = serde_json::from_str(&response).unwrap();
    assert_eq!(response["id"], 9);
    assert_eq!(response["error"]["code"], -32600);

    // Once the server has answered, the id is free again.
    let answer = r#"{"jsonrpc":"2.0","id":9,"result":{"content":[]}}"#;
    assert!(matches!(
        interceptor.on_server_message(answer),
        ServerAction::Forward
    ));
    assert!(matches!(
        interceptor.on_client_message(keyed),
        ClientAction::Decide(_)
    ));
}
