//! End-to-end tests of the async [`Deduplicator`] over real stores (memory and SQLite): every
//! scenario runs on both.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, MemoryStore, Store,
    StoreError, StoreFuture, StoreStats, TakeOverRequest,
};
use mcp_idempotency::{
    AfterCrash, BypassReason, Claim, Clock, Decision, Deduplicator, EngineConfig, FencingToken,
    ManualClock, Outcome, Record, RecordId, RecordState, Rejection, RejectionKind, Replay, Scope,
    Step, Timestamp, ToolCall,
};
use serde_json::{json, Value};

const TOOL: &str = "charge_payment";
const ARGS: &str = r#"{"amount": 4200, "currency": "usd"}"#;
const OTHER_ARGS: &str = r#"{"amount": 9999, "currency": "usd"}"#;
const RESULT: &str = "{ \"content\": [{\"type\": \"text\", \"text\": \"charged \\u20ac42\"}],\n \"isError\": false }";
const ERROR: &str = r#"{"code":-32000,"message":"card declined","data":{"retry":false}}"#;
/// A lease the tests let run out by moving a [`ManualClock`], never by sleeping.
const SHORT_LEASE: Duration = Duration::from_millis(50);
/// Past `SHORT_LEASE`.
const PAST_SHORT_LEASE: Duration = Duration::from_millis(150);
const RACERS: usize = 64;

fn scope() -> Scope {
    Scope::new("payments-server", "alice")
}

fn dedup(store: &Arc<dyn Store>, config: EngineConfig) -> Deduplicator {
    Deduplicator::new(config, Arc::clone(store))
}

async fn decide(d: &Deduplicator, scope: &Scope, tool: &str, args: &str, key: &str) -> Decision {
    let key = json!(key);
    let call = ToolCall {
        tool_name: tool,
        arguments: Some(args),
        idempotency_key: Some(&key),
        mrtr_continuation: false,
    };
    d.decide(scope, &call).await
}

fn execute(decision: Decision) -> Claim {
    match decision {
        Decision::Execute(claim) => claim,
        other => panic!("expected Execute, got {other:?}"),
    }
}

fn reject(decision: Decision, kind: RejectionKind) -> Rejection {
    match decision {
        Decision::Reject(rejection) if rejection.kind() == kind => rejection,
        other => panic!("expected a {kind:?} rejection, got {other:?}"),
    }
}

fn replay(decision: Decision) -> Replay {
    match decision {
        Decision::Replay(replay) => replay,
        other => panic!("expected Replay, got {other:?}"),
    }
}

async fn stats(store: &Arc<dyn Store>) -> StoreStats {
    store.stats(Timestamp::now()).await.expect("stats")
}

async fn record(store: &Arc<dyn Store>, scope: &Scope, key: &str) -> Option<Record> {
    let id = RecordId {
        scope: scope.clone(),
        key: mcp_idempotency::IdempotencyKey::new(key, 255).unwrap(),
    };
    store.get(&id, Timestamp::now()).await.expect("get")
}

/// Claims `key` directly in the store as an owner whose lease ran out a while ago, as if its
/// process had died mid-call. Returns the dead owner's token.
async fn claim_dead(store: &Arc<dyn Store>, scope: &Scope, key: &str) -> FencingToken {
    let engine =
        mcp_idempotency::Engine::new(EngineConfig::default().lease(Duration::from_secs(1)));
    let key = json!(key);
    let call = ToolCall {
        tool_name: TOOL,
        arguments: Some(ARGS),
        idempotency_key: Some(&key),
        mrtr_continuation: false,
    };
    let ten_seconds_ago = Timestamp::from_millis(Timestamp::now().as_millis() - 10_000);
    let owner = FencingToken::random();
    let Step::TryClaim(req) = engine.begin(scope, &call, owner, ten_seconds_ago) else {
        panic!("valid call")
    };
    assert!(req.lease_expires_at < Timestamp::now());
    assert_eq!(
        store.claim(&req).await.expect("claim"),
        ClaimOutcome::Claimed
    );
    owner
}

