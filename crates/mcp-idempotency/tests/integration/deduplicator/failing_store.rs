//! A store that fails on demand: the deduplicator fails closed on a failed claim, take-over or
//! renewal; a claim whose answer was lost after it was applied, or a release that failed, is
//! released once the store answers again (by the retry, or in the background).

use super::*;

// ---------------------------------------------------------------------------------------------
// A store that fails on demand: the deduplicator must fail closed

/// A memory store whose claims, completions and take-overs can be made to fail, or to wait (the
/// one fault-injecting store of the test binary: the stdio tests use it too).
#[derive(Debug, Default)]
pub(crate) struct FlakyStore {
    pub(crate) inner: MemoryStore,
    pub(crate) fail_claim: AtomicBool,
    fail_take_over: AtomicBool,
    pub(super) fail_renew: AtomicBool,
    /// Renewals of this key never answer (a store that hangs on one record).
    pub(super) hang_renewals_of: std::sync::Mutex<Option<String>>,
    pub(super) fail_release: AtomicBool,
    pub(super) fail_complete: AtomicBool,
    /// Completions of this key (as stored) fail.
    pub(super) fail_completions_of: std::sync::Mutex<Option<String>>,
    /// Completions sent, applied or not.
    pub(super) completions_sent: AtomicUsize,
    /// Releases sent, applied or not.
    pub(super) releases_sent: AtomicUsize,
    /// The next claim is applied, and then its answer is lost.
    pub(super) lose_claim_answer: AtomicBool,
    /// Claims are applied, then answered only after `claim_answer_go` (having told
    /// `claim_applied`).
    pub(crate) hold_claim_answers: AtomicBool,
    /// A claim was applied and its answer is held.
    pub(crate) claim_applied: tokio::sync::Notify,
    /// Lets a held claim answer through.
    pub(crate) claim_answer_go: tokio::sync::Notify,
    /// The next claim reads the store, then answers only after a release was applied: its answer
    /// is older than the release.
    stale_claim_answer: AtomicBool,
    /// A release was applied.
    released: tokio::sync::Notify,
    /// Completions wait for `completion_go` (after telling `completion_waiting`).
    pub(crate) hold_completions: AtomicBool,
    /// A completion is waiting.
    pub(crate) completion_waiting: tokio::sync::Notify,
    /// Lets a waiting completion through.
    pub(crate) completion_go: tokio::sync::Notify,
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
        if self.lose_claim_answer.swap(false, Ordering::SeqCst) {
            return Box::pin(async move {
                let applied = self.inner.claim(req).await;
                assert_eq!(applied.unwrap(), ClaimOutcome::Claimed);
                Err(StoreError::Unavailable {
                    message: "claim failed: connection reset by peer".into(),
                    source: None,
                })
            });
        }
        if self.hold_claim_answers.load(Ordering::SeqCst) {
            return Box::pin(async move {
                let applied = self.inner.claim(req).await;
                self.claim_applied.notify_one();
                self.claim_answer_go.notified().await;
                applied
            });
        }
        if self.stale_claim_answer.swap(false, Ordering::SeqCst) {
            return Box::pin(async move {
                let read = self.inner.claim(req).await;
                self.released.notified().await;
                read
            });
        }
        self.inner.claim(req)
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        self.completions_sent.fetch_add(1, Ordering::SeqCst);
        let failing = self.fail_completions_of.lock().unwrap().clone();
        if self.fail_complete.load(Ordering::SeqCst)
            || failing.as_deref() == Some(req.id.key.as_str())
        {
            return failure("complete");
        }
        if self.hold_completions.load(Ordering::SeqCst) {
            return Box::pin(async move {
                self.completion_waiting.notify_one();
                self.completion_go.notified().await;
                self.inner.complete(req).await
            });
        }
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
        let hung = self.hang_renewals_of.lock().unwrap().clone();
        if hung.as_deref() == Some(id.key.as_str()) {
            return Box::pin(std::future::pending());
        }
        self.inner.renew(id, owner, lease_expires_at)
    }

    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        self.releases_sent.fetch_add(1, Ordering::SeqCst);
        if self.fail_release.load(Ordering::SeqCst) {
            return failure("release");
        }
        Box::pin(async move {
            let released = self.inner.release(id, owner).await;
            self.released.notify_one();
            released
        })
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
        EngineConfig::default().with_after_crash(AfterCrash::Reexecute),
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

