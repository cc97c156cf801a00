//! Operations sent twice: the answer to the first was lost (a timeout, a connection reset after
//! the command went out) and the caller, or its client library, sent it again. The second one
//! answers as the first would have, and changes nothing (the table in the [`Store`] docs).

use std::sync::Arc;

use super::{claim, claim_req, complete_req, id, later, scope, LEASE, RETENTION, T0};
use crate::fingerprint::fingerprint;
use crate::record::{FencingToken, Outcome, RecordState};
use crate::store::{
    ClaimOutcome, ClaimRequest, Fenced, QuotaExceeded, RecordLimits, Store, TakeOverRequest,
};

/// A claim sent again by its owner is [`ClaimOutcome::Claimed`] and changes nothing: the record
/// is as the first claim left it, and it holds one place in the quota, not two. The same token
/// with other arguments, another token, or the owner's token once the lease ran out is not that
/// claim: they get the record.
pub async fn claim_sent_twice_is_claimed_once(store: Arc<dyn Store>) {
    let scope = scope();
    let limits = RecordLimits {
        max_records_per_scope: 2,
        max_records_total: u64::MAX,
    };
    let first = ClaimRequest {
        limits,
        ..claim_req(&id(&scope, "k"), T0)
    };
    assert_eq!(claim(&*store, &first).await, ClaimOutcome::Claimed);
    let before = store.get(&first.id, T0).await.unwrap().expect("claimed");
    let again = ClaimRequest {
        now: later(T0, 1),
        ..first.clone()
    };
    for _ in 0..2 {
        assert_eq!(claim(&*store, &again).await, ClaimOutcome::Claimed);
    }
    assert_eq!(
        store.get(&first.id, later(T0, 1)).await.unwrap().as_ref(),
        Some(&before),
        "a claim sent again changes nothing"
    );

    // Counted once: one more key fits under the limit of 2, and then none.
    let other = ClaimRequest {
        limits,
        ..claim_req(&id(&scope, "other"), later(T0, 1))
    };
    assert_eq!(claim(&*store, &other).await, ClaimOutcome::Claimed);
    let third = ClaimRequest {
        limits,
        ..claim_req(&id(&scope, "third"), later(T0, 1))
    };
    assert_eq!(
        claim(&*store, &third).await,
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 2 })
    );

    // Not this claim: the token with other arguments, another token, a lease that ran out.
    let other_arguments = ClaimRequest {
        fingerprint: fingerprint("charge", Some(r#"{"amount":2}"#)).unwrap(),
        ..again.clone()
    };
    let other_owner = ClaimRequest {
        owner: FencingToken::random(),
        ..again.clone()
    };
    let after_the_lease = ClaimRequest {
        now: first.lease_expires_at,
        ..first.clone()
    };
    for (req, case) in [
        (other_arguments, "other arguments"),
        (other_owner, "another owner"),
        (after_the_lease, "after the lease"),
    ] {
        assert_eq!(
            claim(&*store, &req).await,
            ClaimOutcome::Existing(before.clone()),
            "{case}"
        );
    }

    // Once the call is recorded, the claim sent again gets the outcome: the call ran.
    let done = complete_req(&first, Outcome::Success("1".into()), later(T0, 2));
    assert_eq!(store.complete(done).await.unwrap(), Fenced::Applied);
    let ClaimOutcome::Existing(record) = claim(&*store, &again).await else {
        panic!("a completed record is returned")
    };
    assert!(matches!(record.state, RecordState::Completed { .. }));
}

/// A completion sent again after it was applied is [`Fenced::Applied`] and changes nothing; a
/// different completion by the same owner is refused, as before.
pub async fn complete_sent_twice_is_applied_once(store: Arc<dyn Store>) {
    let scope = scope();
    for outcome in [
        Outcome::Success("{\"content\":[]}".into()),
        Outcome::Unknown {
            reason: "lost".into(),
        },
    ] {
        let id = id(&scope, outcome.kind().as_str());
        let req = claim_req(&id, T0);
        assert_eq!(claim(&*store, &req).await, ClaimOutcome::Claimed);
        let done = complete_req(&req, outcome, later(T0, 2));
        assert_eq!(store.complete(done.clone()).await.unwrap(), Fenced::Applied);
        let recorded = store.get(&id, later(T0, 3)).await.unwrap();
        assert_eq!(
            store.complete(done.clone()).await.unwrap(),
            Fenced::Applied,
            "sent again"
        );
        assert_eq!(store.get(&id, later(T0, 3)).await.unwrap(), recorded);

        let other_outcome = complete_req(&req, Outcome::Success("2".into()), later(T0, 2));
        let later_completion = complete_req(&req, done.outcome.clone(), later(T0, 4));
        for (other, case) in [
            (other_outcome, "another outcome"),
            (later_completion, "another time"),
        ] {
            assert_eq!(
                store.complete(other).await.unwrap(),
                Fenced::NotOwner,
                "{case}"
            );
        }
        assert_eq!(store.get(&id, later(T0, 3)).await.unwrap(), recorded);
    }
}

/// A release sent again finds nothing of its own: [`Fenced::NotOwner`], and the record another
/// claim created meanwhile is left alone, as is a record another owner holds.
pub async fn release_sent_twice_changes_nothing(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let lost = claim_req(&id, T0);
    assert_eq!(claim(&*store, &lost).await, ClaimOutcome::Claimed);
    assert_eq!(
        store.release(&id, lost.owner).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.release(&id, lost.owner).await.unwrap(),
        Fenced::NotOwner
    );

    let next = claim_req(&id, later(T0, 1));
    assert_eq!(claim(&*store, &next).await, ClaimOutcome::Claimed);
    let held = store.get(&id, later(T0, 1)).await.unwrap();
    assert_eq!(
        store.release(&id, lost.owner).await.unwrap(),
        Fenced::NotOwner
    );
    assert_eq!(store.get(&id, later(T0, 1)).await.unwrap(), held);
    assert_eq!(
        store
            .release(&self::id(&id.scope, "absent"), lost.owner)
            .await
            .unwrap(),
        Fenced::NotOwner
    );
}

/// A renewal sent again is applied again, to the same deadline.
pub async fn renew_sent_twice_is_applied_twice(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = claim_req(&id, T0);
    assert_eq!(claim(&*store, &req).await, ClaimOutcome::Claimed);
    let deadline = later(T0, 40);
    for _ in 0..2 {
        assert_eq!(
            store.renew(&id, req.owner, deadline).await.unwrap(),
            Fenced::Applied
        );
    }
    let record = store.get(&id, later(T0, 1)).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        RecordState::InProgress {
            owner: req.owner,
            lease_expires_at: deadline
        }
    );
    assert_eq!(record.expires_at, req.expires_at);
}

