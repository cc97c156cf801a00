//! The running-claim handle: one claim lifecycle for every transport (renewing its own lease until
//! finished; ending by release, abandon or drop).

use super::*;

// ---------------------------------------------------------------------------------------------
// The running-claim handle: one claim lifecycle for every transport

pub(super) async fn begin(d: &Deduplicator, key: &str) -> mcp_idempotency::RunningClaim {
    let key = json!(key);
    let call = ToolCall {
        tool_name: TOOL,
        arguments: Some(ARGS),
        idempotency_key: Some(&key),
        mrtr_continuation: false,
        ..Default::default()
    };
    match d.begin(&scope(), &call).await {
        Decision::Execute(running) => running,
        other => panic!("expected Execute, got {other:?}"),
    }
}

pub(super) fn lease_in(record: Option<Record>) -> Timestamp {
    match record.map(|record| record.state) {
        Some(RecordState::InProgress {
            lease_expires_at, ..
        }) => lease_expires_at,
        other => panic!("expected a record in progress, got {other:?}"),
    }
}

/// The handle renews the lease itself, a third into it, on the deduplicator's clock; after
/// `finish` it renews no more and the outcome replays.
#[test]
fn a_running_claim_renews_its_own_lease_until_finished() {
    on_manual_time(async {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let lease = Duration::from_secs(30);
        let d = dedup(&store, EngineConfig::default().with_lease(lease)).with_clock(clock.clone());
        let start = clock.now();
        let running = begin(&d, "k-renewed").await;
        assert_eq!(
            lease_in(record(&store, &scope(), "k-renewed").await),
            start.saturating_add(lease)
        );

        // A third of the lease later on the clock it has been renewed.
        pass(&clock, Duration::from_secs(11)).await;
        let renewed = lease_in(record(&store, &scope(), "k-renewed").await);
        assert_eq!(renewed, start.saturating_add(Duration::from_secs(41)));

        assert_eq!(
            running
                .finish(Outcome::Success(RESULT.into()))
                .await
                .unwrap(),
            Fenced::Applied
        );
        pass(&clock, Duration::from_secs(60)).await;
        assert_eq!(
            replay(decide(&d, &scope(), TOOL, ARGS, "k-renewed").await),
            Replay::Result(RESULT.into())
        );
    });
}

/// Every running claim of a deduplicator is renewed by one task: claims add no task of their own,
/// a claim that ended is renewed no more, and the task ends once no claim is left.
#[test]
fn one_task_renews_every_running_claim_and_ends_when_none_is_left() {
    on_manual_time(async {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let lease = Duration::from_secs(30);
        let d = dedup(&store, EngineConfig::default().with_lease(lease)).with_clock(clock.clone());
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let before = tasks();
        let start = clock.now();
        let mut running = Vec::new();
        for key in ["k-one", "k-two", "k-three"] {
            running.push(begin(&d, key).await);
        }
        assert_eq!(tasks(), before + 1, "one renewing task for every claim");
        let finished = running.remove(1);
        finished
            .finish(Outcome::Success(RESULT.into()))
            .await
            .unwrap();

        pass(&clock, Duration::from_secs(11)).await;
        for key in ["k-one", "k-three"] {
            let renewed = lease_in(record(&store, &scope(), key).await);
            assert_eq!(
                renewed,
                start.saturating_add(Duration::from_secs(41)),
                "{key}"
            );
        }
        assert_eq!(
            replay(decide(&d, &scope(), TOOL, ARGS, "k-two").await),
            Replay::Result(RESULT.into()),
            "a finished claim is not renewed back into progress"
        );

        for claim in running {
            claim.finish(Outcome::Success(RESULT.into())).await.unwrap();
        }
        // At its next tick (a sixth of the lease) the task finds no claim and ends.
        pass(&clock, lease / 6 + Duration::from_secs(1)).await;
        assert_eq!(
            tasks(),
            before,
            "the renewing task ends with the last claim"
        );
        let again = begin(&d, "k-four").await;
        assert_eq!(tasks(), before + 1, "the next claim starts it again");
        again.finish(Outcome::Success(RESULT.into())).await.unwrap();
    });
}

/// A renewal the store never answers delays no other claim's lease.
#[test]
fn a_hung_renewal_delays_no_other_lease() {
    on_manual_time(async {
        let flaky = Arc::new(super::failing_store::FlakyStore::default());
        *flaky.hang_renewals_of.lock().unwrap() = Some("k-hung".into());
        let store: Arc<dyn Store> = flaky.clone();
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let lease = Duration::from_secs(30);
        let d = dedup(&store, EngineConfig::default().with_lease(lease)).with_clock(clock.clone());
        let start = clock.now();
        let hung = begin(&d, "k-hung").await;
        let fine = begin(&d, "k-fine").await;
        // Two renewals of `k-fine`, a third of the lease apart, while `k-hung`'s first never ends.
        for round in 1..=2u64 {
            pass(&clock, Duration::from_secs(11)).await;
            assert_eq!(
                lease_in(record(&store, &scope(), "k-fine").await),
                start.saturating_add(Duration::from_secs(11 * round + 30)),
                "round {round}"
            );
        }
        assert_eq!(
            lease_in(record(&store, &scope(), "k-hung").await),
            start.saturating_add(lease)
        );
        fine.finish(Outcome::Success(RESULT.into())).await.unwrap();
        hung.finish(Outcome::Success(RESULT.into())).await.unwrap();
    });
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