/// Waits (30 s at most) until `done` holds.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A deduplicator on a clock that stands still: the background release never falls due, so what
/// happens is the retry's doing.
fn still(store: &Arc<dyn Store>) -> Deduplicator {
    dedup(store, EngineConfig::default()).with_clock(Arc::new(ManualClock::new(Timestamp::now())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_releases_a_claim_whose_answer_was_lost_and_runs_once() {
    let flaky = Arc::new(FlakyStore::default());
    let store: Arc<dyn Store> = flaky.clone();
    let d = still(&store);
    flaky.lose_claim_answer.store(true, Ordering::SeqCst);
    reject(
        decide(&d, &scope(), TOOL, ARGS, "k").await,
        RejectionKind::StoreUnavailable,
    );
    // The claim was applied: the key is held by a token nobody will complete.
    let RecordState::InProgress { owner: lost, .. } =
        record(&store, &scope(), "k").await.unwrap().state
    else {
        panic!("the lost claim holds the key")
    };
    assert_eq!(d.pending_releases(), 1);

    // The retry finds the key held by the lost token, releases it and runs the call.
    let claim = execute(decide(&d, &scope(), TOOL, ARGS, "k").await);
    assert_ne!(claim.owner(), lost);
    assert_eq!(d.pending_releases(), 0);
    d.complete(&claim, Outcome::Success(RESULT.into()))
        .await
        .unwrap();
    assert_eq!(
        replay(decide(&d, &scope(), TOOL, ARGS, "k").await),
        Replay::Result(RESULT.into())
    );
    assert_eq!(stats(&store).await.completed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_whose_answer_predates_the_background_release_runs_once() {
    let flaky = Arc::new(FlakyStore::default());
    let store: Arc<dyn Store> = flaky.clone();
    let d = dedup(&store, EngineConfig::default());
    flaky.lose_claim_answer.store(true, Ordering::SeqCst);
    reject(
        decide(&d, &scope(), TOOL, ARGS, "k").await,
        RejectionKind::StoreUnavailable,
    );
    assert_eq!(d.pending_releases(), 1);
    // The retry's claim finds the key held by the lost token; before its answer arrives, the
    // release task has released that token. The key is free: the retry runs the call.
    flaky.stale_claim_answer.store(true, Ordering::SeqCst);
    let claim = execute(decide(&d, &scope(), TOOL, ARGS, "k").await);
    assert_eq!(d.pending_releases(), 0);
    d.complete(&claim, Outcome::Success(RESULT.into()))
        .await
        .unwrap();
    assert_eq!(
        replay(decide(&d, &scope(), TOOL, ARGS, "k").await),
        Replay::Result(RESULT.into())
    );
    assert_eq!(stats(&store).await.completed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_other_arguments_after_a_lost_answer_runs_them() {
    let flaky = Arc::new(FlakyStore::default());
    let store: Arc<dyn Store> = flaky.clone();
    let d = still(&store);
    flaky.lose_claim_answer.store(true, Ordering::SeqCst);
    reject(
        decide(&d, &scope(), TOOL, ARGS, "k").await,
        RejectionKind::StoreUnavailable,
    );
    // The first call never ran, so the key was never used: no conflict.
    execute(decide(&d, &scope(), TOOL, OTHER_ARGS, "k").await);
    assert_eq!(d.pending_releases(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_was_not_applied_is_forgotten_by_the_retry() {
    let flaky = Arc::new(FlakyStore::default());
    let store: Arc<dyn Store> = flaky.clone();
    let d = still(&store);
    flaky.fail_claim.store(true, Ordering::SeqCst);
    reject(
        decide(&d, &scope(), TOOL, ARGS, "k").await,
        RejectionKind::StoreUnavailable,
    );
    assert_eq!(d.pending_releases(), 1, "the claim may have been applied");
    flaky.fail_claim.store(false, Ordering::SeqCst);
    execute(decide(&d, &scope(), TOOL, ARGS, "k").await);
    assert_eq!(d.pending_releases(), 0, "the answer shows it was not");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_is_released_in_the_background_for_other_instances() {
    let flaky = Arc::new(FlakyStore::default());
    let store: Arc<dyn Store> = flaky.clone();
    let first = dedup(&store, EngineConfig::default());
    let other = dedup(&store, EngineConfig::default());
    // The claim's answer is lost, and the store then fails releases for a while.
    flaky.fail_release.store(true, Ordering::SeqCst);
    flaky.lose_claim_answer.store(true, Ordering::SeqCst);
    reject(
        decide(&first, &scope(), TOOL, ARGS, "k").await,
        RejectionKind::StoreUnavailable,
    );
    // Another instance cannot know the token: it sees a call in progress.
    reject(
        decide(&other, &scope(), TOOL, ARGS, "k").await,
        RejectionKind::KeyInProgress,
    );
    assert_eq!(first.pending_releases(), 1);

    // Once the store answers releases again, the first instance frees the key by itself.
    flaky.fail_release.store(false, Ordering::SeqCst);
    until("the lost claim is released", async || {
        record(&store, &scope(), "k").await.is_none()
    })
    .await;
    until("nothing waits for release", async || {
        first.pending_releases() == 0
    })
    .await;
    execute(decide(&other, &scope(), TOOL, ARGS, "k").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_is_retried_when_the_store_answers_a_claim() {
    let flaky = Arc::new(FlakyStore::default());
    let store: Arc<dyn Store> = flaky.clone();
    let d = dedup(&store, EngineConfig::default());
    let claim = execute(decide(&d, &scope(), TOOL, ARGS, "k").await);
    flaky.fail_release.store(true, Ordering::SeqCst);
    assert!(d.release(&claim).await.is_err());
    assert_eq!(d.pending_releases(), 1);
    flaky.fail_release.store(false, Ordering::SeqCst);
    // Any answer of the store (a claim of another key) sets the release going.
    execute(decide(&d, &scope(), TOOL, ARGS, "other").await);
    until("the failed release is done", async || {
        record(&store, &scope(), "k").await.is_none()
    })
    .await;
    until("nothing waits for release", async || {
        d.pending_releases() == 0
    })
    .await;
}
