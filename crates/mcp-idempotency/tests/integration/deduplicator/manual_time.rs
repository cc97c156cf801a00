//! The claim path's time and randomness are the deduplicator's: every wait of a claim (the
//! renewals of its lease, a duplicate waiting for its outcome, a completion and a release sent
//! again) is a sleep on the deduplicator's clock, and its fencing tokens come from the
//! deduplicator's `FencingTokens`. On a `ManualClock` and a runtime without tokio's timer, the
//! tests below drive each wait by moving the clock: nothing sleeps, and a task that slept on
//! tokio's timer would panic.

use mcp_idempotency::policy::ToolPolicies;
use mcp_idempotency::{FencingTokens, KeySource, KeyTerms};

use super::failing_store::FlakyStore;
use super::running_claim::{begin, lease_in};
use super::*;

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// `TOOL` keyed by its `idempotency_key` argument, whose duplicates wait `wait` for a running
/// call's outcome.
fn waiting_policies(wait: &str) -> Arc<ToolPolicies> {
    let policies = ToolPolicies::from_json(
        &json!({ TOOL: {"key-argument": "idempotency_key", "wait": wait} }),
    )
    .expect("valid policies");
    Arc::new(policies)
}

/// A call of `TOOL` keyed by its argument `k-1`, under `policies`, as the interceptor makes it.
async fn decide_keyed(d: &Deduplicator, policies: &ToolPolicies) -> Decision {
    let key = json!("k-1");
    let terms = KeyTerms::new(KeySource::Argument, policies.for_tool(TOOL));
    let call = ToolCall {
        tool_name: TOOL,
        arguments: Some(ARGS),
        idempotency_key: Some(&key),
        terms: &terms,
        ..Default::default()
    };
    d.decide(&scope(), &call).await
}

/// A lease of 3 s is renewed by the deduplicator's renewing task, which wakes every half second
/// on the clock and renews once a second has passed since the last renewal: only when the clock
/// moves.
#[test]
fn a_short_lease_is_renewed_as_the_manual_clock_moves() {
    on_manual_time(async {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let lease = Duration::from_secs(3);
        let d = dedup(&store, EngineConfig::default().with_lease(lease)).with_clock(clock.clone());
        let start = clock.now();
        let running = begin(&d, "k").await;

        // However long the tasks run, no time passes: the lease stays as claimed.
        idle().await;
        assert_eq!(clock.sleepers(), 1, "the renewing task sleeps on the clock");
        assert_eq!(
            lease_in(record(&store, &scope(), "k").await),
            start.saturating_add(lease)
        );

        // Half a second at a time: renewed at 1 s, 2 s, 3 s, each time to 3 s later.
        for step in 1..=6u64 {
            pass(&clock, ms(500)).await;
            let renewed_at = Duration::from_secs(step / 2);
            assert_eq!(
                lease_in(record(&store, &scope(), "k").await),
                start.saturating_add(renewed_at + lease),
                "after {} ms",
                step * 500
            );
        }
        // Past the first lease, nobody may take the record over: it is still ours.
        assert_eq!(
            running
                .finish(Outcome::Success(RESULT.into()))
                .await
                .unwrap(),
            Fenced::Applied
        );
        assert_eq!(
            replay(decide(&d, &scope(), TOOL, ARGS, "k").await),
            Replay::Result(RESULT.into())
        );
    });
}

/// A duplicate of a running call waits for its outcome (the policy's `wait`) by pauses on the
/// clock: the outcome recorded meanwhile reaches it when its pause ends on the clock, not before.
#[test]
fn a_waiting_duplicate_gets_the_outcome_when_the_manual_clock_moves() {
    on_manual_time(async {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let d = dedup(&store, EngineConfig::default()).with_clock(clock.clone());
        let policies = waiting_policies("10s");
        let first = execute(decide_keyed(&d, &policies).await);

        let duplicate = tokio::spawn({
            let (d, policies) = (d.clone(), Arc::clone(&policies));
            async move { decide_keyed(&d, &policies).await }
        });
        settle("the duplicate pauses", async || clock.sleepers() == 1).await;
        d.complete(&first, Outcome::Success(RESULT.into()))
            .await
            .unwrap();
        idle().await;
        assert!(
            !duplicate.is_finished(),
            "it looks again only when its pause ends"
        );

        clock.advance(ms(49));
        idle().await;
        assert!(!duplicate.is_finished(), "its first pause is 50 ms");
        clock.advance(ms(1));
        settle("the duplicate looks again", async || {
            duplicate.is_finished()
        })
        .await;
        match duplicate.await.expect("the duplicate's task") {
            Decision::Replay(_) => {}
            other => panic!("expected the outcome replayed, got {other:?}"),
        }
    });
}

