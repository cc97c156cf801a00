//! Server responses recorded against their claims (by id, in any order), and the answers the
//! interceptor gives itself: replays, rejections, and refused reuse of an id in flight.

use super::*;

fn completed(outcome: Outcome) -> RecordState {
    RecordState::Completed {
        outcome,
        completed_at: now(),
    }
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

#[test]
fn rejections_are_json_rpc_errors() {
    let mut h = Harness::new();

    // Same key, different arguments.
    let call = h.keyed(&call_line(r#""c""#, "k-conflict"));
    let decision = h.decision(&call, |req| {
        Ok(ClaimOutcome::Existing(Record {
            trace: None,
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
