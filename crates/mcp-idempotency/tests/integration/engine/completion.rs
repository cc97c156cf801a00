//! Completing a claim (the outcome size limit), when a lease is renewed, the JSON-RPC error codes of
//! rejections, and record ids per scope.

use super::*;

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
    executed(pending(engine).on_claim(req, Ok(ClaimOutcome::Claimed)))
}

#[test]
fn completion_keeps_outcomes_within_the_limit() {
    let engine = Engine::new(
        EngineConfig::default()
            .with_max_outcome_bytes(16)
            .with_retention(Duration::from_secs(60)),
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
    let engine = Engine::new(EngineConfig::default().with_max_outcome_bytes(16));
    let claim = claim_at(&engine, T0);
    let big = "[0,1,2,3,4,5,678]"; // 17 bytes
    for outcome in [Outcome::Success(big.into()), Outcome::Error(big.into())] {
        let req = engine.completion(&claim, outcome, at(T0 + 1));
        assert_eq!(req.outcome, Outcome::NotRetained { size: 17 });
        assert_eq!(
            req.expires_at,
            at(T0 + 1).saturating_add(EngineConfig::DEFAULT_RETENTION)
        );
    }
    // Multi-byte text is measured in bytes.
    let req = engine.completion(&claim, Outcome::Success("\"ééééééééé\"".into()), at(T0));
    assert_eq!(req.outcome, Outcome::NotRetained { size: 20 });
}

#[test]
fn completion_passes_through_outcomes_without_a_body() {
    let engine = Engine::new(EngineConfig::default().with_max_outcome_bytes(1));
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
    let engine = Engine::new(EngineConfig::default().with_lease(Duration::from_secs(30)));
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
    let engine = Engine::new(EngineConfig::default().with_lease(Duration::from_millis(31_000)));
    let claim = claim_at(&engine, T0);
    assert_eq!(engine.renewal_due(&claim), at(T0 + 10_334));
    assert!(engine.renewal_due(&claim) > at(T0));
    assert!(engine.renewal_due(&claim) < claim.lease_expires_at());

    // A zero lease is due at once.
    let engine = Engine::new(EngineConfig::default().with_lease(Duration::ZERO));
    let mut claim = claim_at(&engine, T0);
    assert_eq!(engine.renewal_due(&claim), at(T0));
    assert_eq!(engine.renew(&mut claim, at(T0 + 5)), at(T0 + 5));

    // Enormous leases saturate instead of overflowing.
    let engine = Engine::new(EngineConfig::default().with_lease(Duration::MAX));
    let mut claim = claim_at(&engine, 0);
    assert_eq!(claim.lease_expires_at(), at(u64::MAX));
    let _ = engine.renewal_due(&claim);
    assert_eq!(engine.renew(&mut claim, at(T0)), at(u64::MAX));

    // A claim made at time 0 cannot be due before time 0.
    let engine = Engine::new(EngineConfig::default().with_lease(Duration::from_secs(3)));
    let claim = claim_at(&engine, 0);
    assert_eq!(engine.renewal_due(&claim), at(1_000));
}

#[test]
fn take_over_claim_renews_like_any_other() {
    let engine = reexecute_engine(); // 20 s lease
    let (_, req) = dead_lease_take_over(&engine, FencingToken::random());
    let mut claim = executed(pending(&engine).on_take_over(req, Ok(Fenced::Applied)));
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
    let Step::TryClaim(a) = first_step(
        &engine,
        &Scope::new("ns", "alice"),
        &c,
        FencingToken::random(),
        at(T0),
    ) else {
        panic!()
    };
    let Step::TryClaim(b) = first_step(
        &engine,
        &Scope::new("ns", "bob"),
        &c,
        FencingToken::random(),
        at(T0),
    ) else {
        panic!()
    };
    let Step::TryClaim(c2) = first_step(
        &engine,
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
        key: IdempotencyKey::new(KEY, EngineConfig::DEFAULT_MAX_KEY_BYTES).unwrap(),
    };
    let req = default_request(&Engine::default(), FencingToken::random());
    assert_eq!(req.id, id);
}
