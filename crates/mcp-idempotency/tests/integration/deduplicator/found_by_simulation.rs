//! What the deterministic simulator (`crates/simulator`, issue 40) found, each replayed here as
//! an explicit fault schedule: a seed's history changes with any change to the code, this does
//! not.

use mcp_idempotency::{KeySource, KeyTerms};

use super::failing_store::FlakyStore;
use super::*;

/// Found by the simulator (seed 623 of its first version, `after-crash = reexecute`): a call
/// decided by its business identifier and carrying the client's own key ran; its outcome was
/// recorded under the identifier, and the client's key was claimed to record it beside, but that
/// completion's request was lost. The claim of the client's key stayed in progress. Once its
/// lease ran out, a retry with the client's key read that record first and took it over: the
/// call ran a second time although its outcome was recorded (with `reject`, the retry got
/// `idempotency_outcome_unknown` for a call whose outcome is known).
///
/// The completion beside is now sent again like any completion, until the store takes it.
#[test]
fn a_client_key_whose_record_beside_failed_is_completed_later_not_run_again() {
    on_manual_time(async {
        let flaky = Arc::new(FlakyStore::default());
        *flaky.fail_completions_of.lock().unwrap() = Some("k-1".into());
        let store: Arc<dyn Store> = flaky.clone();
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let config = EngineConfig::default().with_after_crash(AfterCrash::Reexecute);
        let first = dedup(&store, config.clone()).with_clock(clock.clone());
        let terms =
            KeyTerms::new(KeySource::KeyFrom, None).with_client_key(KeySource::Sep, json!("k-1"));
        let digest = json!("order-o-1");
        let call = ToolCall {
            tool_name: TOOL,
            arguments: Some(ARGS),
            idempotency_key: Some(&digest),
            terms: &terms,
            ..Default::default()
        };
        let Decision::Execute(running) = first.begin(&scope(), &call).await else {
            panic!("the first call runs");
        };
        let applied = running.finish(Outcome::Success(RESULT.into())).await;
        assert_eq!(applied.unwrap(), Fenced::Applied, "the identifier's record");
        let beside = record(&store, &scope(), "k-1")
            .await
            .expect("the key was claimed");
        assert!(matches!(beside.state, RecordState::InProgress { .. }));

        // The store takes completions again; the one beside is sent again as the clock moves.
        *flaky.fail_completions_of.lock().unwrap() = None;
        pass(&clock, Duration::from_secs(1)).await;
        settle("the completion beside is taken", async || {
            let beside = record(&store, &scope(), "k-1").await;
            matches!(beside.map(|r| r.state), Some(RecordState::Completed { .. }))
        })
        .await;

        // Past the lease, another instance gets the retry with the client's key: a replay.
        clock.advance(EngineConfig::DEFAULT_LEASE * 2);
        let other = dedup(&store, config).with_clock(clock.clone());
        match other.decide(&scope(), &call).await {
            Decision::Replay(Replay::Result(raw)) => assert_eq!(raw, RESULT),
            decision => panic!("the call ran again or was refused: {decision:?}"),
        }
    });
}

/// Found by the simulator (seed 2699 of its first version, `after-crash = reexecute`): the call
/// ran and its outcome was recorded under the business identifier; the claim of the client's
/// key beside it was applied but its answer lost, and the gateway died before releasing it. Once
/// that claim's lease ran out, a retry with the client's key read its record first and took it
/// over: the call ran again although the identifier's record held its outcome.
///
/// A claim of the client's key whose owner stopped now sends the engine to the identifier's
/// record first: an outcome there answers the call.
#[test]
fn a_stale_claim_of_the_client_key_does_not_hide_the_identifiers_outcome() {
    on_manual_time(async {
        let flaky = Arc::new(FlakyStore::default());
        let store: Arc<dyn Store> = flaky.clone();
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let config = EngineConfig::default().with_after_crash(AfterCrash::Reexecute);
        let first = dedup(&store, config.clone()).with_clock(clock.clone());
        let terms =
            KeyTerms::new(KeySource::KeyFrom, None).with_client_key(KeySource::Sep, json!("k-1"));
        let digest = json!("order-o-1");
        let call = ToolCall {
            tool_name: TOOL,
            arguments: Some(ARGS),
            idempotency_key: Some(&digest),
            terms: &terms,
            ..Default::default()
        };
        let Decision::Execute(running) = first.begin(&scope(), &call).await else {
            panic!("the first call runs");
        };
        // The claim beside is applied and its answer lost; its release never reaches the store
        // (the gateway dies).
        flaky.lose_claim_answer.store(true, Ordering::SeqCst);
        flaky.fail_release.store(true, Ordering::SeqCst);
        let applied = running.finish(Outcome::Success(RESULT.into())).await;
        assert_eq!(applied.unwrap(), Fenced::Applied, "the identifier's record");
        let beside = record(&store, &scope(), "k-1")
            .await
            .expect("the key was claimed");
        assert!(matches!(beside.state, RecordState::InProgress { .. }));
        drop(first);

        // Past the lease, another instance gets the retry with the client's key: a replay of the
        // identifier's outcome, marked as the identifier's.
        clock.advance(EngineConfig::DEFAULT_LEASE * 2);
        let other = dedup(&store, config).with_clock(clock.clone());
        match other.decide(&scope(), &call).await {
            Decision::Replay(Replay::Result(raw)) => {
                let replayed: Value = serde_json::from_str(&raw).unwrap();
                assert_eq!(replayed["content"][0]["text"], "charged \u{20ac}42");
            }
            decision => panic!("the call ran again or was refused: {decision:?}"),
        }
    });
}

