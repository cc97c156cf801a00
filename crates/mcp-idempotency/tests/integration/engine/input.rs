//! What the engine decides before any store is asked: calls without a key and MRTR continuations
//! bypass; invalid keys and oversized or malformed arguments are refused, in that order.

use super::*;

// ---------------------------------------------------------------------------------------------
// Bypass

#[test]
fn no_key_bypasses() {
    let engine = Engine::default();
    let step = first_step(
        &engine,
        &scope(),
        &call(TOOL, Some(ARGS), None),
        FencingToken::random(),
        at(T0),
    );
    assert_eq!(done(step), Decision::Bypass(BypassReason::NoKey));
}

#[test]
fn no_key_bypasses_without_looking_at_the_arguments() {
    // Without a key nothing is fingerprinted or size-checked: the server's own validation applies.
    let engine = Engine::new(EngineConfig::default().with_max_argument_bytes(4));
    for args in [
        Some("{not json"),
        Some(r#"{"long": "enough to be too large"}"#),
        None,
    ] {
        let step = first_step(
            &engine,
            &scope(),
            &call(TOOL, args, None),
            FencingToken::random(),
            at(T0),
        );
        assert_eq!(done(step), Decision::Bypass(BypassReason::NoKey));
    }
}

#[test]
fn mrtr_continuation_bypasses_even_with_an_invalid_key() {
    let engine = Engine::new(EngineConfig::default().with_max_argument_bytes(4));
    let keys = [
        json!(KEY),
        json!(42),
        json!(null),
        json!(true),
        json!({"k": 1}),
        json!(["k"]),
        json!(""),
        json!("a\nb"),
        json!("k".repeat(10_000)),
    ];
    for key in &keys {
        for args in [Some(ARGS), Some("{not json"), None] {
            let call = ToolCall {
                mrtr_continuation: true,
                ..call(TOOL, args, Some(key))
            };
            let step = first_step(&engine, &scope(), &call, FencingToken::random(), at(T0));
            assert_eq!(
                done(step),
                Decision::Bypass(BypassReason::MrtrContinuation),
                "key {key}, args {args:?}"
            );
        }
    }
    // Without a key at all, a continuation is still reported as a continuation.
    let call = ToolCall {
        mrtr_continuation: true,
        ..call(TOOL, Some(ARGS), None)
    };
    assert_eq!(
        done(first_step(
            &engine,
            &scope(),
            &call,
            FencingToken::random(),
            at(T0)
        )),
        Decision::Bypass(BypassReason::MrtrContinuation)
    );
}

// ---------------------------------------------------------------------------------------------
// Key validation

fn begin_with_key(engine: &Engine, key: &Value) -> Step {
    first_step(
        engine,
        &scope(),
        &call(TOOL, Some(ARGS), Some(key)),
        FencingToken::random(),
        at(T0),
    )
}

#[test]
fn non_string_keys_are_invalid_and_not_echoed() {
    let engine = Engine::default();
    let cases = [
        (json!(42), "number"),
        (json!(-1.5), "number"),
        (json!(null), "null"),
        (json!(true), "boolean"),
        (json!(false), "boolean"),
        (json!({"key": "k"}), "object"),
        (json!(["k"]), "array"),
        (json!([]), "array"),
    ];
    for (key, found) in cases {
        let rejection = rejected(begin_with_key(&engine, &key));
        let data = check_error(&rejection, RejectionKind::KeyInvalid, INVALID_PARAMS, None);
        assert_eq!(data.len(), 1, "only data.type for {key}: {data:?}");
        assert_eq!(rejection.retry_after(), None);
        message_mentions(&rejection, &["idempotencyKey", "string", found]);
    }
}

#[test]
fn empty_key_is_invalid() {
    let rejection = rejected(begin_with_key(&Engine::default(), &json!("")));
    check_error(
        &rejection,
        RejectionKind::KeyInvalid,
        INVALID_PARAMS,
        Some(""),
    );
    message_mentions(&rejection, &["empty"]);
}

#[test]
fn key_length_limit_defaults_to_255_bytes() {
    assert_eq!(EngineConfig::DEFAULT_MAX_KEY_BYTES, 255);
    let engine = Engine::default();
    let longest = "k".repeat(255);
    assert!(matches!(
        begin_with_key(&engine, &json!(longest)),
        Step::TryClaim(_)
    ));

    let too_long = "k".repeat(256);
    let rejection = rejected(begin_with_key(&engine, &json!(too_long)));
    // A key over the limit is not echoed back (it may be arbitrarily large).
    check_error(&rejection, RejectionKind::KeyInvalid, INVALID_PARAMS, None);
    message_mentions(&rejection, &["256", "255"]);

    // The limit counts bytes of UTF-8, not characters: 128 × "é" is 256 bytes.
    let rejection = rejected(begin_with_key(&engine, &json!("é".repeat(128))));
    check_error(&rejection, RejectionKind::KeyInvalid, INVALID_PARAMS, None);
    assert!(matches!(
        begin_with_key(&engine, &json!(format!("{}k", "é".repeat(127)))),
        Step::TryClaim(_)
    ));
}

#[test]
fn key_length_limit_is_configurable() {
    let small = Engine::new(EngineConfig::default().with_max_key_bytes(8));
    assert!(matches!(
        begin_with_key(&small, &json!("12345678")),
        Step::TryClaim(_)
    ));
    let rejection = rejected(begin_with_key(&small, &json!("123456789")));
    check_error(&rejection, RejectionKind::KeyInvalid, INVALID_PARAMS, None);
    message_mentions(&rejection, &["9", "8"]);

    let large = Engine::new(EngineConfig::default().with_max_key_bytes(1000));
    let req = match begin_with_key(&large, &json!("k".repeat(1000))) {
        Step::TryClaim(req) => req,
        other => panic!("a 1000-byte key is within a 1000-byte limit: {other:?}"),
    };
    assert_eq!(req.id.key.as_str().len(), 1000);
    let rejection = rejected(begin_with_key(&large, &json!("k".repeat(1001))));
    check_error(&rejection, RejectionKind::KeyInvalid, INVALID_PARAMS, None);
}

#[test]
fn control_characters_make_a_key_invalid() {
    let engine = Engine::default();
    for bad in [
        "ab\ncd",
        "\u{0}",
        "tab\there",
        "x\u{7f}",
        "\u{85}y",
        "\u{9f}",
        "cr\r",
        "\u{1b}[31m",
    ] {
        let rejection = rejected(begin_with_key(&engine, &json!(bad)));
        // The key is a string within the length limit, so it is echoed (JSON escapes it).
        check_error(
            &rejection,
            RejectionKind::KeyInvalid,
            INVALID_PARAMS,
            Some(bad),
        );
        message_mentions(&rejection, &["control"]);
    }
    // Non-control Unicode, spaces and punctuation are fine.
    for good in ["clé 🔑", "a b/c:d", "\u{a0}nbsp", "日本語"] {
        assert!(
            matches!(begin_with_key(&engine, &json!(good)), Step::TryClaim(_)),
            "{good:?}"
        );
    }
}

#[test]
fn key_is_checked_before_the_arguments() {
    let engine = Engine::new(EngineConfig::default().with_max_argument_bytes(2));
    let step = first_step(
        &engine,
        &scope(),
        &call(TOOL, Some("{malformed and large"), Some(&json!(7))),
        FencingToken::random(),
        at(T0),
    );
    assert_eq!(rejected(step).kind(), RejectionKind::KeyInvalid);
}

// ---------------------------------------------------------------------------------------------
// Arguments

#[test]
fn arguments_over_the_configured_limit_are_too_large() {
    let args = r#"{"a":"0123456789"}"#; // 18 bytes
    assert_eq!(args.len(), 18);
    let key = json!(KEY);

    let at_limit = Engine::new(EngineConfig::default().with_max_argument_bytes(18));
    assert!(matches!(
        first_step(
            &at_limit,
            &scope(),
            &call(TOOL, Some(args), Some(&key)),
            FencingToken::random(),
            at(T0)
        ),
        Step::TryClaim(_)
    ));

    let engine = Engine::new(EngineConfig::default().with_max_argument_bytes(17));
    let rejection = rejected(first_step(
        &engine,
        &scope(),
        &call(TOOL, Some(args), Some(&key)),
        FencingToken::random(),
        at(T0),
    ));
    let data = check_error(
        &rejection,
        RejectionKind::ArgumentsTooLarge,
        INVALID_PARAMS,
        Some(KEY),
    );
    assert_eq!(data["limit"], json!(17));
    message_mentions(&rejection, &["18", "17"]);

    // Absent arguments are zero bytes.
    let zero = Engine::new(EngineConfig::default().with_max_argument_bytes(0));
    assert!(matches!(
        first_step(
            &zero,
            &scope(),
            &call(TOOL, None, Some(&key)),
            FencingToken::random(),
            at(T0)
        ),
        Step::TryClaim(_)
    ));
}

#[test]
fn size_is_checked_before_parsing() {
    // A huge malformed payload is refused for its size, without being parsed.
    let engine = Engine::new(EngineConfig::default().with_max_argument_bytes(64));
    let args = format!("{{\"a\": {}", "[".repeat(1000));
    let key = json!(KEY);
    let rejection = rejected(first_step(
        &engine,
        &scope(),
        &call(TOOL, Some(&args), Some(&key)),
        FencingToken::random(),
        at(T0),
    ));
    assert_eq!(rejection.kind(), RejectionKind::ArgumentsTooLarge);
}

#[test]
fn malformed_arguments_are_invalid() {
    let engine = Engine::default();
    let key = json!(KEY);
    let deep = format!(r#"{{"a": {}1{}}}"#, "[".repeat(10_000), "]".repeat(10_000));
    for args in [
        "",
        "{",
        r#"{"amount": }"#,
        r#"{"amount": 1"#,
        r#"{"amount": 1} trailing"#,
        "{'single': 'quotes'}",
        "not json",
        deep.as_str(),
    ] {
        let rejection = rejected(first_step(
            &engine,
            &scope(),
            &call(TOOL, Some(args), Some(&key)),
            FencingToken::random(),
            at(T0),
        ));
        check_error(
            &rejection,
            RejectionKind::ArgumentsInvalid,
            INVALID_PARAMS,
            Some(KEY),
        );
        message_mentions(&rejection, &["argument"]);
    }
}
