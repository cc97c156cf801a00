//! Scenarios on every store: releasing a claim, a dead lease under `reject` and `reexecute`, renewal,
//! and a retention window shorter than the lease.

use super::*;

/// A lease the tests let run out by moving a [`ManualClock`], never by sleeping.
const SHORT_LEASE: Duration = Duration::from_millis(50);

/// Past `SHORT_LEASE`.
const PAST_SHORT_LEASE: Duration = Duration::from_millis(150);

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
    let d =
        dedup(&store, EngineConfig::default().with_lease(SHORT_LEASE)).with_clock(clock.clone());
    assert_eq!(d.engine().config().after_crash(), AfterCrash::Reject);
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
        .with_lease(SHORT_LEASE)
        .with_after_crash(AfterCrash::Reexecute);
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
        .with_lease(lease)
        .with_after_crash(AfterCrash::Reexecute);
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

/// A retention window shorter than the lease must not let a record expire while its call is
/// still running (which would let a duplicate execute).
async fn short_retention_does_not_expire_a_running_call(store: Arc<dyn Store>) {
    let config = EngineConfig::default().with_retention(Duration::from_millis(20));
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

on_every_store!(
    release_lets_a_retry_execute,
    after_crash_reject,
    after_crash_reexecute,
    renewal_keeps_the_claim_alive,
    short_retention_does_not_expire_a_running_call,
);