/// Runs `n` concurrent `decide`s of the same call, released together by a barrier.
async fn race(
    d: &Deduplicator,
    scope: &Scope,
    args: &'static str,
    key: &str,
    n: usize,
) -> Vec<Decision> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (d, scope, barrier, key) =
                (d.clone(), scope.clone(), barrier.clone(), key.to_owned());
            tokio::spawn(async move {
                barrier.wait().await;
                decide(&d, &scope, TOOL, args, &key).await
            })
        })
        .collect();
    let mut decisions = Vec::with_capacity(n);
    for task in tasks {
        decisions.push(task.await.expect("racer panicked"));
    }
    decisions
}

/// Runs `fut` with a deadline: a duplicate must be answered at once, never block.
async fn promptly<T>(fut: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .expect("the deduplicator blocked");
    assert!(started.elapsed() < Duration::from_secs(1));
    out
}

// ---------------------------------------------------------------------------------------------
// Scenarios, each run on every store

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
    let config = EngineConfig::default().in_progress_retry_after(Duration::from_millis(200));
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

/// Releasing a claim whose call did not run frees the key for a retry; the released claim can no
/// longer complete, renew or release.
async fn release_lets_a_retry_execute(store: Arc<dyn Store>) {
    let d = dedup(&store, EngineConfig::default());
    let mut first = execute(decide(&d, &scope(), TOOL, ARGS, "order-5").await);
    assert_eq!(d.release(&first).await.unwrap(), Fenced::Applied);
    assert!(record(&store, &scope(), "order-5").await.is_none());
    assert_eq!(d.release(&first).await.unwrap(), Fenced::NotOwner);

    let second = execute(decide(&d, &scope(), TOOL, ARGS, "order-5").await);
    assert_ne!(second.owner(), first.owner());
    assert_eq!(
        d.complete(&first, Outcome::Success("stale".into()))
            .await
            .unwrap(),
        Fenced::NotOwner
    );
    let deadline = first.lease_expires_at();
    assert_eq!(d.renew(&mut first).await.unwrap(), Fenced::NotOwner);
    // A refused renewal leaves the claim's deadline as it was.
    assert_eq!(first.lease_expires_at(), deadline);
    assert_eq!(d.release(&first).await.unwrap(), Fenced::NotOwner);

    d.complete(&second, Outcome::Success(RESULT.into()))
        .await
        .unwrap();
    assert_eq!(
        replay(decide(&d, &scope(), TOOL, ARGS, "order-5").await),
        Replay::Result(RESULT.into())
    );
    // A completed record cannot be released.
    assert_eq!(d.release(&second).await.unwrap(), Fenced::NotOwner);

    // Released keys do not count against the quota.
    let stats = stats(&store).await;
    assert_eq!((stats.in_progress, stats.completed), (0, 1));
}

/// `reject` (the default): once the owner's lease ran out, retries get `outcome_unknown` and the
/// tool never runs again; if the owner turns out to be alive and records its outcome before anyone
/// took over, retries replay it.
async fn after_crash_reject(store: Arc<dyn Store>) {
    let clock = Arc::new(ManualClock::new(Timestamp::now()));
    let d = dedup(&store, EngineConfig::default().lease(SHORT_LEASE)).with_clock(clock.clone());
    assert_eq!(d.engine().config().after_crash_policy(), AfterCrash::Reject);
    let claim = execute(decide(&d, &scope(), TOOL, ARGS, "order-6").await);
    reject(
        decide(&d, &scope(), TOOL, ARGS, "order-6").await,
        RejectionKind::KeyInProgress,
    );
    clock.advance(PAST_SHORT_LEASE);
    for _ in 0..2 {
        let rejection = reject(
            decide(&d, &scope(), TOOL, ARGS, "order-6").await,
            RejectionKind::OutcomeUnknown,
        );
        assert_eq!(rejection.to_error_object()["code"], -32603);
    }
    // Other arguments still conflict rather than learn anything.
    reject(
        decide(&d, &scope(), TOOL, OTHER_ARGS, "order-6").await,
        RejectionKind::KeyConflict,
    );
    // Nobody took over, so the slow owner's outcome is still accepted.
    assert_eq!(
        d.complete(&claim, Outcome::Success(RESULT.into()))
            .await
            .unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        replay(decide(&d, &scope(), TOOL, ARGS, "order-6").await),
        Replay::Result(RESULT.into())
    );
}