/// A duplicate whose call never ends looks again after 50, 100, 200 and 400 ms on the clock, and
/// gives up when the next pause (500 ms) would take it past its wait (1 s), at 750 ms.
#[test]
fn a_waiting_duplicate_gives_up_after_its_wait_on_the_manual_clock() {
    on_manual_time(async {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let d = dedup(&store, EngineConfig::default()).with_clock(clock.clone());
        let policies = waiting_policies("1s");
        let _first = execute(decide_keyed(&d, &policies).await);

        let duplicate = tokio::spawn({
            let (d, policies) = (d.clone(), Arc::clone(&policies));
            async move { decide_keyed(&d, &policies).await }
        });
        for pause in [50, 100, 200, 400] {
            settle("the duplicate pauses", async || clock.sleepers() == 1).await;
            clock.advance(ms(pause - 1));
            idle().await;
            assert!(!duplicate.is_finished(), "a pause of {pause} ms");
            clock.advance(ms(1));
            idle().await;
        }
        settle("the duplicate gives up", async || duplicate.is_finished()).await;
        reject(
            duplicate.await.expect("the duplicate's task"),
            RejectionKind::KeyInProgress,
        );
    });
}

/// A completion the store failed is sent again 100, 200, 400, 800 ms... after each failure on
/// the clock, never in between, until the store takes it.
#[test]
fn a_failed_completion_is_sent_again_on_the_manual_clocks_backoff() {
    on_manual_time(async {
        let (flaky, clock, d) = with_a_failed_completion("k").await;
        let sent = || flaky.completions_sent.load(Ordering::SeqCst);
        assert_eq!(sent(), 1);

        for (n, backoff) in [100, 200, 400, 800, 1_600].into_iter().enumerate() {
            pass(&clock, ms(backoff - 1)).await;
            assert_eq!(sent(), n + 1, "not sent again before {backoff} ms");
            pass(&clock, ms(1)).await;
            assert_eq!(sent(), n + 2, "sent again after {backoff} ms");
        }

        // The store takes completions again: the next attempt, 3.2 s later, records the outcome.
        flaky.fail_complete.store(false, Ordering::SeqCst);
        pass(&clock, ms(3_199)).await;
        assert_eq!(d.pending_completions(), 1);
        pass(&clock, ms(1)).await;
        settle("the outcome is recorded", async || {
            d.pending_completions() == 0
        })
        .await;
        assert_eq!(sent(), 7);
        assert_eq!(
            replay(decide(&d, &scope(), TOOL, ARGS, "k").await),
            Replay::Result(RESULT.into())
        );
    });
}

/// A claim whose answer was lost is released in the background 100 ms later on the clock, and
/// while the store fails releases, again 100, 200, 400, 800 ms... after each failure.
#[test]
fn a_lost_claim_is_released_on_the_manual_clocks_backoff() {
    on_manual_time(async {
        let flaky = Arc::new(FlakyStore::default());
        let store: Arc<dyn Store> = flaky.clone();
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let d = dedup(&store, EngineConfig::default()).with_clock(clock.clone());
        flaky.fail_release.store(true, Ordering::SeqCst);
        flaky.lose_claim_answer.store(true, Ordering::SeqCst);
        reject(
            decide(&d, &scope(), TOOL, ARGS, "k").await,
            RejectionKind::StoreUnavailable,
        );
        assert_eq!(d.pending_releases(), 1);
        let sent = || flaky.releases_sent.load(Ordering::SeqCst);

        for (n, backoff) in [100, 100, 200, 400, 800].into_iter().enumerate() {
            pass(&clock, ms(backoff - 1)).await;
            assert_eq!(sent(), n, "no release before {backoff} ms");
            pass(&clock, ms(1)).await;
            assert_eq!(sent(), n + 1, "a release after {backoff} ms");
        }

        // The store takes releases again: the next attempt, 1.6 s later, frees the key.
        flaky.fail_release.store(false, Ordering::SeqCst);
        pass(&clock, ms(1_600)).await;
        settle("the lost claim is released", async || {
            d.pending_releases() == 0
        })
        .await;
        assert_eq!(sent(), 6);
        assert!(record(&store, &scope(), "k").await.is_none());
        execute(decide(&d, &scope(), TOOL, ARGS, "k").await);
    });
}

/// Two deduplicators whose tokens come from one seed give their claims the same tokens, in the
/// same order; another seed, or the default (random), others.
#[test]
fn two_deduplicators_with_one_seed_make_the_same_tokens() {
    on_manual_time(async {
        async fn owners(tokens: Option<FencingTokens>) -> Vec<FencingToken> {
            let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
            let mut d = dedup(&store, EngineConfig::default());
            if let Some(tokens) = tokens {
                d = d.with_tokens(tokens);
            }
            let mut owners = Vec::new();
            for key in ["k-1", "k-2", "k-3"] {
                let owner = execute(decide(&d, &scope(), TOOL, ARGS, key).await).owner();
                let stored = record(&store, &scope(), key).await.map(|r| r.state);
                assert!(
                    matches!(stored, Some(RecordState::InProgress { owner: o, .. }) if o == owner),
                    "{stored:?}"
                );
                owners.push(owner);
            }
            owners
        }

        let seeded = owners(Some(FencingTokens::seeded(7))).await;
        assert_eq!(seeded, owners(Some(FencingTokens::seeded(7))).await);
        assert_ne!(seeded, owners(Some(FencingTokens::seeded(8))).await);
        assert_ne!(owners(None).await, owners(None).await);
    });
}
