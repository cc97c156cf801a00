//! Sans-IO tests of the [`Engine`]: no runtime, no store, no clock. Every step is driven by hand
//! with a simulated clock and store answers built in the test.

use std::time::Duration;

use mcp_idempotency::fingerprint::Fingerprint;
use mcp_idempotency::jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS};
use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, Fenced, QuotaExceeded, RecordLimits, StoreError, TakeOverRequest,
};
use mcp_idempotency::{
    AfterCrash, BypassReason, Claim, CorruptRecord, Decision, Engine, EngineConfig, FencingToken,
    IdempotencyKey, Outcome, PendingDecision, Record, RecordId, RecordState, Rejection,
    RejectionKind, Replay, Scope, Step, Timestamp, ToolCall,
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
        ..Default::default()
    }
}

/// The first step of deciding `call` under `scope`.
fn first_step(
    engine: &Engine,
    scope: &Scope,
    call: &ToolCall<'_>,
    owner: FencingToken,
    now: Timestamp,
) -> Step {
    engine.begin(scope, *call, owner, now).1
}

/// The decision of a call with a SEP key and no tool policy, in progress: what the store's answers
/// to any claim or take-over lead to (its terms leave them as they are).
fn pending(engine: &Engine) -> PendingDecision<'_> {
    static SCOPE: std::sync::LazyLock<Scope> = std::sync::LazyLock::new(scope);
    static KEY_VALUE: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| json!(KEY));
    let call = call(TOOL, Some(ARGS), Some(&KEY_VALUE));
    engine.begin(&SCOPE, call, FencingToken::random(), at(T0)).0
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
    match first_step(engine, &scope(), &call(tool, args, Some(&key)), owner, now) {
        Step::TryClaim(req) => req,
        other => panic!("expected Step::TryClaim, got {other:?}"),
    }
}

/// The default request: TOOL, ARGS, KEY at T0.
fn default_request(engine: &Engine, owner: FencingToken) -> ClaimRequest {
    claim_request(engine, TOOL, Some(ARGS), KEY, owner, at(T0))
}

/// A record as a store would return it for `req.id`.
fn record(req: &ClaimRequest, fingerprint: Fingerprint, state: RecordState) -> Record {
    Record {
        trace: None,
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

fn dead_lease_take_over(engine: &Engine, caller: FencingToken) -> (FencingToken, TakeOverRequest) {
    let dead_owner = FencingToken::from_u64(0xdead);
    let req = default_request(engine, caller);
    let existing = record(&req, req.fingerprint, in_progress(dead_owner, T0 - 1));
    let step = pending(engine).on_claim(req, Ok(ClaimOutcome::Existing(existing)));
    (dead_owner, take_over(step))
}

fn reexecute_engine() -> Engine {
    Engine::new(
        EngineConfig::default()
            .with_after_crash(AfterCrash::Reexecute)
            .with_lease(Duration::from_secs(20))
            .with_retention(Duration::from_secs(7200))
            .with_in_progress_retry_after(Duration::from_millis(750)),
    )
}

mod claims;
mod completion;
mod in_progress;
mod input;
mod properties;
