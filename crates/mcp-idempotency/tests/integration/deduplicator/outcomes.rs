//! Scenarios on every store: a completed call replays its recorded bytes (result or error), the key
//! with another call conflicts, a duplicate of a running call is answered at once; calls without a
//! key, invalid requests and oversized outcomes record nothing that could run twice.

use super::*;

/// Runs `fut` with a deadline: a duplicate must be answered at once, never block.
async fn promptly<T>(fut: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .expect("the deduplicator blocked");
    assert!(started.elapsed() < Duration::from_secs(1));
    out
}

/// Execute, complete, then every retry replays the recorded bytes and nothing runs again.
async fn execute_complete_replay(store: Arc<dyn Store>) {
    let d = dedup(&store, EngineConfig::default());
    let claim = execute(decide(&d, &scope(), TOOL, ARGS, "order-1").await);
    assert_eq!(claim.id().key.as_str(), "order-1");
    assert!(claim.lease_expires_at() > Timestamp::now());
    assert_eq!(stats(&store).await.in_progress, 1);

    assert_eq!(
        d.complete(&claim, Outcome::Success(RESULT.into()))
            .await
            .unwrap(),
        Fenced::Applied
    );
    let record = record(&store, &scope(), "order-1")
        .await
        .expect("record kept");
    assert!(matches!(
        record.state,
        RecordState::Completed { outcome: Outcome::Success(ref raw), .. } if raw == RESULT
    ));

    for request_id in [json!(2), json!("retry-3"), json!(4)] {
        let replayed = replay(decide(&d, &scope(), TOOL, ARGS, "order-1").await);
        assert_eq!(replayed, Replay::Result(RESULT.into()));
        let response = replayed.to_response(&request_id);
        assert!(response.contains(RESULT), "bytes must be replayed exactly");
        let parsed: Value = serde_json::from_str(&response).unwrap();
        assert_eq!(parsed["id"], request_id);
        assert_eq!(parsed["jsonrpc"], "2.0");
    }
    // A second completion of the same claim is fenced off and changes nothing.
    assert_eq!(
        d.complete(&claim, Outcome::Success("{}".into()))
            .await
            .unwrap(),
        Fenced::NotOwner
    );
    assert_eq!(
        replay(decide(&d, &scope(), TOOL, ARGS, "order-1").await),
        Replay::Result(RESULT.into())
    );
    let stats = stats(&store).await;
    assert_eq!((stats.in_progress, stats.completed), (0, 1));
}

/// An error response is recorded and replayed as an error, not retried.
async fn error_outcome_replays_as_error(store: Arc<dyn Store>) {
    let d = dedup(&store, EngineConfig::default());
    let claim = execute(decide(&d, &scope(), TOOL, ARGS, "order-2").await);
    d.complete(&claim, Outcome::Error(ERROR.into()))
        .await
        .unwrap();
    let replayed = replay(decide(&d, &scope(), TOOL, ARGS, "order-2").await);
    assert_eq!(replayed, Replay::Error(ERROR.into()));
    let parsed: Value = serde_json::from_str(&replayed.to_response(&json!(9))).unwrap();
    assert_eq!(parsed["error"]["message"], "card declined");
    assert!(parsed.get("result").is_none());
}

/// The key reused with other arguments or another tool conflicts, in progress and completed, and
/// never sees the original outcome.
async fn conflict(store: Arc<dyn Store>) {
    let d = dedup(&store, EngineConfig::default());
    let claim = execute(decide(&d, &scope(), TOOL, ARGS, "order-3").await);
    for (tool, args) in [(TOOL, OTHER_ARGS), ("refund_payment", ARGS)] {
        let rejection = reject(
            decide(&d, &scope(), tool, args, "order-3").await,
            RejectionKind::KeyConflict,
        );
        assert_eq!(rejection.key(), Some("order-3"));
        assert_eq!(rejection.to_error_object()["code"], -32602);
    }
    d.complete(&claim, Outcome::Success(RESULT.into()))
        .await
        .unwrap();
    for (tool, args) in [(TOOL, OTHER_ARGS), ("refund_payment", ARGS)] {
        let rejection = reject(
            decide(&d, &scope(), tool, args, "order-3").await,
            RejectionKind::KeyConflict,
        );
        assert!(!rejection.to_error_object().to_string().contains("charged"));
    }
    // The conflicts changed nothing: the original still replays.
    assert_eq!(
        replay(decide(&d, &scope(), TOOL, ARGS, "order-3").await),
        Replay::Result(RESULT.into())
    );
}

