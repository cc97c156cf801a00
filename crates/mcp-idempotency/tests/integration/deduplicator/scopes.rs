//! Scenarios on every store: scopes are isolated, and the per-scope and store-wide quotas refuse new
//! keys only.

use super::*;

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
    let d = dedup(
        &store,
        EngineConfig::default().with_max_records_per_scope(2),
    );
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
    let d = dedup(&store, EngineConfig::default().with_max_records_total(3));
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

on_every_store!(scopes_are_isolated, quota_per_scope, quota_total);
