//! Scopes, quotas and races: records of one scope never reach another, quotas are exact, and of
//! racing claims of one key exactly one wins.

use std::sync::Arc;

use super::{claim, claim_req, complete_req, id, later, scope, T0};
use crate::record::{Outcome, RecordState, Scope};
use crate::store::{ClaimOutcome, ClaimRequest, Fenced, QuotaExceeded, RecordLimits, Store};
use crate::time::Timestamp;

/// The same key in two scopes (other principal, or other namespace) names two records.
pub async fn scopes_are_isolated(store: Arc<dyn Store>) {
    let alice = scope();
    let bob = Scope::new(alice.namespace(), "bob");
    let other_server = Scope::new(format!("{}-other", alice.namespace()), alice.principal());
    let a = claim_req(&id(&alice, "shared"), T0);
    let b = claim_req(&id(&bob, "shared"), T0);
    let c = claim_req(&id(&other_server, "shared"), T0);
    for req in [&a, &b, &c] {
        assert_eq!(claim(&*store, req).await, ClaimOutcome::Claimed);
    }
    store
        .complete(complete_req(
            &a,
            Outcome::Success("\"alice\"".into()),
            later(T0, 1),
        ))
        .await
        .unwrap();
    assert!(matches!(
        store.get(&b.id, later(T0, 1)).await.unwrap().unwrap().state,
        RecordState::InProgress { .. }
    ));
    assert_eq!(
        store.release(&c.id, a.owner).await.unwrap(),
        Fenced::NotOwner
    );
    assert_eq!(
        store.release(&c.id, c.owner).await.unwrap(),
        Fenced::Applied
    );
    assert!(store.get(&a.id, later(T0, 1)).await.unwrap().is_some());
}

/// A scope at its limit is refused new keys without affecting other scopes; releasing or expiring
/// records makes room again.
pub async fn quota_per_scope(store: Arc<dyn Store>) {
    let full = scope();
    let limits = RecordLimits {
        max_records_per_scope: 2,
        max_records_total: u64::MAX,
    };
    let with_limits = |key: &str, now: Timestamp| ClaimRequest {
        limits,
        expires_at: later(T0, 100),
        ..claim_req(&id(&full, key), now)
    };
    let first = with_limits("a", T0);
    assert_eq!(claim(&*store, &first).await, ClaimOutcome::Claimed);
    assert_eq!(
        claim(&*store, &with_limits("b", T0)).await,
        ClaimOutcome::Claimed
    );
    assert_eq!(
        claim(&*store, &with_limits("c", T0)).await,
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 2 })
    );
    // Existing keys are still answered.
    assert!(matches!(
        claim(&*store, &with_limits("a", T0)).await,
        ClaimOutcome::Existing(_)
    ));
    let elsewhere = ClaimRequest {
        limits,
        ..claim_req(&id(&Scope::new(full.namespace(), "someone-else"), "c"), T0)
    };
    assert_eq!(claim(&*store, &elsewhere).await, ClaimOutcome::Claimed);

    assert_eq!(
        store.release(&first.id, first.owner).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        claim(&*store, &with_limits("c", T0)).await,
        ClaimOutcome::Claimed
    );
    assert!(matches!(
        claim(&*store, &with_limits("d", T0)).await,
        ClaimOutcome::QuotaExceeded(_)
    ));
    // Once the records expire they no longer count.
    assert_eq!(
        claim(&*store, &with_limits("d", later(T0, 100))).await,
        ClaimOutcome::Claimed
    );
}

/// The store-wide limit counts every scope. Needs a store no other check writes to concurrently.
pub async fn quota_total(store: Arc<dyn Store>) {
    let stats = store.stats(T0).await.unwrap();
    let present = stats.in_progress + stats.completed + stats.expired;
    let limits = RecordLimits {
        max_records_per_scope: u64::MAX,
        max_records_total: present + 2,
    };
    let a = scope();
    let b = scope();
    for (scope, key) in [(&a, "1"), (&b, "2")] {
        let req = ClaimRequest {
            limits,
            ..claim_req(&id(scope, key), T0)
        };
        assert_eq!(claim(&*store, &req).await, ClaimOutcome::Claimed);
    }
    let req = ClaimRequest {
        limits,
        ..claim_req(&id(&scope(), "3"), T0)
    };
    assert_eq!(
        claim(&*store, &req).await,
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Total { limit: present + 2 })
    );
}

/// Many tasks claiming one key at once: exactly one wins, all others see its record.
pub async fn racing_claims_have_one_winner(store: Arc<dyn Store>) {
    let id = id(&scope(), "contended");
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let store = Arc::clone(&store);
            let req = claim_req(&id, T0);
            tokio::spawn(async move { (req.owner, store.claim(&req).await.expect("claim")) })
        })
        .collect();
    let mut winners = Vec::new();
    let mut owners_seen = Vec::new();
    for task in tasks {
        match task.await.expect("task") {
            (owner, ClaimOutcome::Claimed) => winners.push(owner),
            (_, ClaimOutcome::Existing(record)) => match record.state {
                RecordState::InProgress { owner, .. } => owners_seen.push(owner),
                other => panic!("unexpected state {other:?}"),
            },
            (_, other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim must win");
    assert!(owners_seen.iter().all(|owner| *owner == winners[0]));
}

/// Many tasks claiming distinct keys at once all win.
pub async fn racing_distinct_keys_all_win(store: Arc<dyn Store>) {
    let scope = scope();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = Arc::clone(&store);
            let req = claim_req(&id(&scope, &format!("k{i}")), T0);
            tokio::spawn(async move { store.claim(&req).await.expect("claim") })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.expect("task"), ClaimOutcome::Claimed);
    }
    let stats = store.stats(T0).await.unwrap();
    assert!(stats.in_progress >= 64);
}
