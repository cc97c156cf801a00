//! Property: whatever the store answers and whatever the call, the engine fails closed and its
//! rejections use the documented error codes.

use super::*;

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
                .with_after_crash(if reexecute {
                    AfterCrash::Reexecute
                } else {
                    AfterCrash::Reject
                })
                .with_lease(lease)
                .with_retention(retention)
                .with_in_progress_retry_after(retry_after)
                .with_max_outcome_bytes(max_outcome)
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
            ..Default::default()
        };
        let req = match first_step(&engine, &scope(), &tool_call, caller, at(now)) {
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
            other => {
                prop_assert!(false, "a SEP key's first step is its claim: {other:?}");
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
        let mut step = pending(&engine).on_claim(req, outcome);
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
            prop_assert_eq!(config.after_crash(), AfterCrash::Reexecute);
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
            step = pending(&engine).on_take_over(to, answer);
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
                    at(now).saturating_add(config.lease())
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