/// `reexecute`: once the owner's lease ran out, one retry takes the record over and runs the tool;
/// the old owner is fenced off and its late outcome is never recorded.
async fn after_crash_reexecute(store: Arc<dyn Store>) {
    let config = EngineConfig::default()
        .lease(SHORT_LEASE)
        .after_crash(AfterCrash::Reexecute);
    let clock = Arc::new(ManualClock::new(Timestamp::now()));
    let d = dedup(&store, config).with_clock(clock.clone());
    let mut dead = execute(decide(&d, &scope(), TOOL, ARGS, "order-7").await);
    reject(
        decide(&d, &scope(), TOOL, ARGS, "order-7").await,
        RejectionKind::KeyInProgress,
    );
    clock.advance(PAST_SHORT_LEASE);

    let new = execute(decide(&d, &scope(), TOOL, ARGS, "order-7").await);
    assert_ne!(new.owner(), dead.owner());
    assert_eq!(new.id(), dead.id());
    assert!(matches!(
        record(&store, &scope(), "order-7").await.unwrap().state,
        RecordState::InProgress { owner, .. } if owner == new.owner()
    ));
    // The new owner's lease is live: duplicates are in progress again.
    reject(
        decide(&d, &scope(), TOOL, ARGS, "order-7").await,
        RejectionKind::KeyInProgress,
    );
    // The old owner wakes up: it can neither renew, nor complete, nor release.
    assert_eq!(d.renew(&mut dead).await.unwrap(), Fenced::NotOwner);
    assert_eq!(
        d.complete(&dead, Outcome::Success("stale".into()))
            .await
            .unwrap(),
        Fenced::NotOwner
    );
    assert_eq!(d.release(&dead).await.unwrap(), Fenced::NotOwner);

    assert_eq!(
        d.complete(&new, Outcome::Success(RESULT.into()))
            .await
            .unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        replay(decide(&d, &scope(), TOOL, ARGS, "order-7").await),
        Replay::Result(RESULT.into())
    );
}

/// A renewed lease is not taken over, and renewing moves the stored deadline.
async fn renewal_keeps_the_claim_alive(store: Arc<dyn Store>) {
    let lease = Duration::from_millis(400);
    let config = EngineConfig::default()
        .lease(lease)
        .after_crash(AfterCrash::Reexecute);
    let clock = Arc::new(ManualClock::new(Timestamp::now()));
    let d = dedup(&store, config).with_clock(clock.clone());
    let mut claim = execute(decide(&d, &scope(), TOOL, ARGS, "order-8").await);
    let first_deadline = claim.lease_expires_at();
    assert_eq!(
        d.engine().renewal_due(&claim).as_millis(),
        first_deadline.as_millis() - 266
    );

    clock.advance(Duration::from_millis(250));
    assert_eq!(d.renew(&mut claim).await.unwrap(), Fenced::Applied);
    assert!(claim.lease_expires_at() >= first_deadline.saturating_add(Duration::from_millis(250)));
    assert!(matches!(
        record(&store, &scope(), "order-8").await.unwrap().state,
        RecordState::InProgress { owner, lease_expires_at }
            if owner == claim.owner() && lease_expires_at == claim.lease_expires_at()
    ));

    // Past the first deadline, but within the renewed one.
    clock.advance(Duration::from_millis(250));
    assert!(clock.now() > first_deadline);
    reject(
        decide(&d, &scope(), TOOL, ARGS, "order-8").await,
        RejectionKind::KeyInProgress,
    );
    assert_eq!(
        d.complete(&claim, Outcome::Success(RESULT.into()))
            .await
            .unwrap(),
        Fenced::Applied
    );
}

