//! Garbage both ways and deeply nested arguments, and properties: no input makes the interceptor
//! panic or write invalid JSON.

use super::*;

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
        r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}]"#.into(),
        r#"[1, "two", null, [], {}]"#.into(),
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
        ClientAction::Respond(response)
        | ClientAction::ForwardTraced {
            message: response, ..
        } => {
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
