//! Sans-IO tests of the [`Engine`]: no runtime, no store, no clock. Every step is driven by hand
//! with a simulated clock and store answers built in the test.

use std::time::Duration;

use mcp_idempotency::config::{DEFAULT_LEASE, DEFAULT_RETENTION};
use mcp_idempotency::jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS};
use mcp_idempotency::key::DEFAULT_MAX_KEY_BYTES;
use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, Fenced, QuotaExceeded, RecordLimits, StoreError, TakeOverRequest,
};
use mcp_idempotency::{
    AfterCrash, BypassReason, Claim, CorruptRecord, Decision, Engine, EngineConfig, FencingToken,
    Fingerprint, IdempotencyKey, Outcome, Record, RecordId, RecordState, Rejection, RejectionKind,
    Replay, Scope, Step, Timestamp, ToolCall,
};
use proptest::prelude::*;
use serde_json::{json, Value};

/// The simulated "now" of most tests.
const T0: u64 = 1_800_000_000_000;
const TOOL: &str = "charge_payment";
const ARGS: &str = r#"{"amount": 4200, "currency": "usd"}"#;
const KEY: &str = "b3b6c1e4-6b8b-4f1a-9c1e-2a6e6b1d9f2a";

fn at(millis: u64) -> Timestamp {
    Timestamp::from_millis(millis)
}

fn scope() -> Scope {
    Scope::new("payments-server", "alice")
}

fn call<'a>(tool: &'a str, args: Option<&'a str>, key: Option<&'a Value>) -> ToolCall<'a> {
    ToolCall {
        tool_name: tool,
        arguments: args,
        idempotency_key: key,
        mrtr_continuation: false,
    }
}

/// Runs `begin` and expects the engine to ask for a claim.
fn claim_request(
    engine: &Engine,
    tool: &str,
    args: Option<&str>,
    key: &str,
    owner: FencingToken,
    now: Timestamp,
) -> ClaimRequest {
    let key = json!(key);
    match engine.begin(&scope(), &call(tool, args, Some(&key)), owner, now) {
        Step::TryClaim(req) => req,
        other => panic!("expected Step::TryClaim, got {other:?}"),
    }
}

/// The default request: TOOL, ARGS, KEY at T0.
fn default_request(engine: &Engine, owner: FencingToken) -> ClaimRequest {
    claim_request(engine, TOOL, Some(ARGS), KEY, owner, at(T0))
}

fn fingerprint_of(engine: &Engine, tool: &str, args: Option<&str>) -> Fingerprint {
    claim_request(engine, tool, args, KEY, FencingToken::random(), at(T0)).fingerprint
}

/// A record as a store would return it for `req.id`.
fn record(req: &ClaimRequest, fingerprint: Fingerprint, state: RecordState) -> Record {
    Record {
        id: req.id.clone(),
        fingerprint,
        tool_name: TOOL.into(),
        state,
        created_at: at(T0 - 5_000),
        expires_at: at(T0 + 3_600_000),
    }
}

fn in_progress(owner: FencingToken, lease_expires_at: u64) -> RecordState {
    RecordState::InProgress {
        owner,
        lease_expires_at: at(lease_expires_at),
    }
}

fn completed(outcome: Outcome) -> RecordState {
    RecordState::Completed {
        outcome,
        completed_at: at(T0 - 1_000),
    }
}

fn unavailable(message: &str) -> StoreError {
    StoreError::Unavailable {
        message: message.into(),
        source: None,
    }
}

fn done(step: Step) -> Decision {
    match step {
        Step::Done(decision) => decision,
        other => panic!("expected Step::Done, got {other:?}"),
    }
}

