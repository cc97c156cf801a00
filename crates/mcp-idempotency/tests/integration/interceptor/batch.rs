//! JSON-RPC batches (arrays, MCP 2025-03-26): a batch holding a keyed `tools/call`, reusing the id
//! of a keyed call in flight or cancelling one is refused whole with one `-32600` error per
//! element that has an id; any other batch passes untouched, its requests tracked as in flight.

use mcp_idempotency::interceptor::BATCH_REFUSED;

use super::*;

fn request(id: &str, method: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{}}}}"#)
}

fn notification(method: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":{{}}}}"#)
}

fn batch(elements: &[String]) -> String {
    format!("[{}]", elements.join(", "))
}

/// The refusal of a batch: one error per id, in order, each -32600 with the stable type.
fn expect_refusal(action: ClientAction, ids: &[Value]) -> String {
    let answer = expect_respond(action);
    let responses = answer.as_array().expect("a batch response");
    let got: Vec<&Value> = responses.iter().map(|r| &r["id"]).collect();
    assert_eq!(got, ids.iter().collect::<Vec<_>>(), "{answer}");
    for response in responses {
        assert_eq!(response["jsonrpc"], "2.0");
        assert_eq!(response["error"]["code"], -32600, "{response}");
        assert_eq!(
            response["error"]["data"]["type"], BATCH_REFUSED,
            "{response}"
        );
        assert!(response.get("result").is_none());
    }
    responses[0]["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn a_batch_with_a_keyed_call_is_refused_whole() {
    let mut h = Harness::new();
    let line = batch(&[
        request("1", "tools/list"),
        call_line(r#""c-2""#, "k-1"),
        notification("notifications/progress"),
        // The client's answer to a server request is no request: it gets no error.
        r#"{"jsonrpc":"2.0","id":"s-1","result":{}}"#.into(),
        request("null", "ping"),
    ]);
    let message = expect_refusal(h.client(&line), &[json!(1), json!("c-2"), Value::Null]);
    assert!(message.contains("batch"), "{message}");
    assert!(message.contains("idempotencyKey"), "{message}");
    assert!(message.contains("one per message"), "{message}");
    assert!(!h.interceptor.has_calls_in_flight());
    // Nothing was tracked: the same ids may be used again, the keyed call decided normally.
    h.execute(&call_line(r#""c-2""#, "k-1"));
    h.execute(&call_line("1", "k-2"));
}

#[test]
fn odd_ids_and_escapes_are_answered_as_sent() {
    let mut h = Harness::new();
    let line = batch(&[
        call_line(r#""\u0061""#, "k"),
        call_line("-7", "k2"),
        call_line("true", "k3"),
    ]);
    expect_refusal(h.client(&line), &[json!("a"), json!(-7), Value::Null]);
}

#[test]
fn a_batch_without_a_keyed_call_passes_and_its_ids_count_as_in_flight() {
    let mut h = Harness::new();
    let line = batch(&[
        request("5", "tools/list"),
        tool_call_without_key("6"),
        // A keyed tools/call without an id is a notification, as outside a batch: passed.
        r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"t","idempotencyKey":"k"}}"#
            .into(),
        notification("notifications/initialized"),
    ]);
    assert!(is_forward(&h.client(&line)));
    // Until the server answers, a keyed call may not reuse those ids.
    let reused = expect_respond(h.client(&call_line("6", "k")));
    assert_eq!(reused["error"]["code"], -32600, "{reused}");
    // A batch response answers them; a single response would too.
    assert!(is_server_forward(&h.server(
        r#"[{"jsonrpc":"2.0","id":6,"result":{}},{"jsonrpc":"2.0","id":5,"result":{"tools":[]}}]"#
    )));
    h.execute(&call_line("6", "k"));
    h.execute(&call_line("5", "k2"));
}

fn tool_call_without_key(id: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"t","arguments":{{}}}}}}"#
    )
}

#[test]
fn a_batch_reusing_the_id_of_a_keyed_call_in_flight_is_refused() {
    let mut h = Harness::new();
    let (claim, _) = h.execute(&call_line("9", "k"));
    let line = batch(&[request("8", "tools/list"), request("9", "ping")]);
    let message = expect_refusal(h.client(&line), &[json!(8), json!(9)]);
    assert!(message.contains("request id 9"), "{message}");
    // The keyed call's own response is still recorded as its outcome.
    let (recorded, outcome, forward) =
        expect_record(h.server(r#"{"jsonrpc":"2.0","id":9,"result":{}}"#));
    assert_eq!(recorded, claim);
    assert_eq!(outcome, Outcome::Success("{}".into()));
    assert!(forward);
}

#[test]
fn a_batch_cancelling_a_keyed_call_in_flight_is_refused() {
    for policy in [CancelPolicy::Absorb, CancelPolicy::Forward] {
        let mut h = Harness::with(InterceptorConfig::default().cancel_policy(policy));
        h.execute(&call_line(r#""c""#, "k"));
        let cancel =
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"c"}}"#;
        // With another request: that one gets the error.
        let line = batch(&[cancel.into(), request("2", "ping")]);
        let message = expect_refusal(h.client(&line), &[json!(2)]);
        assert!(message.contains("cancels"), "{policy:?}: {message}");
        // Notifications only: nothing to answer, nothing forwarded.
        assert!(matches!(
            h.client(&batch(&[cancel.into()])),
            ClientAction::Absorb
        ));
        // The call was not cancelled: its response is recorded and sent.
        let (_, _, forward) = expect_record(h.server(r#"{"jsonrpc":"2.0","id":"c","result":{}}"#));
        assert!(forward, "{policy:?}");
    }
}

#[test]
fn a_keyed_answer_inside_a_server_batch_is_not_taken_for_a_record() {
    let mut h = Harness::new();
    h.execute(&call_line("3", "k"));
    assert!(is_server_forward(
        &h.server(r#"[{"jsonrpc":"2.0","id":3,"result":{}}]"#)
    ));
    assert!(h.interceptor.has_calls_in_flight());
}

#[test]
fn garbage_in_a_batch_is_skipped() {
    let mut h = Harness::new();
    for line in [
        "[1, 2, 3]",
        "[[], {}]",
        r#"[{"method":5,"id":1}]"#,
        "[",
        "[1,]",
        r#"  [{"jsonrpc":"2.0","id":1,"method":"ping"}]  "#,
    ] {
        assert!(is_forward(&h.client(line)), "{line}");
        assert!(is_server_forward(&h.server(line)), "{line}");
    }
    // A keyed call next to garbage still refuses the batch.
    let line = format!(r#"[1, "x", {}]"#, call_line("4", "k"));
    expect_refusal(h.client(&line), &[json!(4)]);
}
