//! A store that fails on demand: the deduplicator fails closed on a failed claim, take-over or
//! renewal.

use super::*;

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
