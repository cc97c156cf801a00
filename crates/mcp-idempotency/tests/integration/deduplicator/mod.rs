//! End-to-end tests of the async [`Deduplicator`] over real stores (memory and SQLite): every
//! scenario runs on both.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
        ..Default::default()
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
        mcp_idempotency::Engine::new(EngineConfig::default().with_lease(Duration::from_secs(1)));
    let key = json!(key);
    let call = ToolCall {
        tool_name: TOOL,
        arguments: Some(ARGS),
        idempotency_key: Some(&key),
        mrtr_continuation: false,
        ..Default::default()
    };
    let ten_seconds_ago = Timestamp::from_millis(Timestamp::now().as_millis() - 10_000);
    let owner = FencingToken::random();
    let (_, Step::TryClaim(req)) = engine.begin(scope, call, owner, ten_seconds_ago) else {
        panic!("valid call")
    };
    assert!(req.lease_expires_at < Timestamp::now());
    assert_eq!(
        store.claim(&req).await.expect("claim"),
        ClaimOutcome::Claimed
    );
    owner
}

// ---------------------------------------------------------------------------------------------
// Time that passes only when a test moves a `ManualClock`

/// Runs `test` on a current-thread runtime without tokio's timer: a wait of the claim path that
/// slept on tokio's timer instead of the deduplicator's clock would panic. Time passes only when
/// the test moves its [`ManualClock`], and tasks run only when it yields.
fn on_manual_time<F: Future>(test: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(test)
}

/// Rounds of [`settle`] before it gives up: far more than any scenario needs.
const ROUNDS: usize = 1_000;

/// Lets the runtime's other tasks run, a round at a time (a `yield_now`), until `done` holds;
/// no time passes on a manual clock meanwhile. Panics after [`ROUNDS`] rounds.
async fn settle(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..ROUNDS {
        if done().await {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never happened: {what}");
}

/// Lets the runtime's other tasks run as far as they can without time passing ([`ROUNDS`]
/// rounds), for a test that checks that nothing happens until the clock moves.
async fn idle() {
    for _ in 0..ROUNDS {
        tokio::task::yield_now().await;
    }
}

/// Moves `clock` by `by` once a task sleeps on it (waits that started before the move end by
/// it), then lets the tasks that woke run.
async fn pass(clock: &ManualClock, by: Duration) {
    settle("a task sleeps on the clock", async || clock.sleepers() > 0).await;
    clock.advance(by);
    idle().await;
}

// ---------------------------------------------------------------------------------------------
// Scenarios, each run on every store

/// `on_every_store!(scenario, …)`, in a submodule that defines each `async fn scenario(store)`,
/// makes one test per scenario and store: `<submodule>::memory::scenario` and
/// `<submodule>::sqlite::scenario`.
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

pub(crate) mod failing_store;
/// A deduplicator on a [`FlakyStore`](failing_store::FlakyStore) and a manual clock, whose claim
/// of `key` has just had its completion refused by the store: it is being sent again in the
/// background.
async fn with_a_failed_completion(
    key: &str,
) -> (
    Arc<failing_store::FlakyStore>,
    Arc<ManualClock>,
    Deduplicator,
) {
    let flaky = Arc::new(failing_store::FlakyStore::default());
    let store: Arc<dyn Store> = flaky.clone();
    let clock = Arc::new(ManualClock::new(Timestamp::now()));
    let d = dedup(&store, EngineConfig::default()).with_clock(clock.clone());
    let running = running_claim::begin(&d, key).await;
    flaky.fail_complete.store(true, Ordering::SeqCst);
    assert!(running
        .finish(Outcome::Success(RESULT.into()))
        .await
        .is_err());
    (flaky, clock, d)
}

mod found_by_simulation;
mod leases;
mod lost_completions;
mod manual_time;
mod outcomes;
mod races;
mod running_claim;
mod scopes;
#[cfg(feature = "sqlite")]
mod sqlite_open;