/// The same key from two principals (or two namespaces) is two records: both execute, and one's
/// outcome is never replayed to the other.
async fn scopes_are_isolated(store: Arc<dyn Store>) {
    let d = dedup(&store, EngineConfig::default());
    let alice = Scope::new("payments-server", "alice");
    let bob = Scope::new("payments-server", "bob");
    let elsewhere = Scope::new("other-server", "alice");

    let a = execute(decide(&d, &alice, TOOL, ARGS, "shared-key").await);
    // Alice's running call neither blocks nor conflicts with Bob's, even with other arguments.
    let b = execute(decide(&d, &bob, TOOL, OTHER_ARGS, "shared-key").await);
    let e = execute(decide(&d, &elsewhere, TOOL, ARGS, "shared-key").await);
    assert_ne!(a.id(), b.id());
    assert_ne!(a.id(), e.id());

    d.complete(&a, Outcome::Success(r#"{"who":"alice"}"#.into()))
        .await
        .unwrap();
    // Bob's own call is still running: he gets in-progress, not Alice's outcome.
    reject(
        decide(&d, &bob, TOOL, OTHER_ARGS, "shared-key").await,
        RejectionKind::KeyInProgress,
    );
    // With Alice's arguments, Bob's key conflicts with *his own* record, not Alice's.
    reject(
        decide(&d, &bob, TOOL, ARGS, "shared-key").await,
        RejectionKind::KeyConflict,
    );
    d.complete(&b, Outcome::Success(r#"{"who":"bob"}"#.into()))
        .await
        .unwrap();
    d.complete(&e, Outcome::Error(ERROR.into())).await.unwrap();

    assert_eq!(
        replay(decide(&d, &alice, TOOL, ARGS, "shared-key").await),
        Replay::Result(r#"{"who":"alice"}"#.into())
    );
    assert_eq!(
        replay(decide(&d, &bob, TOOL, OTHER_ARGS, "shared-key").await),
        Replay::Result(r#"{"who":"bob"}"#.into())
    );
    assert_eq!(
        replay(decide(&d, &elsewhere, TOOL, ARGS, "shared-key").await),
        Replay::Error(ERROR.into())
    );
    // A third principal starts afresh.
    execute(
        decide(
            &d,
            &Scope::new("payments-server", "carol"),
            TOOL,
            ARGS,
            "shared-key",
        )
        .await,
    );
}

/// The per-scope quota refuses new keys (not retries of existing ones), per scope.
async fn quota_per_scope(store: Arc<dyn Store>) {
    let d = dedup(&store, EngineConfig::default().max_records_per_scope(2));
    let k1 = execute(decide(&d, &scope(), TOOL, ARGS, "k1").await);
    let k2 = execute(decide(&d, &scope(), TOOL, ARGS, "k2").await);
    let rejection = reject(
        decide(&d, &scope(), TOOL, ARGS, "k3").await,
        RejectionKind::QuotaExceeded,
    );
    let error = rejection.to_error_object();
    assert_eq!(error["data"]["limit"], 2);
    assert_eq!(error["data"]["idempotencyKey"], "k3");
    assert_eq!(error["code"], -32602);
    assert!(record(&store, &scope(), "k3").await.is_none());

    // Retries of held keys are answered normally.
    reject(
        decide(&d, &scope(), TOOL, ARGS, "k1").await,
        RejectionKind::KeyInProgress,
    );
    // Completed records still count.
    d.complete(&k2, Outcome::Success(RESULT.into()))
        .await
        .unwrap();
    replay(decide(&d, &scope(), TOOL, ARGS, "k2").await);
    reject(
        decide(&d, &scope(), TOOL, ARGS, "k3").await,
        RejectionKind::QuotaExceeded,
    );
    // Another principal has its own quota.
    execute(decide(&d, &Scope::new("payments-server", "bob"), TOOL, ARGS, "k3").await);
    // Releasing frees a slot.
    d.release(&k1).await.unwrap();
    execute(decide(&d, &scope(), TOOL, ARGS, "k3").await);
}

/// The store-wide quota refuses new keys from any principal.
async fn quota_total(store: Arc<dyn Store>) {
    let d = dedup(&store, EngineConfig::default().max_records_total(3));
    for principal in ["p1", "p2", "p3"] {
        execute(decide(&d, &Scope::new("ns", principal), TOOL, ARGS, "k").await);
    }
    let rejection = reject(
        decide(&d, &Scope::new("ns", "p4"), TOOL, ARGS, "k").await,
        RejectionKind::QuotaExceeded,
    );
    assert_eq!(rejection.to_error_object()["data"]["limit"], 3);
    reject(
        decide(&d, &Scope::new("ns", "p1"), TOOL, ARGS, "other").await,
        RejectionKind::QuotaExceeded,
    );
}

/// 64 concurrent identical calls: exactly one executes, the rest are told it is in progress; after
/// completion 64 concurrent retries all replay the same bytes.
async fn racing_same_key_executes_once(store: Arc<dyn Store>) {
    let d = dedup(&store, EngineConfig::default());
    let decisions = race(&d, &scope(), ARGS, "hot-key", RACERS).await;
    let mut claims = Vec::new();
    for decision in decisions {
        match decision {
            Decision::Execute(claim) => claims.push(claim),
            other => {
                reject(other, RejectionKind::KeyInProgress);
            }
        }
    }
    assert_eq!(claims.len(), 1, "exactly one racer may execute");
    let stats = stats(&store).await;
    assert_eq!((stats.in_progress, stats.completed), (1, 0));

    d.complete(&claims[0], Outcome::Success(RESULT.into()))
        .await
        .unwrap();
    let decisions = race(&d, &scope(), ARGS, "hot-key", RACERS).await;
    assert_eq!(decisions.len(), RACERS);
    for decision in decisions {
        assert_eq!(replay(decision), Replay::Result(RESULT.into()));
    }
    // Racing with other arguments: every one conflicts, none executes.
    for decision in race(&d, &scope(), OTHER_ARGS, "hot-key", RACERS).await {
        reject(decision, RejectionKind::KeyConflict);
    }
}

/// 64 concurrent retries of a call whose owner died, under `reexecute`: exactly one takes over.
async fn racing_take_over_executes_once(store: Arc<dyn Store>) {
    let dead = claim_dead(&store, &scope(), "dead-key").await;
    let d = dedup(
        &store,
        EngineConfig::default().after_crash(AfterCrash::Reexecute),
    );
    let mut claims = Vec::new();
    for decision in race(&d, &scope(), ARGS, "dead-key", RACERS).await {
        match decision {
            Decision::Execute(claim) => claims.push(claim),
            other => {
                reject(other, RejectionKind::KeyInProgress);
            }
        }
    }
    assert_eq!(claims.len(), 1, "exactly one racer may take over");
    assert_ne!(claims[0].owner(), dead);
    assert!(matches!(
        record(&store, &scope(), "dead-key").await.unwrap().state,
        RecordState::InProgress { owner, .. } if owner == claims[0].owner()
    ));
}

/// Under `reject`, 64 concurrent retries of a dead call are all refused as unknown.
async fn racing_dead_lease_rejects_all(store: Arc<dyn Store>) {
    claim_dead(&store, &scope(), "dead-key").await;
    let d = dedup(&store, EngineConfig::default());
    for decision in race(&d, &scope(), ARGS, "dead-key", RACERS).await {
        reject(decision, RejectionKind::OutcomeUnknown);
    }
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
    let d = dedup(&store, EngineConfig::default().max_argument_bytes(64));
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
    let d = dedup(&store, EngineConfig::default().max_outcome_bytes(16));
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

/// A retention window shorter than the lease must not let a record expire while its call is
/// still running (which would let a duplicate execute).
async fn short_retention_does_not_expire_a_running_call(store: Arc<dyn Store>) {
    let config = EngineConfig::default().retention(Duration::from_millis(20));
    let clock = Arc::new(ManualClock::new(Timestamp::now()));
    let d = dedup(&store, config).with_clock(clock.clone());
    let claim = execute(decide(&d, &scope(), TOOL, ARGS, "quick").await);
    clock.advance(Duration::from_millis(60));
    reject(
        decide(&d, &scope(), TOOL, ARGS, "quick").await,
        RejectionKind::KeyInProgress,
    );
    // Once completed, the record lives for the (short) retention window, then the key is new.
    d.complete(&claim, Outcome::Success(RESULT.into()))
        .await
        .unwrap();
    clock.advance(Duration::from_millis(60));
    execute(decide(&d, &scope(), TOOL, ARGS, "quick").await);
}

macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let store: std::sync::Arc<dyn mcp_idempotency::store::Store> =
                        std::sync::Arc::new(mcp_idempotency::store::MemoryStore::new());
                    super::$name(store).await;
                }
            )*
        }

        #[cfg(feature = "sqlite")]
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let dir = tempfile::tempdir().expect("temp dir");
                    let store = mcp_idempotency::store::SqliteStore::open(
                        dir.path().join("records.sqlite3"),
                    )
                    .await
                    .expect("open SQLite store");
                    let store: std::sync::Arc<dyn mcp_idempotency::store::Store> =
                        std::sync::Arc::new(store);
                    super::$name(store).await;
                }
            )*
        }
    };
}

