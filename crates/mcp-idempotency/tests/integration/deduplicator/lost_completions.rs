//! A completion the store failed (it went away while the call ran) is sent again in the
//! background, with the lease kept alive, until the store takes it; it stops when the record was
//! taken over. On a manual clock and a runtime without a timer: nothing sleeps.

use super::failing_store::FlakyStore;
use super::running_claim::begin;
use super::*;

fn in_progress_owner(record: Option<Record>) -> FencingToken {
    match record.map(|record| record.state) {
        Some(RecordState::InProgress { owner, .. }) => owner,
        other => panic!("expected a record in progress, got {other:?}"),
    }
}

#[test]
fn a_failed_completion_is_sent_again_with_its_lease_kept_until_the_store_takes_it() {
    on_manual_time(async {
        let flaky = Arc::new(FlakyStore::default());
        let store: Arc<dyn Store> = flaky.clone();
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let lease = Duration::from_secs(3);
        let d = dedup(&store, EngineConfig::default().with_lease(lease)).with_clock(clock.clone());
        let running = begin(&d, "k").await;
        let owner = running.claim().owner();

        // The store goes away: the completion fails, and is retried in the background.
        flaky.fail_complete.store(true, Ordering::SeqCst);
        assert!(running
            .finish(Outcome::Success(RESULT.into()))
            .await
            .is_err());
        assert_eq!(d.pending_completions(), 1);

        // Ten seconds (three leases) later, the lease has been kept: nobody may take the record.
        for _ in 0..100 {
            pass(&clock, Duration::from_millis(100)).await;
        }
        assert_eq!(
            in_progress_owner(record(&store, &scope(), "k").await),
            owner
        );
        let retry = decide(&d, &scope(), TOOL, ARGS, "k").await;
        reject(retry, RejectionKind::KeyInProgress);
        assert_eq!(d.pending_completions(), 1);

        // The store takes completions again: within the backoff's cap (5 s) the outcome is recorded.
        flaky.fail_complete.store(false, Ordering::SeqCst);
        for _ in 0..50 {
            if d.pending_completions() == 0 {
                break;
            }
            pass(&clock, Duration::from_millis(100)).await;
        }
        assert_eq!(d.pending_completions(), 0);
        d.completions_settled().await;
        let replayed = replay(decide(&d, &scope(), TOOL, ARGS, "k").await);
        assert_eq!(replayed, Replay::Result(RESULT.into()));
    });
}

#[test]
fn an_answer_of_the_store_makes_a_pending_completion_due_at_once() {
    on_manual_time(async {
        let (flaky, clock, d) = with_a_failed_completion("k").await;
        // Thirty seconds of failures: the retries back off to one every 5 s.
        for _ in 0..300 {
            pass(&clock, Duration::from_millis(100)).await;
        }
        flaky.fail_complete.store(false, Ordering::SeqCst);
        // Another call's claim is answered: the pending completion is sent within 100 ms, not 5 s.
        execute(decide(&d, &scope(), TOOL, ARGS, "other").await);
        pass(&clock, Duration::from_millis(150)).await;
        assert_eq!(d.pending_completions(), 0);
        replay(decide(&d, &scope(), TOOL, ARGS, "k").await);
    });
}

#[test]
fn a_pending_completion_stops_when_the_record_was_taken_over() {
    on_manual_time(async {
        let flaky = Arc::new(FlakyStore::default());
        let store: Arc<dyn Store> = flaky.clone();
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let config = EngineConfig::default()
            .with_lease(Duration::from_secs(3))
            .with_after_crash(AfterCrash::Reexecute);
        let d = dedup(&store, config).with_clock(clock.clone());
        let running = begin(&d, "k").await;
        // Neither the completion nor the renewals get through: the lease runs out.
        flaky.fail_complete.store(true, Ordering::SeqCst);
        flaky.fail_renew.store(true, Ordering::SeqCst);
        assert!(running
            .finish(Outcome::Success(RESULT.into()))
            .await
            .is_err());
        for _ in 0..40 {
            pass(&clock, Duration::from_millis(100)).await;
        }
        // Another instance (the same store, its own deduplicator) takes the record over.
        let other = dedup(
            &store,
            EngineConfig::default().with_after_crash(AfterCrash::Reexecute),
        )
        .with_clock(clock.clone());
        let taken = execute(decide(&other, &scope(), TOOL, ARGS, "k").await);
        // The store is back: the completion is refused (fenced), and the retries stop.
        flaky.fail_complete.store(false, Ordering::SeqCst);
        flaky.fail_renew.store(false, Ordering::SeqCst);
        for _ in 0..60 {
            if d.pending_completions() == 0 {
                break;
            }
            pass(&clock, Duration::from_millis(100)).await;
        }
        assert_eq!(d.pending_completions(), 0);
        assert_eq!(
            in_progress_owner(record(&store, &scope(), "k").await),
            taken.owner()
        );
    });
}

#[test]
fn at_most_1024_completions_are_retried_at_once() {
    on_manual_time(async {
        let flaky = Arc::new(FlakyStore::default());
        let store: Arc<dyn Store> = flaky.clone();
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let config = EngineConfig::default()
            .with_max_records_per_scope(10_000)
            .with_max_records_total(10_000);
        let d = dedup(&store, config).with_clock(clock.clone());
        let mut running = Vec::new();
        for n in 0..1030 {
            running.push(begin(&d, &format!("k{n}")).await);
        }
        flaky.fail_complete.store(true, Ordering::SeqCst);
        for claim in running {
            assert!(claim.finish(Outcome::Success(RESULT.into())).await.is_err());
        }
        assert_eq!(
            d.pending_completions(),
            1024,
            "the newest are left to their leases"
        );
        flaky.fail_complete.store(false, Ordering::SeqCst);
        for _ in 0..100 {
            if d.pending_completions() == 0 {
                break;
            }
            pass(&clock, Duration::from_millis(100)).await;
        }
        assert_eq!(d.pending_completions(), 0);
        replay(decide(&d, &scope(), TOOL, ARGS, "k0").await);
        reject(
            decide(&d, &scope(), TOOL, ARGS, "k1029").await,
            RejectionKind::KeyInProgress,
        );
    });
}
