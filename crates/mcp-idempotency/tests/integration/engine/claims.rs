//! The claim request built from the config and a granted claim; completed records replayed byte for
//! byte; the same key with another call is a conflict.

use super::*;

fn fingerprint_of(engine: &Engine, tool: &str, args: Option<&str>) -> Fingerprint {
    claim_request(engine, tool, args, KEY, FencingToken::random(), at(T0)).fingerprint
}

fn completed(outcome: Outcome) -> RecordState {
    RecordState::Completed {
        outcome,
        completed_at: at(T0 - 1_000),
    }
}

// ---------------------------------------------------------------------------------------------
// The claim request and a granted claim

#[test]
fn begin_prepares_the_claim_from_the_config() {
    let config = EngineConfig::default()
        .with_lease(Duration::from_secs(10))
        .with_retention(Duration::from_secs(600))
        .with_max_records_per_scope(7)
        .with_max_records_total(70);
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
            .with_lease(Duration::from_secs(30))
            .with_retention(Duration::from_secs(5))
            .with_after_crash(AfterCrash::Reexecute),
    );
    let req = default_request(&engine, FencingToken::random());
    assert_eq!(req.lease_expires_at, at(T0 + 30_000));
    assert!(req.expires_at >= req.lease_expires_at, "{req:?}");

    let existing = record(
        &req,
        req.fingerprint,
        in_progress(FencingToken::random(), T0),
    );
    let to = take_over(pending(&engine).on_claim(req, Ok(ClaimOutcome::Existing(existing))));
    assert!(to.expires_at >= to.lease_expires_at, "{to:?}");

    // The completed record is kept for the retention window only.
    let claim = executed(pending(&engine).on_take_over(to, Ok(Fenced::Applied)));
    let done = engine.completion(&claim, Outcome::Success("{}".into()), at(T0 + 1_000));
    assert_eq!(done.expires_at, at(T0 + 6_000));
}

#[test]
fn defaults_match_the_documented_values() {
    let engine = Engine::default();
    let req = default_request(&engine, FencingToken::random());
    assert_eq!(
        req.lease_expires_at,
        at(T0).saturating_add(EngineConfig::DEFAULT_LEASE)
    );
    assert_eq!(
        req.expires_at,
        at(T0).saturating_add(EngineConfig::DEFAULT_RETENTION)
    );
    assert_eq!(
        EngineConfig::DEFAULT_RETENTION,
        Duration::from_secs(24 * 3600)
    );
    assert_eq!(engine.config().after_crash(), AfterCrash::Reject);
}

#[test]
fn claimed_executes_with_the_right_claim() {
    let engine = Engine::new(EngineConfig::default().with_lease(Duration::from_millis(12_345)));
    let owner = FencingToken::random();
    let req = default_request(&engine, owner);
    let id = req.id.clone();
    let claim = executed(pending(&engine).on_claim(req, Ok(ClaimOutcome::Claimed)));
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
            .with_lease(Duration::MAX)
            .with_retention(Duration::MAX),
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
    let claim = executed(pending(&engine).on_claim(req, Ok(ClaimOutcome::Claimed)));
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
    let decision = done(pending(&engine).on_claim(req, Ok(ClaimOutcome::Existing(existing))));
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
    let decision = done(pending(&engine).on_claim(req, Ok(ClaimOutcome::Existing(existing))));
    assert_eq!(decision, Decision::Replay(Replay::Error(ERROR_RAW.into())));
}

#[test]
fn completed_records_replay_under_either_after_crash_policy() {
    for policy in [AfterCrash::Reject, AfterCrash::Reexecute] {
        let engine = Engine::new(EngineConfig::default().with_after_crash(policy));
        let req = default_request(&engine, FencingToken::random());
        let existing = record(
            &req,
            req.fingerprint,
            completed(Outcome::Success("{}".into())),
        );
        assert_eq!(
            done(pending(&engine).on_claim(req, Ok(ClaimOutcome::Existing(existing)))),
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
    let rejection = rejected(pending(&engine).on_claim(req, Ok(ClaimOutcome::Existing(existing))));
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
    let rejection = rejected(pending(&engine).on_claim(req, Ok(ClaimOutcome::Existing(existing))));
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
        let engine = Engine::new(EngineConfig::default().with_after_crash(policy));
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
                    rejected(pending(&engine).on_claim(req, Ok(ClaimOutcome::Existing(existing))));
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
    let rejection = rejected(pending(&engine).on_claim(req, Ok(ClaimOutcome::Existing(existing))));
    assert!(!rejection
        .to_error_object()
        .to_string()
        .contains("SECRET-OUTCOME"));
}