fn rejected(step: Step) -> Rejection {
    match done(step) {
        Decision::Reject(rejection) => rejection,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn executed(step: Step) -> Claim {
    match done(step) {
        Decision::Execute(claim) => claim,
        other => panic!("expected Execute, got {other:?}"),
    }
}

fn take_over(step: Step) -> TakeOverRequest {
    match step {
        Step::TakeOver(req) => req,
        other => panic!("expected Step::TakeOver, got {other:?}"),
    }
}

fn is_reserved(code: i64) -> bool {
    (-32099..=-32020).contains(&code)
}

/// Checks the JSON-RPC error object of a rejection and returns it:
/// code (the exact expected value, never reserved), a non-empty message, `data.type`, and
/// `data.idempotencyKey` exactly when `key` is given.
fn check_error(
    rejection: &Rejection,
    kind: RejectionKind,
    code: i64,
    key: Option<&str>,
) -> serde_json::Map<String, Value> {
    assert_eq!(rejection.kind(), kind, "{rejection:?}");
    let object = rejection.to_error_object();
    let object = object.as_object().expect("error is an object");
    assert_eq!(object["code"], json!(code), "{object:?}");
    assert_eq!(kind.code(), code);
    assert!(!is_reserved(code), "code {code} is in the reserved range");
    let message = object["message"].as_str().expect("message is a string");
    assert!(!message.trim().is_empty(), "empty message: {object:?}");
    assert_eq!(message, rejection.message());
    let data = object["data"].as_object().expect("data is an object");
    assert_eq!(data["type"], json!(kind.as_str()));
    match key {
        Some(key) => {
            assert_eq!(data.get("idempotencyKey"), Some(&json!(key)), "{data:?}");
            assert_eq!(rejection.key(), Some(key));
        }
        None => {
            assert!(!data.contains_key("idempotencyKey"), "{data:?}");
            assert_eq!(rejection.key(), None);
        }
    }
    // The whole object survives a JSON round trip (no NaN, no non-string keys).
    let text = serde_json::to_string(object).expect("serializable");
    let back: Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(&back, &Value::Object(object.clone()));
    data.clone()
}

fn message_mentions(rejection: &Rejection, needles: &[&str]) {
    let message = rejection.message().to_lowercase();
    for needle in needles {
        assert!(
            message.contains(&needle.to_lowercase()),
            "message {:?} should mention {needle:?}",
            rejection.message()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Bypass

#[test]
fn no_key_bypasses() {
    let engine = Engine::default();
    let step = engine.begin(
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
    let engine = Engine::new(EngineConfig::default().max_argument_bytes(4));
    for args in [
        Some("{not json"),
        Some(r#"{"long": "enough to be too large"}"#),
        None,
    ] {
        let step = engine.begin(
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
    let engine = Engine::new(EngineConfig::default().max_argument_bytes(4));
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
            let step = engine.begin(&scope(), &call, FencingToken::random(), at(T0));
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
        done(engine.begin(&scope(), &call, FencingToken::random(), at(T0))),
        Decision::Bypass(BypassReason::MrtrContinuation)
    );
}

// ---------------------------------------------------------------------------------------------
// Key validation

fn begin_with_key(engine: &Engine, key: &Value) -> Step {
    engine.begin(
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
    assert_eq!(DEFAULT_MAX_KEY_BYTES, 255);
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
    let small = Engine::new(EngineConfig::default().max_key_bytes(8));
    assert!(matches!(
        begin_with_key(&small, &json!("12345678")),
        Step::TryClaim(_)
    ));
    let rejection = rejected(begin_with_key(&small, &json!("123456789")));
    check_error(&rejection, RejectionKind::KeyInvalid, INVALID_PARAMS, None);
    message_mentions(&rejection, &["9", "8"]);

    let large = Engine::new(EngineConfig::default().max_key_bytes(1000));
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
    let engine = Engine::new(EngineConfig::default().max_argument_bytes(2));
    let step = engine.begin(
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

    let at_limit = Engine::new(EngineConfig::default().max_argument_bytes(18));
    assert!(matches!(
        at_limit.begin(
            &scope(),
            &call(TOOL, Some(args), Some(&key)),
            FencingToken::random(),
            at(T0)
        ),
        Step::TryClaim(_)
    ));

    let engine = Engine::new(EngineConfig::default().max_argument_bytes(17));
    let rejection = rejected(engine.begin(
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
    let zero = Engine::new(EngineConfig::default().max_argument_bytes(0));
    assert!(matches!(
        zero.begin(
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
    let engine = Engine::new(EngineConfig::default().max_argument_bytes(64));
    let args = format!("{{\"a\": {}", "[".repeat(1000));
    let key = json!(KEY);
    let rejection = rejected(engine.begin(
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
        let rejection = rejected(engine.begin(
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

// ---------------------------------------------------------------------------------------------
// The claim request and a granted claim

#[test]
fn begin_prepares_the_claim_from_the_config() {
    let config = EngineConfig::default()
        .lease(Duration::from_secs(10))
        .retention(Duration::from_secs(600))
        .max_records_per_scope(7)
        .max_records_total(70);
    let engine = Engine::new(config);
    let owner = FencingToken::from_u64(0xfeed);
    let req = default_request(&engine, owner);
    assert_eq!(req.id.scope, scope());
    assert_eq!(req.id.key.as_str(), KEY);
    assert_eq!(&*req.tool_name, TOOL);
    assert_eq!(req.owner, owner);
    assert_eq!(req.now, at(T0));
    assert_eq!(req.lease_expires_at, at(T0 + 10_000));
    assert_eq!(req.expires_at, at(T0 + 600_000));
    assert_eq!(
        req.limits,
        RecordLimits {
            max_records_per_scope: 7,
            max_records_total: 70
        }
    );
    // Same call, same fingerprint; another tool or other arguments, another fingerprint.
    assert_eq!(req.fingerprint, fingerprint_of(&engine, TOOL, Some(ARGS)));
    assert_ne!(
        req.fingerprint,
        fingerprint_of(&engine, "refund", Some(ARGS))
    );
    assert_ne!(
        req.fingerprint,
        fingerprint_of(
            &engine,
            TOOL,
            Some(r#"{"amount": 4201, "currency": "usd"}"#)
        )
    );
}

#[test]
fn an_in_progress_record_outlives_its_lease_even_with_a_shorter_retention() {
    // Retention runs from completion. Were the claim's record to expire before its lease, a
    // duplicate of the still-running call could claim the key anew and execute a second time.
    let engine = Engine::new(
        EngineConfig::default()
            .lease(Duration::from_secs(30))
            .retention(Duration::from_secs(5))
            .after_crash(AfterCrash::Reexecute),
    );
    let req = default_request(&engine, FencingToken::random());
    assert_eq!(req.lease_expires_at, at(T0 + 30_000));
    assert!(req.expires_at >= req.lease_expires_at, "{req:?}");

    let existing = record(
        &req,
        req.fingerprint,
        in_progress(FencingToken::random(), T0),
    );
    let to = take_over(engine.on_claim(req, Ok(ClaimOutcome::Existing(existing))));
    assert!(to.expires_at >= to.lease_expires_at, "{to:?}");

    // The completed record is kept for the retention window only.
    let claim = executed(engine.on_take_over(to, Ok(Fenced::Applied)));
    let done = engine.completion(&claim, Outcome::Success("{}".into()), at(T0 + 1_000));
    assert_eq!(done.expires_at, at(T0 + 6_000));
}

#[test]
fn defaults_match_the_documented_values() {
    let engine = Engine::default();
    let req = default_request(&engine, FencingToken::random());
    assert_eq!(req.lease_expires_at, at(T0).saturating_add(DEFAULT_LEASE));
    assert_eq!(req.expires_at, at(T0).saturating_add(DEFAULT_RETENTION));
    assert_eq!(DEFAULT_RETENTION, Duration::from_secs(24 * 3600));
    assert_eq!(engine.config().after_crash_policy(), AfterCrash::Reject);
}

#[test]
fn claimed_executes_with_the_right_claim() {
    let engine = Engine::new(EngineConfig::default().lease(Duration::from_millis(12_345)));
    let owner = FencingToken::random();
    let req = default_request(&engine, owner);
    let id = req.id.clone();
    let claim = executed(engine.on_claim(req, Ok(ClaimOutcome::Claimed)));
    assert_eq!(claim.id(), &id);
    assert_eq!(claim.id().scope, scope());
    assert_eq!(claim.id().key.as_str(), KEY);
    assert_eq!(claim.owner(), owner);
    assert_eq!(claim.lease_expires_at(), at(T0 + 12_345));
}

#[test]
fn timestamps_saturate_at_the_far_future() {
    let engine = Engine::new(
        EngineConfig::default()
            .lease(Duration::MAX)
            .retention(Duration::MAX),
    );
    let req = claim_request(
        &engine,
        TOOL,
        Some(ARGS),
        KEY,
        FencingToken::random(),
        at(u64::MAX - 1),
    );
    assert_eq!(req.lease_expires_at, at(u64::MAX));
    assert_eq!(req.expires_at, at(u64::MAX));
    let claim = executed(engine.on_claim(req, Ok(ClaimOutcome::Claimed)));
    assert_eq!(claim.lease_expires_at(), at(u64::MAX));
}

// ---------------------------------------------------------------------------------------------
// Replay

const RESULT_RAW: &str =
    "{ \"content\" : [ {\"type\":\"text\", \"text\":\"caf\\u00e9 \u{1F600}\"} ],\n  \"isError\":false }";
const ERROR_RAW: &str = "{\"code\": -32603 ,\"message\":\"boom\\n\",\"data\":{ \"b\":1, \"a\":2 }}";

#[test]
fn completed_success_replays_the_result_byte_for_byte() {
    let engine = Engine::default();
    let req = default_request(&engine, FencingToken::random());
    let existing = record(
        &req,
        req.fingerprint,
        completed(Outcome::Success(RESULT_RAW.into())),
    );
    let decision = done(engine.on_claim(req, Ok(ClaimOutcome::Existing(existing))));
    assert_eq!(
        decision,
        Decision::Replay(Replay::Result(RESULT_RAW.into()))
    );
}

#[test]
fn completed_error_replays_the_error_byte_for_byte() {
    let engine = Engine::default();
    let req = default_request(&engine, FencingToken::random());
    let existing = record(
        &req,
        req.fingerprint,
        completed(Outcome::Error(ERROR_RAW.into())),
    );
    let decision = done(engine.on_claim(req, Ok(ClaimOutcome::Existing(existing))));
    assert_eq!(decision, Decision::Replay(Replay::Error(ERROR_RAW.into())));
}

#[test]
fn completed_records_replay_under_either_after_crash_policy() {
    for policy in [AfterCrash::Reject, AfterCrash::Reexecute] {
        let engine = Engine::new(EngineConfig::default().after_crash(policy));
        let req = default_request(&engine, FencingToken::random());
        let existing = record(
            &req,
            req.fingerprint,
            completed(Outcome::Success("{}".into())),
        );
        assert_eq!(
            done(engine.on_claim(req, Ok(ClaimOutcome::Existing(existing)))),
            Decision::Replay(Replay::Result("{}".into()))
        );
    }
}

#[test]
fn replay_response_carries_the_new_id_and_the_exact_bytes() {
    let result = Replay::Result(RESULT_RAW.into());
    let response = result.to_response(&json!(7));
    assert_eq!(
        response,
        format!(r#"{{"jsonrpc":"2.0","id":7,"result":{RESULT_RAW}}}"#)
    );
    assert!(response.contains(RESULT_RAW));
    let parsed: Value = serde_json::from_str(&response).expect("valid JSON-RPC response");
    assert_eq!(parsed["jsonrpc"], json!("2.0"));
    assert_eq!(parsed["id"], json!(7));
    assert_eq!(
        parsed["result"],
        serde_json::from_str::<Value>(RESULT_RAW).unwrap()
    );
    assert!(parsed.get("error").is_none());
    assert_eq!(parsed.as_object().unwrap().len(), 3);

    let error = Replay::Error(ERROR_RAW.into());
    let response = error.to_response(&json!(7));
    assert_eq!(
        response,
        format!(r#"{{"jsonrpc":"2.0","id":7,"error":{ERROR_RAW}}}"#)
    );
    let parsed: Value = serde_json::from_str(&response).expect("valid JSON-RPC response");
    assert_eq!(parsed["id"], json!(7));
    assert_eq!(
        parsed["error"],
        serde_json::from_str::<Value>(ERROR_RAW).unwrap()
    );
    assert!(parsed.get("result").is_none());

    // String ids (with characters that need escaping) and null ids stay valid JSON.
    for id in [json!("req-\"1\"\n"), json!(null), json!(-3), json!("日本")] {
        let response = Replay::Result("{}".into()).to_response(&id);
        let parsed: Value = serde_json::from_str(&response).expect("valid JSON");
        assert_eq!(parsed["id"], id);
        assert_eq!(parsed["result"], json!({}));
    }
}

#[test]
fn not_retained_outcome_is_refused_not_rerun() {
    let engine = Engine::default();
    let req = default_request(&engine, FencingToken::random());
    let existing = record(
        &req,
        req.fingerprint,
        completed(Outcome::NotRetained { size: 2_000_000 }),
    );
    let rejection = rejected(engine.on_claim(req, Ok(ClaimOutcome::Existing(existing))));
    check_error(
        &rejection,
        RejectionKind::OutcomeNotRetained,
        INTERNAL_ERROR,
        Some(KEY),
    );
    message_mentions(&rejection, &["2000000"]);
}

#[test]
fn unknown_outcome_is_refused_not_rerun() {
    let engine = Engine::default();
    let req = default_request(&engine, FencingToken::random());
    let existing = record(
        &req,
        req.fingerprint,
        completed(Outcome::Unknown {
            reason: "upstream exited mid-call".into(),
        }),
    );
    let rejection = rejected(engine.on_claim(req, Ok(ClaimOutcome::Existing(existing))));
    check_error(
        &rejection,
        RejectionKind::OutcomeUnknown,
        INTERNAL_ERROR,
        Some(KEY),
    );
    assert_eq!(INTERNAL_ERROR, -32603);
    message_mentions(&rejection, &["upstream exited mid-call", "may or may not"]);
}

// ---------------------------------------------------------------------------------------------
// Conflict

#[test]
fn different_tool_or_arguments_conflict_whatever_the_record_state() {
    for policy in [AfterCrash::Reject, AfterCrash::Reexecute] {
        let engine = Engine::new(EngineConfig::default().after_crash(policy));
        let dead_owner = FencingToken::random();
        let states = [
            in_progress(dead_owner, T0 + 10_000), // live lease
            in_progress(dead_owner, T0),          // lease ran out just now
            in_progress(dead_owner, 0),           // long dead
            completed(Outcome::Success(RESULT_RAW.into())),
            completed(Outcome::Error(ERROR_RAW.into())),
            completed(Outcome::NotRetained { size: 9 }),
            completed(Outcome::Unknown { reason: "x".into() }),
        ];
        let originals = [
            fingerprint_of(&engine, "refund_payment", Some(ARGS)),
            fingerprint_of(&engine, TOOL, Some(r#"{"amount": 1, "currency": "usd"}"#)),
            fingerprint_of(&engine, TOOL, Some(r#"{"amount": 4200}"#)),
            fingerprint_of(&engine, TOOL, None),
        ];
        for state in &states {
            for original in originals {
                let req = default_request(&engine, FencingToken::random());
                assert_ne!(original, req.fingerprint);
                let existing = record(&req, original, state.clone());
                let rejection =
                    rejected(engine.on_claim(req, Ok(ClaimOutcome::Existing(existing))));
                check_error(
                    &rejection,
                    RejectionKind::KeyConflict,
                    INVALID_PARAMS,
                    Some(KEY),
                );
                message_mentions(&rejection, &["different"]);
            }
        }
    }
}

#[test]
fn conflict_never_leaks_the_original_outcome() {
    let engine = Engine::default();
    let req = default_request(&engine, FencingToken::random());
    let secret = r#"{"content":[{"type":"text","text":"SECRET-OUTCOME"}]}"#;
    let existing = record(
        &req,
        Fingerprint::from_bytes([0xab; 32]),
        completed(Outcome::Success(secret.into())),
    );
    let rejection = rejected(engine.on_claim(req, Ok(ClaimOutcome::Existing(existing))));
    assert!(!rejection
        .to_error_object()
        .to_string()
        .contains("SECRET-OUTCOME"));
}

// ---------------------------------------------------------------------------------------------
// In progress and after a crash

#[test]
fn live_lease_is_in_progress_with_the_configured_retry_hint() {
    for policy in [AfterCrash::Reject, AfterCrash::Reexecute] {
        let engine = Engine::new(
            EngineConfig::default()
                .after_crash(policy)
                .in_progress_retry_after(Duration::from_millis(250)),
        );
        // Any lease deadline strictly after now is live, even by one millisecond.
        for lease in [T0 + 1, T0 + 30_000, u64::MAX] {
            let req = default_request(&engine, FencingToken::random());
            let existing = record(
                &req,
                req.fingerprint,
                in_progress(FencingToken::random(), lease),
            );
            let rejection = rejected(engine.on_claim(req, Ok(ClaimOutcome::Existing(existing))));
            let data = check_error(
                &rejection,
                RejectionKind::KeyInProgress,
                INVALID_PARAMS,
                Some(KEY),
            );
            assert_eq!(data["retryAfterMs"], json!(250));
            assert_eq!(rejection.retry_after(), Some(Duration::from_millis(250)));
            message_mentions(&rejection, &["in progress"]);
        }
    }
}

#[test]
fn default_in_progress_retry_hint_is_one_second() {
    let engine = Engine::default();
    let req = default_request(&engine, FencingToken::random());
    let existing = record(
        &req,
        req.fingerprint,
        in_progress(FencingToken::random(), T0 + 1),
    );
    let rejection = rejected(engine.on_claim(req, Ok(ClaimOutcome::Existing(existing))));
    assert_eq!(
        rejection.to_error_object()["data"]["retryAfterMs"],
        json!(1000)
    );
}

#[test]
fn dead_lease_with_reject_policy_is_outcome_unknown() {
    let engine = Engine::new(EngineConfig::default().after_crash(AfterCrash::Reject));
    // A lease deadline equal to now has run out.
    for lease in [T0, T0 - 1, 0] {
        let req = default_request(&engine, FencingToken::random());
        let existing = record(
            &req,
            req.fingerprint,
            in_progress(FencingToken::random(), lease),
        );
        let rejection = rejected(engine.on_claim(req, Ok(ClaimOutcome::Existing(existing))));
        let data = check_error(
            &rejection,
            RejectionKind::OutcomeUnknown,
            INTERNAL_ERROR,
            Some(KEY),
        );
        assert_eq!(rejection.to_error_object()["code"], json!(-32603));
        assert!(!data.contains_key("retryAfterMs"), "{data:?}");
        message_mentions(&rejection, &["may or may not"]);
    }
}

fn dead_lease_take_over(engine: &Engine, caller: FencingToken) -> (FencingToken, TakeOverRequest) {
    let dead_owner = FencingToken::from_u64(0xdead);
    let req = default_request(engine, caller);
    let existing = record(&req, req.fingerprint, in_progress(dead_owner, T0 - 1));
    let step = engine.on_claim(req, Ok(ClaimOutcome::Existing(existing)));
    (dead_owner, take_over(step))
}

fn reexecute_engine() -> Engine {
    Engine::new(
        EngineConfig::default()
            .after_crash(AfterCrash::Reexecute)
            .lease(Duration::from_secs(20))
            .retention(Duration::from_secs(7200))
            .in_progress_retry_after(Duration::from_millis(750)),
    )
}

#[test]
fn dead_lease_with_reexecute_policy_asks_for_a_take_over() {
    let engine = reexecute_engine();
    let caller = FencingToken::from_u64(0xca11);
    let (dead_owner, req) = dead_lease_take_over(&engine, caller);
    assert_eq!(req.previous_owner, dead_owner);
    assert_eq!(req.new_owner, caller);
    assert_eq!(req.id.scope, scope());
    assert_eq!(req.id.key.as_str(), KEY);
    assert_eq!(req.now, at(T0));
    assert_eq!(req.lease_expires_at, at(T0 + 20_000));
    assert_eq!(req.expires_at, at(T0 + 7_200_000));

    // Also when the deadline is exactly now.
    let req = default_request(&engine, caller);
    let existing = record(&req, req.fingerprint, in_progress(dead_owner, T0));
    let to = take_over(engine.on_claim(req, Ok(ClaimOutcome::Existing(existing))));
    assert_eq!(to.previous_owner, dead_owner);
}

#[test]
fn applied_take_over_executes_as_the_new_owner() {
    let engine = reexecute_engine();
    let caller = FencingToken::from_u64(0xca11);
    let (_, req) = dead_lease_take_over(&engine, caller);
    let id = req.id.clone();
    let claim = executed(engine.on_take_over(req, Ok(Fenced::Applied)));
    assert_eq!(claim.owner(), caller);
    assert_eq!(claim.id(), &id);
    assert_eq!(claim.lease_expires_at(), at(T0 + 20_000));
}

#[test]
fn lost_take_over_is_in_progress() {
    let engine = reexecute_engine();
    let (_, req) = dead_lease_take_over(&engine, FencingToken::random());
    let rejection = rejected(engine.on_take_over(req, Ok(Fenced::NotOwner)));
    let data = check_error(
        &rejection,
        RejectionKind::KeyInProgress,
        INVALID_PARAMS,
        Some(KEY),
    );
    assert_eq!(data["retryAfterMs"], json!(750));
}

#[test]
fn failed_take_over_is_store_unavailable() {
    let engine = reexecute_engine();
    let (_, req) = dead_lease_take_over(&engine, FencingToken::random());
    let rejection = rejected(engine.on_take_over(req, Err(unavailable("connection reset"))));
    let data = check_error(
        &rejection,
        RejectionKind::StoreUnavailable,
        INTERNAL_ERROR,
        Some(KEY),
    );
    assert!(data.contains_key("retryAfterMs"));
    // Store internals are not leaked to the client.
    assert!(!rejection.message().contains("connection reset"));
}

// ---------------------------------------------------------------------------------------------
// Quotas and store failures

#[test]
fn scope_quota_is_refused_with_its_limit() {
    let engine = Engine::default();
    let req = default_request(&engine, FencingToken::random());
    let rejection = rejected(engine.on_claim(
        req,
        Ok(ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope {
            limit: 10,
        })),
    ));
    let data = check_error(
        &rejection,
        RejectionKind::QuotaExceeded,
        INVALID_PARAMS,
        Some(KEY),
    );
    assert_eq!(data["limit"], json!(10));
    message_mentions(&rejection, &["10"]);
}

#[test]
fn total_quota_is_refused_with_its_limit() {
    let engine = Engine::default();
    let req = default_request(&engine, FencingToken::random());
    let rejection = rejected(engine.on_claim(
        req,
        Ok(ClaimOutcome::QuotaExceeded(QuotaExceeded::Total {
            limit: 100_000,
        })),
    ));
    let data = check_error(
        &rejection,
        RejectionKind::QuotaExceeded,
        INVALID_PARAMS,
        Some(KEY),
    );
    assert_eq!(data["limit"], json!(100_000));
    message_mentions(&rejection, &["100000"]);
}

fn store_errors() -> Vec<StoreError> {
    vec![
        unavailable("cannot connect"),
        StoreError::Backend {
            message: "disk I/O error".into(),
            source: Some(Box::new(std::io::Error::other("eio"))),
        },
        StoreError::Corrupt(CorruptRecord("bad row".into())),
        StoreError::InvalidUrl {
            url: "bogus://".into(),
            reason: "unknown scheme".into(),
        },
    ]
}

#[test]
fn store_error_on_claim_fails_closed() {
    for policy in [AfterCrash::Reject, AfterCrash::Reexecute] {
        let engine = Engine::new(EngineConfig::default().after_crash(policy));
        for err in store_errors() {
            let req = default_request(&engine, FencingToken::random());
            let step = engine.on_claim(req, Err(err));
            let decision = done(step);
            assert!(!matches!(decision, Decision::Execute(_)));
            let Decision::Reject(rejection) = decision else {
                panic!("expected a rejection, got {decision:?}")
            };
            let data = check_error(
                &rejection,
                RejectionKind::StoreUnavailable,
                INTERNAL_ERROR,
                Some(KEY),
            );
            assert_eq!(rejection.to_error_object()["code"], json!(-32603));
            assert!(data.contains_key("retryAfterMs"));
            message_mentions(&rejection, &["not executed"]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Completion

fn claim_at(engine: &Engine, now: u64) -> Claim {
    let req = claim_request(
        engine,
        TOOL,
        Some(ARGS),
        KEY,
        FencingToken::random(),
        at(now),
    );
    executed(engine.on_claim(req, Ok(ClaimOutcome::Claimed)))
}

#[test]
fn completion_keeps_outcomes_within_the_limit() {
    let engine = Engine::new(
        EngineConfig::default()
            .max_outcome_bytes(16)
            .retention(Duration::from_secs(60)),
    );
    let claim = claim_at(&engine, T0);
    let exactly = "[0,1,2,3,4,5,67]"; // 16 bytes
    assert_eq!(exactly.len(), 16);
    for outcome in [
        Outcome::Success(exactly.into()),
        Outcome::Error(exactly.into()),
        Outcome::Success("{}".into()),
        Outcome::Error(String::new()),
    ] {
        let req = engine.completion(&claim, outcome.clone(), at(T0 + 5_000));
        assert_eq!(req.outcome, outcome);
        assert_eq!(&req.id, claim.id());
        assert_eq!(req.owner, claim.owner());
        assert_eq!(req.completed_at, at(T0 + 5_000));
        // Retention runs from completion, not from the claim.
        assert_eq!(req.expires_at, at(T0 + 5_000 + 60_000));
    }
}

#[test]
fn completion_drops_outcomes_over_the_limit() {
    let engine = Engine::new(EngineConfig::default().max_outcome_bytes(16));
    let claim = claim_at(&engine, T0);
    let big = "[0,1,2,3,4,5,678]"; // 17 bytes
    for outcome in [Outcome::Success(big.into()), Outcome::Error(big.into())] {
        let req = engine.completion(&claim, outcome, at(T0 + 1));
        assert_eq!(req.outcome, Outcome::NotRetained { size: 17 });
        assert_eq!(req.expires_at, at(T0 + 1).saturating_add(DEFAULT_RETENTION));
    }
    // Multi-byte text is measured in bytes.
    let req = engine.completion(&claim, Outcome::Success("\"ééééééééé\"".into()), at(T0));
    assert_eq!(req.outcome, Outcome::NotRetained { size: 20 });
}

#[test]
fn completion_passes_through_outcomes_without_a_body() {
    let engine = Engine::new(EngineConfig::default().max_outcome_bytes(1));
    let claim = claim_at(&engine, T0);
    for outcome in [
        Outcome::NotRetained { size: 5 },
        Outcome::Unknown {
            reason: "a long reason that is longer than one byte".into(),
        },
    ] {
        let req = engine.completion(&claim, outcome.clone(), at(T0));
        assert_eq!(req.outcome, outcome);
    }
}

#[test]
fn default_outcome_limit_is_one_mebibyte() {
    let engine = Engine::default();
    let claim = claim_at(&engine, T0);
    let fits = format!("\"{}\"", "x".repeat(1024 * 1024 - 2));
    let req = engine.completion(&claim, Outcome::Success(fits.clone()), at(T0));
    assert_eq!(req.outcome, Outcome::Success(fits));
    let too_big = format!("\"{}\"", "x".repeat(1024 * 1024 - 1));
    let req = engine.completion(&claim, Outcome::Success(too_big), at(T0));
    assert_eq!(
        req.outcome,
        Outcome::NotRetained {
            size: 1024 * 1024 + 1
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Lease renewal

#[test]
fn renewal_is_due_once_a_third_of_the_lease_has_passed() {
    let engine = Engine::new(EngineConfig::default().lease(Duration::from_secs(30)));
    let mut claim = claim_at(&engine, T0);
    assert_eq!(claim.lease_expires_at(), at(T0 + 30_000));
    assert_eq!(engine.renewal_due(&claim), at(T0 + 10_000));

    let deadline = engine.renew(&mut claim, at(T0 + 10_000));
    assert_eq!(deadline, at(T0 + 40_000));
    assert_eq!(claim.lease_expires_at(), deadline);
    assert_eq!(engine.renewal_due(&claim), at(T0 + 20_000));

    // Renewing late (after the deadline) still counts from now.
    let deadline = engine.renew(&mut claim, at(T0 + 100_000));
    assert_eq!(deadline, at(T0 + 130_000));
    assert_eq!(engine.renewal_due(&claim), at(T0 + 110_000));
}

#[test]
fn renewal_arithmetic_with_odd_and_extreme_leases() {
    // 31 s: a third is 10.333… s, so renewal is due 10 334 ms in (31 000 − 20 666).
    let engine = Engine::new(EngineConfig::default().lease(Duration::from_millis(31_000)));
    let claim = claim_at(&engine, T0);
    assert_eq!(engine.renewal_due(&claim), at(T0 + 10_334));
    assert!(engine.renewal_due(&claim) > at(T0));
    assert!(engine.renewal_due(&claim) < claim.lease_expires_at());

    // A zero lease is due at once.
    let engine = Engine::new(EngineConfig::default().lease(Duration::ZERO));
    let mut claim = claim_at(&engine, T0);
    assert_eq!(engine.renewal_due(&claim), at(T0));
    assert_eq!(engine.renew(&mut claim, at(T0 + 5)), at(T0 + 5));

    // Enormous leases saturate instead of overflowing.
    let engine = Engine::new(EngineConfig::default().lease(Duration::MAX));
    let mut claim = claim_at(&engine, 0);
    assert_eq!(claim.lease_expires_at(), at(u64::MAX));
    let _ = engine.renewal_due(&claim);
    assert_eq!(engine.renew(&mut claim, at(T0)), at(u64::MAX));

    // A claim made at time 0 cannot be due before time 0.
    let engine = Engine::new(EngineConfig::default().lease(Duration::from_secs(3)));
    let claim = claim_at(&engine, 0);
    assert_eq!(engine.renewal_due(&claim), at(1_000));
}

#[test]
fn take_over_claim_renews_like_any_other() {
    let engine = reexecute_engine(); // 20 s lease
    let (_, req) = dead_lease_take_over(&engine, FencingToken::random());
    let mut claim = executed(engine.on_take_over(req, Ok(Fenced::Applied)));
    assert_eq!(engine.renewal_due(&claim), at(T0 + 6_667));
    assert_eq!(engine.renew(&mut claim, at(T0 + 7_000)), at(T0 + 27_000));
}

// ---------------------------------------------------------------------------------------------
// Error codes

#[test]
fn no_rejection_kind_uses_a_reserved_code() {
    for kind in RejectionKind::ALL {
        assert!(!is_reserved(kind.code()), "{kind:?}");
        assert!(
            kind.code() == INVALID_PARAMS || kind.code() == INTERNAL_ERROR,
            "{kind:?}"
        );
    }
    assert_eq!(INVALID_PARAMS, -32602);
    assert_eq!(INTERNAL_ERROR, -32603);
}

#[test]
fn the_same_key_in_another_scope_is_another_record() {
    let engine = Engine::default();
    let key = json!(KEY);
    let c = call(TOOL, Some(ARGS), Some(&key));
    let Step::TryClaim(a) = engine.begin(
        &Scope::new("ns", "alice"),
        &c,
        FencingToken::random(),
        at(T0),
    ) else {
        panic!()
    };
    let Step::TryClaim(b) =
        engine.begin(&Scope::new("ns", "bob"), &c, FencingToken::random(), at(T0))
    else {
        panic!()
    };
    let Step::TryClaim(c2) = engine.begin(
        &Scope::new("other-ns", "alice"),
        &c,
        FencingToken::random(),
        at(T0),
    ) else {
        panic!()
    };
    assert_ne!(a.id, b.id);
    assert_ne!(a.id, c2.id);
    assert_eq!(a.id.key, b.id.key);
    assert_eq!(a.fingerprint, b.fingerprint);
}

#[test]
fn record_ids_are_built_from_valid_keys() {
    // A sanity check of the public constructors the tests above rely on.
    let id = RecordId {
        scope: scope(),
        key: IdempotencyKey::new(KEY, DEFAULT_MAX_KEY_BYTES).unwrap(),
    };
    let req = default_request(&Engine::default(), FencingToken::random());
    assert_eq!(req.id, id);
}

// ---------------------------------------------------------------------------------------------
// Property: the engine fails closed

/// A store answer to a claim, as generated data (a `StoreError` is neither `Clone` nor `Debug`-equal).
#[derive(Clone, Debug)]
enum ClaimAnswer {
    Claimed,
    Existing {
        same_fingerprint: bool,
        other_fingerprint: [u8; 32],
        state: GenState,
    },
    Quota(QuotaExceeded),
    Err(ErrKind),
}

#[derive(Clone, Debug)]
enum GenState {
    InProgress { owner: u64, lease: GenTime },
    Completed(GenOutcome),
}

#[derive(Clone, Debug)]
enum GenOutcome {
    Success(String),
    Error(String),
    NotRetained(u64),
    Unknown(String),
}

/// A time relative to the simulated now, or an absolute extreme.
#[derive(Clone, Copy, Debug)]
enum GenTime {
    Relative(i64),
    Absolute(u64),
}

#[derive(Clone, Copy, Debug)]
enum ErrKind {
    Unavailable,
    Backend,
    Corrupt,
    InvalidUrl,
}

#[derive(Clone, Copy, Debug)]
enum TakeOverAnswer {
    Applied,
    NotOwner,
    Err(ErrKind),
}

fn build_error(kind: ErrKind) -> StoreError {
    match kind {
        ErrKind::Unavailable => unavailable("down"),
        ErrKind::Backend => StoreError::Backend {
            message: "boom".into(),
            source: None,
        },
        ErrKind::Corrupt => StoreError::Corrupt(CorruptRecord("x".into())),
        ErrKind::InvalidUrl => StoreError::InvalidUrl {
            url: "x".into(),
            reason: "y".into(),
        },
    }
}

fn resolve(time: GenTime, now: u64) -> u64 {
    match time {
        GenTime::Relative(delta) => now.saturating_add_signed(delta),
        GenTime::Absolute(t) => t,
    }
}

fn err_kind() -> impl Strategy<Value = ErrKind> {
    prop_oneof![
        Just(ErrKind::Unavailable),
        Just(ErrKind::Backend),
        Just(ErrKind::Corrupt),
        Just(ErrKind::InvalidUrl),
    ]
}

fn gen_time() -> impl Strategy<Value = GenTime> {
    prop_oneof![
        4 => (-5i64..=5).prop_map(GenTime::Relative),
        4 => (-100_000i64..=100_000).prop_map(GenTime::Relative),
        1 => any::<i64>().prop_map(GenTime::Relative),
        1 => prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()].prop_map(GenTime::Absolute),
    ]
}

fn gen_outcome() -> impl Strategy<Value = GenOutcome> {
    prop_oneof![
        ".{0,40}".prop_map(GenOutcome::Success),
        ".{0,40}".prop_map(GenOutcome::Error),
        any::<u64>().prop_map(GenOutcome::NotRetained),
        ".{0,20}".prop_map(GenOutcome::Unknown),
    ]
}

fn gen_state() -> impl Strategy<Value = GenState> {
    prop_oneof![
        (any::<u64>(), gen_time()).prop_map(|(owner, lease)| GenState::InProgress { owner, lease }),
        gen_outcome().prop_map(GenState::Completed),
    ]
}

fn claim_answer() -> impl Strategy<Value = ClaimAnswer> {
    prop_oneof![
        2 => Just(ClaimAnswer::Claimed),
        6 => (any::<bool>(), any::<[u8; 32]>(), gen_state()).prop_map(
            |(same_fingerprint, other_fingerprint, state)| ClaimAnswer::Existing {
                same_fingerprint,
                other_fingerprint,
                state,
            }
        ),
        1 => prop_oneof![
            any::<u64>().prop_map(|limit| QuotaExceeded::Scope { limit }),
            any::<u64>().prop_map(|limit| QuotaExceeded::Total { limit }),
        ]
        .prop_map(ClaimAnswer::Quota),
        2 => err_kind().prop_map(ClaimAnswer::Err),
    ]
}

fn take_over_answer() -> impl Strategy<Value = TakeOverAnswer> {
    prop_oneof![
        Just(TakeOverAnswer::Applied),
        Just(TakeOverAnswer::NotOwner),
        err_kind().prop_map(TakeOverAnswer::Err),
    ]
}

fn gen_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        4 => (0u64..=120_000).prop_map(Duration::from_millis),
        1 => any::<u64>().prop_map(Duration::from_millis),
        1 => Just(Duration::MAX),
    ]
}

fn gen_policy() -> impl Strategy<Value = EngineConfig> {
    (
        any::<bool>(),
        gen_duration(),
        gen_duration(),
        gen_duration(),
        0usize..64,
    )
        .prop_map(|(reexecute, lease, retention, retry_after, max_outcome)| {
            EngineConfig::default()
                .after_crash(if reexecute {
                    AfterCrash::Reexecute
                } else {
                    AfterCrash::Reject
                })
                .lease(lease)
                .retention(retention)
                .in_progress_retry_after(retry_after)
                .max_outcome_bytes(max_outcome)
        })
}

/// The request side: mostly valid, sometimes a bad key, bad arguments or an MRTR continuation.
#[derive(Clone, Debug)]
struct GenCall {
    key: Option<Value>,
    arguments: Option<String>,
    mrtr: bool,
}

fn gen_call() -> impl Strategy<Value = GenCall> {
    let key = prop_oneof![
        8 => "[a-zA-Z0-9-]{1,40}".prop_map(|k| Some(json!(k))),
        1 => Just(None),
        1 => prop_oneof![
            Just(json!(42)),
            Just(json!(null)),
            Just(json!(true)),
            Just(json!("")),
            Just(json!("a\u{0}b")),
            Just(json!("k".repeat(300))),
            Just(json!({"k": 1})),
        ]
        .prop_map(Some),
    ];
    let arguments = prop_oneof![
        8 => Just(Some(ARGS.to_owned())),
        1 => Just(None),
        1 => Just(Some("{broken".to_owned())),
    ];
    let mrtr = prop_oneof![9 => Just(false), 1 => Just(true)];
    (key, arguments, mrtr).prop_map(|(key, arguments, mrtr)| GenCall {
        key,
        arguments,
        mrtr,
    })
}

fn check_rejection_codes(rejection: &Rejection) {
    let object = rejection.to_error_object();
    let code = object["code"].as_i64().expect("integer code");
    assert!(!is_reserved(code), "reserved code {code}");
    assert!(code == INVALID_PARAMS || code == INTERNAL_ERROR, "{code}");
    assert_eq!(object["data"]["type"], json!(rejection.kind().as_str()));
    assert!(!rejection.message().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// Whatever the store answers, the engine says Execute only when the store granted the key: a
    /// `Claimed` answer, or an `Applied` take-over. It also says Execute whenever the store did
    /// grant it, as the caller's own token, and every refusal stays out of the reserved codes.
    #[test]
    fn executes_only_when_the_store_granted_the_key(
        config in gen_policy(),
        now in prop_oneof![4 => 0u64..=u64::MAX / 2, 1 => any::<u64>()],
        token in any::<u64>(),
        gen_call in gen_call(),
        answer in claim_answer(),
        take_over_answer in take_over_answer(),
    ) {
        let engine = Engine::new(config.clone());
        let caller = FencingToken::from_u64(token);
        let tool_call = ToolCall {
            tool_name: TOOL,
            arguments: gen_call.arguments.as_deref(),
            idempotency_key: gen_call.key.as_ref(),
            mrtr_continuation: gen_call.mrtr,
        };
        let req = match engine.begin(&scope(), &tool_call, caller, at(now)) {
            Step::Done(decision) => {
                // Decided without the store: never Execute, never Replay.
                match &decision {
                    Decision::Bypass(_) => {
                        prop_assert!(gen_call.mrtr || gen_call.key.is_none());
                    }
                    Decision::Reject(rejection) => check_rejection_codes(rejection),
                    other => prop_assert!(false, "decided {other:?} without the store"),
                }
                return Ok(());
            }
            Step::TryClaim(req) => req,
            Step::TakeOver(req) => {
                prop_assert!(false, "take-over before any claim: {req:?}");
                unreachable!()
            }
        };
        prop_assert!(!gen_call.mrtr && gen_call.key.is_some());
        prop_assert_eq!(req.owner, caller);
        prop_assert_eq!(req.now, at(now));

        let mut granted = false;
        let mut took_over = false;
        let outcome = match &answer {
            ClaimAnswer::Claimed => {
                granted = true;
                Ok(ClaimOutcome::Claimed)
            }
            ClaimAnswer::Existing { same_fingerprint, other_fingerprint, state } => {
                let fingerprint = if *same_fingerprint {
                    req.fingerprint
                } else {
                    Fingerprint::from_bytes(*other_fingerprint)
                };
                let state = match state {
                    GenState::InProgress { owner, lease } => RecordState::InProgress {
                        owner: FencingToken::from_u64(*owner),
                        lease_expires_at: at(resolve(*lease, now)),
                    },
                    GenState::Completed(outcome) => RecordState::Completed {
                        outcome: match outcome {
                            GenOutcome::Success(s) => Outcome::Success(s.clone()),
                            GenOutcome::Error(s) => Outcome::Error(s.clone()),
                            GenOutcome::NotRetained(size) => Outcome::NotRetained { size: *size },
                            GenOutcome::Unknown(r) => Outcome::Unknown { reason: r.clone() },
                        },
                        completed_at: at(now / 2),
                    },
                };
                Ok(ClaimOutcome::Existing(record(&req, fingerprint, state)))
            }
            ClaimAnswer::Quota(quota) => Ok(ClaimOutcome::QuotaExceeded(*quota)),
            ClaimAnswer::Err(kind) => Err(build_error(*kind)),
        };
        let fingerprint = req.fingerprint;
        let mut step = engine.on_claim(req, outcome);
        if let Step::TakeOver(to) = step {
            // Only a dead lease of an equivalent call under `reexecute` may be taken over.
            let ClaimAnswer::Existing {
                same_fingerprint: true,
                state: GenState::InProgress { owner, lease },
                ..
            } = &answer else {
                prop_assert!(false, "take-over for {answer:?}");
                unreachable!()
            };
            prop_assert_eq!(config.after_crash_policy(), AfterCrash::Reexecute);
            prop_assert!(at(resolve(*lease, now)) <= at(now), "took over a live lease");
            prop_assert_eq!(to.previous_owner, FencingToken::from_u64(*owner));
            prop_assert_eq!(to.new_owner, caller);
            prop_assert_eq!(to.now, at(now));
            took_over = true;
            let answer = match take_over_answer {
                TakeOverAnswer::Applied => {
                    granted = true;
                    Ok(Fenced::Applied)
                }
                TakeOverAnswer::NotOwner => Ok(Fenced::NotOwner),
                TakeOverAnswer::Err(kind) => Err(build_error(kind)),
            };
            step = engine.on_take_over(to, answer);
        }
        let decision = match step {
            Step::Done(decision) => decision,
            other => {
                prop_assert!(false, "engine did not decide: {other:?}");
                unreachable!()
            }
        };

        match &decision {
            Decision::Execute(claim) => {
                prop_assert!(granted, "Execute without a grant: {answer:?} / {take_over_answer:?}");
                prop_assert_eq!(claim.owner(), caller);
                prop_assert_eq!(
                    claim.lease_expires_at(),
                    at(now).saturating_add(config.lease_duration())
                );
            }
            Decision::Replay(replay) => {
                let ClaimAnswer::Existing {
                    same_fingerprint: true,
                    state: GenState::Completed(outcome),
                    ..
                } = &answer else {
                    prop_assert!(false, "replay for {answer:?}");
                    unreachable!()
                };
                match (outcome, replay) {
                    (GenOutcome::Success(s), Replay::Result(r))
                    | (GenOutcome::Error(s), Replay::Error(r)) => prop_assert_eq!(s, r),
                    other => prop_assert!(false, "wrong replay {other:?}"),
                }
            }
            Decision::Reject(rejection) => {
                prop_assert!(!granted, "granted key rejected: {rejection:?}");
                check_rejection_codes(rejection);
                // A conflict is reported exactly when the fingerprints differ.
                let conflicting = matches!(
                    &answer,
                    ClaimAnswer::Existing { same_fingerprint: false, other_fingerprint, .. }
                        if Fingerprint::from_bytes(*other_fingerprint) != fingerprint
                );
                prop_assert_eq!(rejection.kind() == RejectionKind::KeyConflict, conflicting);
                if matches!(answer, ClaimAnswer::Err(_))
                    || (took_over && matches!(take_over_answer, TakeOverAnswer::Err(_)))
                {
                    prop_assert_eq!(rejection.kind(), RejectionKind::StoreUnavailable);
                }
                prop_assert_eq!(rejection.key(), gen_call.key.as_ref().and_then(Value::as_str));
            }
            Decision::Bypass(reason) => prop_assert!(false, "bypass after a claim: {reason:?}"),
        }
        // Conversely, a grant always executes.
        if granted {
            prop_assert!(matches!(decision, Decision::Execute(_)));
        }
    }
}