on_every_store!(
    execute_complete_replay,
    error_outcome_replays_as_error,
    conflict,
    in_progress_duplicate_is_answered_immediately,
    release_lets_a_retry_execute,
    after_crash_reject,
    after_crash_reexecute,
    renewal_keeps_the_claim_alive,
    scopes_are_isolated,
    quota_per_scope,
    quota_total,
    racing_same_key_executes_once,
    racing_take_over_executes_once,
    racing_dead_lease_rejects_all,
    bypass_records_nothing,
    invalid_requests_record_nothing,
    oversized_outcome_is_not_retained,
    short_retention_does_not_expire_a_running_call,
);

// ---------------------------------------------------------------------------------------------
// A store that fails on demand: the deduplicator must fail closed

/// A memory store whose claims and take-overs can be made to fail.
#[derive(Debug, Default)]
struct FlakyStore {
    inner: MemoryStore,
    fail_claim: AtomicBool,
    fail_take_over: AtomicBool,
    fail_renew: AtomicBool,
}

fn failure<'a, T: Send + 'a>(what: &str) -> StoreFuture<'a, T> {
    let err = StoreError::Unavailable {
        message: format!("{what} failed: connection refused"),
        source: None,
    };
    Box::pin(std::future::ready(Err(err)))
}

impl Store for FlakyStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        if self.fail_claim.load(Ordering::SeqCst) {
            return failure("claim");
        }
        self.inner.claim(req)
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        self.inner.complete(req)
    }

    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        if self.fail_take_over.load(Ordering::SeqCst) {
            return failure("take-over");
        }
        self.inner.take_over(req)
    }

    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease_expires_at: Timestamp,
    ) -> StoreFuture<'a, Fenced> {
        if self.fail_renew.load(Ordering::SeqCst) {
            return failure("renew");
        }
        self.inner.renew(id, owner, lease_expires_at)
    }

    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        self.inner.release(id, owner)
    }

    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>> {
        self.inner.get(id, now)
    }

    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64> {
        self.inner.purge_expired(now)
    }

    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        self.inner.stats(now)
    }

    fn list<'a>(
        &'a self,
        filter: &'a ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Record>> {
        self.inner.list(filter, now, limit)
    }

    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        self.inner.delete(id)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_claim_fails_closed() {
    let flaky = Arc::new(FlakyStore::default());
    flaky.fail_claim.store(true, Ordering::SeqCst);
    let store: Arc<dyn Store> = flaky.clone();
    let d = dedup(&store, EngineConfig::default());
    for _ in 0..3 {
        let rejection = reject(
            decide(&d, &scope(), TOOL, ARGS, "k").await,
            RejectionKind::StoreUnavailable,
        );
        let error = rejection.to_error_object();
        assert_eq!(error["code"], -32603);
        assert_eq!(error["data"]["idempotencyKey"], "k");
        assert!(error["data"]["retryAfterMs"].is_u64());
        assert!(!error.to_string().contains("connection refused"));
    }
    assert_eq!(stats(&store).await, StoreStats::default());
    // The deduplicator knows the store is unusable (the transports then withdraw the capability)...
    assert!(!d.store_usable());
    // ...until the store is back: the same key runs normally, and the store counts as usable.
    flaky.fail_claim.store(false, Ordering::SeqCst);
    execute(decide(&d, &scope(), TOOL, ARGS, "k").await);
    assert!(d.store_usable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_take_over_fails_closed() {
    let flaky = Arc::new(FlakyStore::default());
    let store: Arc<dyn Store> = flaky.clone();
    let dead = claim_dead(&store, &scope(), "k").await;
    flaky.fail_take_over.store(true, Ordering::SeqCst);
    let d = dedup(
        &store,
        EngineConfig::default().after_crash(AfterCrash::Reexecute),
    );
    reject(
        decide(&d, &scope(), TOOL, ARGS, "k").await,
        RejectionKind::StoreUnavailable,
    );
    assert!(matches!(
        record(&store, &scope(), "k").await.unwrap().state,
        RecordState::InProgress { owner, .. } if owner == dead
    ));
    flaky.fail_take_over.store(false, Ordering::SeqCst);
    let claim = execute(decide(&d, &scope(), TOOL, ARGS, "k").await);
    assert_ne!(claim.owner(), dead);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_renewal_keeps_the_stored_deadline() {
    let flaky = Arc::new(FlakyStore::default());
    let store: Arc<dyn Store> = flaky.clone();
    let clock = Arc::new(ManualClock::new(Timestamp::now()));
    let d = dedup(&store, EngineConfig::default()).with_clock(clock.clone());
    let mut claim = execute(decide(&d, &scope(), TOOL, ARGS, "k").await);
    let deadline = claim.lease_expires_at();
    clock.advance(Duration::from_millis(5));
    flaky.fail_renew.store(true, Ordering::SeqCst);
    assert!(d.renew(&mut claim).await.is_err());
    // The claim must not claim a lease the store never recorded.
    assert_eq!(claim.lease_expires_at(), deadline);
    flaky.fail_renew.store(false, Ordering::SeqCst);
    assert_eq!(d.renew(&mut claim).await.unwrap(), Fenced::Applied);
    assert!(claim.lease_expires_at() > deadline);
    assert!(matches!(
        record(&store, &scope(), "k").await.unwrap().state,
        RecordState::InProgress { lease_expires_at, .. } if lease_expires_at == claim.lease_expires_at()
    ));
}

// ---------------------------------------------------------------------------------------------
// Opening a SQLite store where it cannot live

#[cfg(feature = "sqlite")]
mod sqlite_open {
    use std::path::Path;

    use mcp_idempotency::store::{SqliteStore, StoreError};

    /// Opens `path`, expecting a clear error whose message names `named`.
    async fn open_fails(path: &Path, named: &Path) -> StoreError {
        let err = match SqliteStore::open(path).await {
            Ok(store) => panic!("opened a store at {}", store.path().display()),
            Err(err) => err,
        };
        let message = err.to_string();
        assert!(
            message.contains(&named.display().to_string()),
            "error {message:?} should name {}",
            named.display()
        );
        assert!(err.is_unavailable(), "{err:?}");
        err
    }

    #[tokio::test]
    async fn parent_is_a_regular_file() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path().join("records.sqlite3");
        open_fails(&path, file.path()).await;
        let deeper = file.path().join("a/b/records.sqlite3");
        open_fails(&deeper, deeper.parent().unwrap()).await;
    }

    #[tokio::test]
    async fn directory_cannot_be_created_under_proc() {
        let path = Path::new("/proc/mcp-idem-test-no-such-dir/records.sqlite3");
        open_fails(path, path.parent().unwrap()).await;
    }

    #[tokio::test]
    async fn file_cannot_be_created_in_a_read_only_place() {
        // /proc/self exists but nobody, not even root, can create a file in it.
        let path = Path::new("/proc/self/mcp-idem-records.sqlite3");
        open_fails(path, path).await;
    }

    #[tokio::test]
    async fn path_is_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        open_fails(dir.path(), dir.path()).await;
    }

    #[tokio::test]
    async fn file_is_not_a_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.sqlite3");
        std::fs::write(
            &path,
            b"this is not a SQLite database, just some text; ".repeat(100),
        )
        .unwrap();
        open_fails(&path, &path).await;
        // The file is left alone.
        assert!(std::fs::read(&path).unwrap().starts_with(b"this is not"));
    }

    #[test]
    fn open_blocking_outside_a_runtime_reports_the_same_errors() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path().join("records.sqlite3");
        let err = SqliteStore::open_blocking(&path).unwrap_err();
        assert!(err.to_string().contains(&file.path().display().to_string()));
    }

    #[tokio::test]
    async fn reopening_keeps_records() {
        use mcp_idempotency::{Deduplicator, EngineConfig, Outcome};
        use std::sync::Arc;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/dirs/records.sqlite3");
        let claim = {
            let store = Arc::new(SqliteStore::open(&path).await.unwrap());
            assert_eq!(store.path(), path);
            let d = Deduplicator::new(EngineConfig::default(), store);
            let claim = super::execute(
                super::decide(&d, &super::scope(), super::TOOL, super::ARGS, "k").await,
            );
            d.complete(&claim, Outcome::Success(super::RESULT.into()))
                .await
                .unwrap();
            claim
        };
        let d = Deduplicator::new(
            EngineConfig::default(),
            Arc::new(SqliteStore::open(&path).await.unwrap()),
        );
        assert_eq!(
            super::replay(super::decide(&d, &super::scope(), super::TOOL, super::ARGS, "k").await),
            super::Replay::Result(super::RESULT.into())
        );
        assert_eq!(
            d.complete(&claim, Outcome::Success("{}".into()))
                .await
                .unwrap(),
            mcp_idempotency::store::Fenced::NotOwner
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The running-claim handle: one claim lifecycle for every transport

async fn begin(d: &Deduplicator, key: &str) -> mcp_idempotency::RunningClaim {
    let key = json!(key);
    let call = ToolCall {
        tool_name: TOOL,
        arguments: Some(ARGS),
        idempotency_key: Some(&key),
        mrtr_continuation: false,
    };
    match d.begin(&scope(), &call).await {
        Decision::Execute(running) => running,
        other => panic!("expected Execute, got {other:?}"),
    }
}

fn lease_in(record: Option<Record>) -> Timestamp {
    match record.map(|record| record.state) {
        Some(RecordState::InProgress {
            lease_expires_at, ..
        }) => lease_expires_at,
        other => panic!("expected a record in progress, got {other:?}"),
    }
}

/// The handle renews the lease itself, a third into it, on the deduplicator's clock; after
/// `finish` it renews no more and the outcome replays.
#[tokio::test(start_paused = true)]
async fn a_running_claim_renews_its_own_lease_until_finished() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let clock = Arc::new(ManualClock::new(Timestamp::now()));
    let lease = Duration::from_secs(30);
    let d = dedup(&store, EngineConfig::default().lease(lease)).with_clock(clock.clone());
    let start = clock.now();
    let running = begin(&d, "k-renewed").await;
    assert_eq!(
        lease_in(record(&store, &scope(), "k-renewed").await),
        start.saturating_add(lease)
    );

    // A third of the lease later (on the clock and on tokio's paused timer) it has been renewed.
    clock.advance(Duration::from_secs(11));
    tokio::time::sleep(Duration::from_secs(11)).await;
    let renewed = lease_in(record(&store, &scope(), "k-renewed").await);
    assert_eq!(renewed, start.saturating_add(Duration::from_secs(41)));

    assert_eq!(
        running
            .finish(Outcome::Success(RESULT.into()))
            .await
            .unwrap(),
        Fenced::Applied
    );
    clock.advance(Duration::from_secs(60));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        replay(decide(&d, &scope(), TOOL, ARGS, "k-renewed").await),
        Replay::Result(RESULT.into())
    );
}

/// `release` frees the key (the call did not run); `abandon` records outcome-unknown (it may
/// have); a handle dropped without either is abandoned too, never left to its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_claim_ends_by_release_abandon_or_drop() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let d = dedup(&store, EngineConfig::default());

    begin(&d, "k-released")
        .await
        .release("the server was unreachable")
        .await;
    let again = begin(&d, "k-released").await;
    again.finish(Outcome::Success(RESULT.into())).await.unwrap();

    begin(&d, "k-abandoned")
        .await
        .abandon("the server exited")
        .await;
    reject(
        decide(&d, &scope(), TOOL, ARGS, "k-abandoned").await,
        RejectionKind::OutcomeUnknown,
    );

    drop(begin(&d, "k-dropped").await);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = record(&store, &scope(), "k-dropped").await.unwrap().state;
        if matches!(
            state,
            RecordState::Completed {
                outcome: Outcome::Unknown { .. },
                ..
            }
        ) {
            break;
        }
        assert!(Instant::now() < deadline, "still {state:?}");
        tokio::task::yield_now().await;
    }
    reject(
        decide(&d, &scope(), TOOL, ARGS, "k-dropped").await,
        RejectionKind::OutcomeUnknown,
    );
}
