//! A record in progress: a live lease is answered with a retry hint, a dead one is outcome-unknown
//! or taken over (per `AfterCrash`); quotas and store failures on a claim fail closed.

use super::*;

// ---------------------------------------------------------------------------------------------
// In progress and after a crash

/// `idempotency_key_in_progress` for a record whose lease runs until `lease`.
fn in_progress_rejection(engine: &Engine, lease: u64) -> Rejection {
    let req = default_request(engine, FencingToken::random());
    let existing = record(
        &req,
        req.fingerprint,
        in_progress(FencingToken::random(), lease),
    );
    rejected(pending(engine).on_claim(req, Ok(ClaimOutcome::Existing(existing))))
}

#[test]
fn live_lease_is_in_progress_with_the_configured_retry_hint() {
    for policy in [AfterCrash::Reject, AfterCrash::Reexecute] {
        let engine = Engine::new(
            EngineConfig::default()
                .with_after_crash(policy)
                .with_in_progress_retry_after(Duration::from_millis(250)),
        );
        for lease in [T0 + 250, T0 + 30_000, u64::MAX] {
            let rejection = in_progress_rejection(&engine, lease);
            let data = check_error(
                &rejection,
                RejectionKind::KeyInProgress,
                INVALID_PARAMS,
                Some(KEY),
            );
            assert_eq!(data["retryAfterMs"], json!(250));
            assert_eq!(rejection.retry_after(), Some(Duration::from_millis(250)));
            message_mentions(&rejection, &["in progress", "same key", "in 250 ms"]);
        }
    }
}

#[test]
fn the_retry_hint_ends_with_the_lease_and_is_never_below_the_floor() {
    let engine = Engine::default();
    // A lease that runs out before the configured second: retry when it has.
    let rejection = in_progress_rejection(&engine, T0 + 400);
    assert_eq!(rejection.retry_after(), Some(Duration::from_millis(400)));
    message_mentions(&rejection, &["in 400 ms"]);
    // Any lease deadline strictly after now is live, even by one millisecond; the hint is then
    // the floor, never 0.
    for lease in [T0 + 1, T0 + 99, T0 + 100] {
        let rejection = in_progress_rejection(&engine, lease);
        assert_eq!(
            rejection.retry_after(),
            Some(EngineConfig::MIN_IN_PROGRESS_RETRY_AFTER)
        );
        assert_eq!(
            rejection.to_error_object()["data"]["retryAfterMs"],
            json!(100)
        );
    }
    // A configured hint of zero gets the floor too.
    let engine = Engine::new(EngineConfig::default().with_in_progress_retry_after(Duration::ZERO));
    let rejection = in_progress_rejection(&engine, T0 + 30_000);
    assert_eq!(rejection.retry_after(), Some(Duration::from_millis(100)));
}

#[test]
fn default_in_progress_retry_hint_is_one_second() {
    let rejection = in_progress_rejection(&Engine::default(), T0 + 30_000);
    assert_eq!(
        rejection.to_error_object()["data"]["retryAfterMs"],
        json!(1000)
    );
    assert_eq!(
        EngineConfig::DEFAULT_IN_PROGRESS_RETRY_AFTER,
        Duration::from_secs(1)
    );
}

#[test]
fn dead_lease_with_reject_policy_is_outcome_unknown() {
    let engine = Engine::new(EngineConfig::default().with_after_crash(AfterCrash::Reject));
    // A lease deadline equal to now has run out.
    for lease in [T0, T0 - 1, 0] {
        let req = default_request(&engine, FencingToken::random());
        let existing = record(
            &req,
            req.fingerprint,
            in_progress(FencingToken::random(), lease),
        );
        let rejection =
            rejected(pending(&engine).on_claim(req, Ok(ClaimOutcome::Existing(existing))));
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
    let to = take_over(pending(&engine).on_claim(req, Ok(ClaimOutcome::Existing(existing))));
    assert_eq!(to.previous_owner, dead_owner);
}

#[test]
fn applied_take_over_executes_as_the_new_owner() {
    let engine = reexecute_engine();
    let caller = FencingToken::from_u64(0xca11);
    let (_, req) = dead_lease_take_over(&engine, caller);
    let id = req.id.clone();
    let claim = executed(pending(&engine).on_take_over(req, Ok(Fenced::Applied)));
    assert_eq!(claim.owner(), caller);
    assert_eq!(claim.id(), &id);
    assert_eq!(claim.lease_expires_at(), at(T0 + 20_000));
}

#[test]
fn lost_take_over_is_in_progress() {
    let engine = reexecute_engine();
    let (_, req) = dead_lease_take_over(&engine, FencingToken::random());
    let rejection = rejected(pending(&engine).on_take_over(req, Ok(Fenced::NotOwner)));
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
    let rejection =
        rejected(pending(&engine).on_take_over(req, Err(unavailable("connection reset"))));
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
    let rejection = rejected(pending(&engine).on_claim(
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
    let rejection = rejected(pending(&engine).on_claim(
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
        let engine = Engine::new(EngineConfig::default().with_after_crash(policy));
        for err in store_errors() {
            let req = default_request(&engine, FencingToken::random());
            let step = pending(&engine).on_claim(req, Err(err));
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