/// A duplicate of a running call is refused at once with a retry hint, however often it comes.
async fn in_progress_duplicate_is_answered_immediately(store: Arc<dyn Store>) {
    let config = EngineConfig::default().with_in_progress_retry_after(Duration::from_millis(200));
    let d = dedup(&store, config);
    let claim = execute(decide(&d, &scope(), TOOL, ARGS, "order-4").await);
    for _ in 0..3 {
        let rejection = reject(
            promptly(decide(&d, &scope(), TOOL, ARGS, "order-4")).await,
            RejectionKind::KeyInProgress,
        );
        let error = rejection.to_error_object();
        assert_eq!(error["code"], -32602);
        assert_eq!(error["data"]["retryAfterMs"], 200);
        assert_eq!(error["data"]["idempotencyKey"], "order-4");
    }
    // Still owned by the original claim.
    assert!(matches!(
        record(&store, &scope(), "order-4").await.unwrap().state,
        RecordState::InProgress { owner, .. } if owner == claim.owner()
    ));
}

/// Calls without a key, and MRTR continuations, pass through and record nothing — a continuation
/// neither replays nor conflicts with the record of its key.
async fn bypass_records_nothing(store: Arc<dyn Store>) {
    let d = dedup(&store, EngineConfig::default());
    let no_key = ToolCall {
        tool_name: TOOL,
        arguments: Some(ARGS),
        idempotency_key: None,
        mrtr_continuation: false,
        ..Default::default()
    };
    for _ in 0..2 {
        assert_eq!(
            d.decide(&scope(), &no_key).await,
            Decision::Bypass(BypassReason::NoKey)
        );
    }
    assert_eq!(stats(&store).await, StoreStats::default());

    let claim = execute(decide(&d, &scope(), TOOL, ARGS, "mrtr").await);
    d.complete(&claim, Outcome::Success(RESULT.into()))
        .await
        .unwrap();
    let key = json!("mrtr");
    for args in [ARGS, OTHER_ARGS] {
        let continuation = ToolCall {
            tool_name: TOOL,
            arguments: Some(args),
            idempotency_key: Some(&key),
            mrtr_continuation: true,
            ..Default::default()
        };
        assert_eq!(
            d.decide(&scope(), &continuation).await,
            Decision::Bypass(BypassReason::MrtrContinuation)
        );
    }
    let stats = stats(&store).await;
    assert_eq!((stats.in_progress, stats.completed), (0, 1));
}

/// Invalid keys and arguments are refused before the store is touched.
async fn invalid_requests_record_nothing(store: Arc<dyn Store>) {
    let d = dedup(&store, EngineConfig::default().with_max_argument_bytes(64));
    for key in [
        json!(42),
        json!(""),
        json!(null),
        json!("a\nb"),
        json!("k".repeat(256)),
    ] {
        let call = ToolCall {
            tool_name: TOOL,
            arguments: Some(ARGS),
            idempotency_key: Some(&key),
            mrtr_continuation: false,
            ..Default::default()
        };
        reject(d.decide(&scope(), &call).await, RejectionKind::KeyInvalid);
    }
    reject(
        decide(&d, &scope(), TOOL, "{broken", "k").await,
        RejectionKind::ArgumentsInvalid,
    );
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(64));
    reject(
        decide(&d, &scope(), TOOL, &big, "k").await,
        RejectionKind::ArgumentsTooLarge,
    );
    assert_eq!(stats(&store).await, StoreStats::default());
}

/// An outcome over the size limit is recorded as not retained: retries are refused, never rerun.
async fn oversized_outcome_is_not_retained(store: Arc<dyn Store>) {
    let d = dedup(&store, EngineConfig::default().with_max_outcome_bytes(16));
    let claim = execute(decide(&d, &scope(), TOOL, ARGS, "big").await);
    let big = r#"{"content":[{"type":"text","text":"far too long"}]}"#;
    assert_eq!(
        d.complete(&claim, Outcome::Success(big.into()))
            .await
            .unwrap(),
        Fenced::Applied
    );
    for _ in 0..2 {
        let rejection = reject(
            decide(&d, &scope(), TOOL, ARGS, "big").await,
            RejectionKind::OutcomeNotRetained,
        );
        assert_eq!(rejection.to_error_object()["code"], -32603);
    }
    assert!(matches!(
        record(&store, &scope(), "big").await.unwrap().state,
        RecordState::Completed { outcome: Outcome::NotRetained { size }, .. } if size == big.len() as u64
    ));
}

on_every_store!(
    execute_complete_replay,
    error_outcome_replays_as_error,
    conflict,
    in_progress_duplicate_is_answered_immediately,
    bypass_records_nothing,
    invalid_requests_record_nothing,
    oversized_outcome_is_not_retained,
);