/// A store handle that a test cuts, as the simulator cuts a killed gateway's: from then on its
/// operations never complete, so nothing the dead gateway left running writes on its behalf.
#[derive(Debug)]
struct Cuttable {
    inner: Arc<dyn Store>,
    cut: AtomicBool,
}

impl Cuttable {
    fn pass<'a, T: Send + 'a>(&'a self, op: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
        if self.cut.load(Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        op
    }
}

impl Store for Cuttable {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        self.pass(self.inner.claim(req))
    }
    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        self.pass(self.inner.complete(req))
    }
    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        self.pass(self.inner.take_over(req))
    }
    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease: Timestamp,
    ) -> StoreFuture<'a, Fenced> {
        self.pass(self.inner.renew(id, owner, lease))
    }
    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        self.pass(self.inner.release(id, owner))
    }
    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>> {
        self.pass(self.inner.get(id, now))
    }
    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64> {
        self.pass(self.inner.purge_expired(now))
    }
    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        self.pass(self.inner.stats(now))
    }
    fn list<'a>(
        &'a self,
        filter: &'a ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Record>> {
        self.pass(self.inner.list(filter, now, limit))
    }
    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        self.pass(self.inner.delete(id))
    }
}

/// Found by the simulator (seed 73775 of its second version, `after-crash = reexecute`): the
/// call ran, and neither its outcome under the business identifier nor the record of the client's
/// key beside it reached the store before its gateway died: both stayed in progress. A retry with
/// the client's key took the client's key's record over and ran the call (as `reexecute` allows:
/// its owner died before recording), but left the identifier's record in progress; the model's
/// next call, with a fresh key, took that one over and ran the call a third time.
///
/// The identifier's record, when there is one, now decides such a retry: it is the one taken
/// over, and the next call by the identifier replays its outcome.
#[test]
fn a_call_taken_over_through_the_client_key_takes_the_identifier_over() {
    on_manual_time(async {
        let flaky = Arc::new(FlakyStore::default());
        let store: Arc<dyn Store> = flaky.clone();
        let dying = Arc::new(Cuttable {
            inner: Arc::clone(&store),
            cut: AtomicBool::new(false),
        });
        let clock = Arc::new(ManualClock::new(Timestamp::now()));
        let config = EngineConfig::default().with_after_crash(AfterCrash::Reexecute);
        let first =
            dedup(&(dying.clone() as Arc<dyn Store>), config.clone()).with_clock(clock.clone());
        let digest = json!("order-o-1");
        let call_with = |terms| ToolCall {
            tool_name: TOOL,
            arguments: Some(ARGS),
            idempotency_key: Some(&digest),
            terms,
            ..Default::default()
        };
        let own_key = |key: &str| {
            KeyTerms::new(KeySource::KeyFrom, None).with_client_key(KeySource::Sep, json!(key))
        };
        let with_k1 = own_key("k-1");
        let Decision::Execute(running) = first.begin(&scope(), &call_with(&with_k1)).await else {
            panic!("the first call runs");
        };
        // Neither completion reaches the store; then the gateway dies.
        flaky.fail_complete.store(true, Ordering::SeqCst);
        let _ = running.finish(Outcome::Success(RESULT.into())).await;
        dying.cut.store(true, Ordering::SeqCst);
        flaky.fail_complete.store(false, Ordering::SeqCst);
        let beside = record(&store, &scope(), "k-1")
            .await
            .expect("the key was claimed");
        assert!(matches!(beside.state, RecordState::InProgress { .. }));

        // Past the lease, the retry with the client's key runs the call again, under the
        // identifier's record.
        clock.advance(EngineConfig::DEFAULT_LEASE * 2);
        let other = dedup(&store, config).with_clock(clock.clone());
        let Decision::Execute(again) = other.begin(&scope(), &call_with(&with_k1)).await else {
            panic!("the retry runs the call again: its owner died before recording");
        };
        assert_ne!(
            again.claim().id().key.as_str(),
            "k-1",
            "the identifier's record"
        );
        let applied = again.finish(Outcome::Success(RESULT.into())).await;
        assert_eq!(applied.unwrap(), Fenced::Applied);

        // The model's next call, with a fresh key: the identifier's outcome, not a third run.
        let with_k2 = own_key("k-2");
        match other.decide(&scope(), &call_with(&with_k2)).await {
            Decision::Replay(Replay::Result(_)) => {}
            decision => panic!("the call ran a third time or was refused: {decision:?}"),
        }
    });
}