/// A take-over sent again by the new owner is [`Fenced::Applied`] and changes nothing (not even
/// a lease the new owner has renewed since).
pub async fn take_over_sent_twice_is_applied_once(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = claim_req(&id, T0);
    assert_eq!(claim(&*store, &req).await, ClaimOutcome::Claimed);
    let now = req.lease_expires_at;
    let take_over = TakeOverRequest {
        trace: None,
        id: id.clone(),
        previous_owner: req.owner,
        new_owner: FencingToken::random(),
        now,
        lease_expires_at: now.saturating_add(LEASE),
        expires_at: now.saturating_add(RETENTION),
    };
    assert_eq!(store.take_over(&take_over).await.unwrap(), Fenced::Applied);
    let renewed = later(now, 40);
    assert_eq!(
        store
            .renew(&id, take_over.new_owner, renewed)
            .await
            .unwrap(),
        Fenced::Applied
    );
    let before = store.get(&id, now).await.unwrap();
    assert_eq!(store.take_over(&take_over).await.unwrap(), Fenced::Applied);
    assert_eq!(store.get(&id, now).await.unwrap(), before);
    assert!(matches!(
        before.unwrap().state,
        RecordState::InProgress { owner, lease_expires_at }
            if owner == take_over.new_owner && lease_expires_at == renewed
    ));
}
