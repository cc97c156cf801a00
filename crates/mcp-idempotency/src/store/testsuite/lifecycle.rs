//! The life of one record: claim, complete and replay, fencing, release, renew, take-over,
//! expiry, purge and delete.

use std::sync::Arc;

use super::{claim, claim_req, complete_req, id, keys, later, list, scope, LEASE, RETENTION, T0};
use crate::record::{FencingToken, Outcome, RecordState};
use crate::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, QuotaExceeded, RecordLimits,
    StateFilter, Store, TakeOverRequest,
};
use crate::time::Timestamp;

/// A free key is claimed; a second claim gets the in-progress record with the first owner.
pub async fn claim_then_existing(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let first = claim_req(&id, T0);
    assert_eq!(claim(&*store, &first).await, ClaimOutcome::Claimed);
    let second = claim_req(&id, later(T0, 1));
    let ClaimOutcome::Existing(record) = claim(&*store, &second).await else {
        panic!("second claim must see the first")
    };
    assert_eq!(record.id, id);
    assert_eq!(record.fingerprint, first.fingerprint);
    assert_eq!(record.tool_name, "charge");
    assert_eq!(record.created_at, T0);
    assert_eq!(record.expires_at, first.expires_at);
    assert_eq!(
        record.state,
        RecordState::InProgress {
            owner: first.owner,
            lease_expires_at: first.lease_expires_at
        }
    );
}

/// A completed record is returned with its outcome byte for byte.
pub async fn complete_then_replay_exactly(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = claim_req(&id, T0);
    assert_eq!(claim(&*store, &req).await, ClaimOutcome::Claimed);
    let raw =
        "{ \"content\" : [{\"type\":\"text\",\"text\":\"caf\\u00e9 \u{1F600}\"}], \"n\": 1.0e0 }";
    let done = complete_req(&req, Outcome::Success(raw.into()), later(T0, 2));
    assert_eq!(store.complete(done.clone()).await.unwrap(), Fenced::Applied);

    let record = store.get(&id, later(T0, 3)).await.unwrap().expect("record");
    assert_eq!(
        record.state,
        RecordState::Completed {
            outcome: Outcome::Success(raw.into()),
            completed_at: later(T0, 2)
        }
    );
    assert_eq!(record.expires_at, done.expires_at);
    let ClaimOutcome::Existing(again) = claim(&*store, &claim_req(&id, later(T0, 4))).await else {
        panic!("completed record must be returned")
    };
    assert_eq!(again, record);
}

/// Only the current owner can complete; a completed record cannot be completed again.
pub async fn complete_is_fenced(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = claim_req(&id, T0);
    claim(&*store, &req).await;
    let mut stale = complete_req(&req, Outcome::Error("{\"code\":1}".into()), later(T0, 1));
    stale.owner = FencingToken::random();
    assert_eq!(store.complete(stale).await.unwrap(), Fenced::NotOwner);
    assert!(matches!(
        store.get(&id, later(T0, 1)).await.unwrap().unwrap().state,
        RecordState::InProgress { .. }
    ));

    let good = complete_req(&req, Outcome::Success("1".into()), later(T0, 1));
    assert_eq!(store.complete(good).await.unwrap(), Fenced::Applied);
    let again = complete_req(&req, Outcome::Success("2".into()), later(T0, 2));
    assert_eq!(store.complete(again).await.unwrap(), Fenced::NotOwner);
    let missing = complete_req(
        &claim_req(&self::id(&id.scope, "other"), T0),
        Outcome::Success("3".into()),
        T0,
    );
    assert_eq!(store.complete(missing).await.unwrap(), Fenced::NotOwner);
    let record = store.get(&id, later(T0, 3)).await.unwrap().unwrap();
    assert!(
        matches!(record.state, RecordState::Completed { outcome: Outcome::Success(ref s), .. } if s == "1")
    );
}

/// Releasing by the owner deletes the in-progress record; nobody else can release it, and a
/// completed record cannot be released.
pub async fn release_frees_the_key(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = claim_req(&id, T0);
    claim(&*store, &req).await;
    assert_eq!(
        store.release(&id, FencingToken::random()).await.unwrap(),
        Fenced::NotOwner
    );
    assert_eq!(
        store.release(&id, req.owner).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(store.get(&id, T0).await.unwrap(), None);
    assert_eq!(
        store.release(&id, req.owner).await.unwrap(),
        Fenced::NotOwner
    );

    let next = claim_req(&id, later(T0, 1));
    assert_eq!(claim(&*store, &next).await, ClaimOutcome::Claimed);
    store
        .complete(complete_req(
            &next,
            Outcome::Success("1".into()),
            later(T0, 2),
        ))
        .await
        .unwrap();
    assert_eq!(
        store.release(&id, next.owner).await.unwrap(),
        Fenced::NotOwner
    );
    assert!(store.get(&id, later(T0, 3)).await.unwrap().is_some());
}

/// Renewal moves the lease deadline for the owner only.
pub async fn renew_extends_only_the_owners_lease(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = claim_req(&id, T0);
    claim(&*store, &req).await;
    let new_deadline = later(T0, 100);
    assert_eq!(
        store
            .renew(&id, FencingToken::random(), new_deadline)
            .await
            .unwrap(),
        Fenced::NotOwner
    );
    assert_eq!(
        store.renew(&id, req.owner, new_deadline).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.get(&id, T0).await.unwrap().unwrap().state,
        RecordState::InProgress {
            owner: req.owner,
            lease_expires_at: new_deadline
        }
    );
    store
        .complete(complete_req(
            &req,
            Outcome::Success("1".into()),
            later(T0, 1),
        ))
        .await
        .unwrap();
    assert_eq!(
        store.renew(&id, req.owner, later(T0, 200)).await.unwrap(),
        Fenced::NotOwner
    );
}

/// A call renewed past its retention window is still in progress: its record does not expire,
/// so a retry cannot execute it a second time.
pub async fn renew_keeps_a_running_record_past_its_retention(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = ClaimRequest {
        expires_at: later(T0, 60),
        ..claim_req(&id, T0)
    };
    claim(&*store, &req).await;
    let deadline = later(T0, 90);
    assert_eq!(
        store.renew(&id, req.owner, deadline).await.unwrap(),
        Fenced::Applied
    );
    let record = store
        .get(&id, later(T0, 70))
        .await
        .unwrap()
        .expect("still running");
    assert_eq!(record.expires_at, deadline);
    assert!(matches!(
        claim(&*store, &claim_req(&id, later(T0, 70))).await,
        ClaimOutcome::Existing(_)
    ));
    let done = complete_req(&req, Outcome::Success("1".into()), later(T0, 80));
    assert_eq!(store.complete(done).await.unwrap(), Fenced::Applied);
}

/// A take-over needs the dead owner's token and a lease that has run out; afterwards the old owner
/// is fenced off and the new one completes.
pub async fn take_over_only_after_the_lease_ran_out(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = claim_req(&id, T0);
    claim(&*store, &req).await;
    let new_owner = FencingToken::random();
    let take_over = |now: Timestamp, previous_owner: FencingToken| TakeOverRequest {
        trace: None,
        id: id.clone(),
        previous_owner,
        new_owner,
        now,
        lease_expires_at: now.saturating_add(LEASE),
        expires_at: now.saturating_add(RETENTION),
    };
    let before_expiry = later(T0, 10);
    assert_eq!(
        store
            .take_over(&take_over(before_expiry, req.owner))
            .await
            .unwrap(),
        Fenced::NotOwner
    );
    let after_expiry = req.lease_expires_at;
    assert_eq!(
        store
            .take_over(&take_over(after_expiry, FencingToken::random()))
            .await
            .unwrap(),
        Fenced::NotOwner
    );
    assert_eq!(
        store
            .take_over(&take_over(after_expiry, req.owner))
            .await
            .unwrap(),
        Fenced::Applied
    );
    let record = store.get(&id, after_expiry).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        RecordState::InProgress {
            owner: new_owner,
            lease_expires_at: after_expiry.saturating_add(LEASE)
        }
    );
    let stale = complete_req(&req, Outcome::Success("old".into()), after_expiry);
    assert_eq!(store.complete(stale).await.unwrap(), Fenced::NotOwner);
    let mut fresh = complete_req(&req, Outcome::Success("new".into()), after_expiry);
    fresh.owner = new_owner;
    assert_eq!(store.complete(fresh).await.unwrap(), Fenced::Applied);
}

/// A record past its retention window is invisible and its key can be claimed anew.
pub async fn expired_records_count_as_absent(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let mut req = claim_req(&id, T0);
    req.expires_at = later(T0, 10);
    claim(&*store, &req).await;
    store
        .complete(CompleteRequest {
            expires_at: later(T0, 10),
            ..complete_req(&req, Outcome::Success("1".into()), later(T0, 1))
        })
        .await
        .unwrap();
    assert!(store.get(&id, later(T0, 9)).await.unwrap().is_some());
    assert_eq!(store.get(&id, later(T0, 10)).await.unwrap(), None);
    let next = claim_req(&id, later(T0, 10));
    assert_eq!(claim(&*store, &next).await, ClaimOutcome::Claimed);
    let record = store.get(&id, later(T0, 11)).await.unwrap().unwrap();
    assert_eq!(record.created_at, later(T0, 10));
    assert!(matches!(record.state, RecordState::InProgress { owner, .. } if owner == next.owner));
}

/// Purging deletes expired records and keeps live ones.
pub async fn purge_removes_only_expired(store: Arc<dyn Store>) {
    let scope = scope();
    for i in 0..5 {
        let mut req = claim_req(&id(&scope, &format!("k{i}")), T0);
        if i < 3 {
            req.expires_at = later(T0, 10);
        }
        assert_eq!(claim(&*store, &req).await, ClaimOutcome::Claimed);
    }
    let purged = store.purge_expired(later(T0, 10)).await.unwrap();
    assert!(purged >= 3, "purged {purged}");
    for i in 0..5 {
        let record = store.get(&id(&scope, &format!("k{i}")), T0).await.unwrap();
        assert_eq!(record.is_some(), i >= 3, "k{i}");
    }
}

/// Deleting removes a record whatever its state, so the key runs again; the old owner is fenced
/// off, the quotas count one record less, and deleting a missing record reports it.
pub async fn delete_frees_the_key_in_any_state(store: Arc<dyn Store>) {
    let scope = scope();
    let limits = RecordLimits {
        max_records_per_scope: 2,
        max_records_total: u64::MAX,
    };
    let running = ClaimRequest {
        limits,
        ..claim_req(&id(&scope, "running"), T0)
    };
    let done = ClaimRequest {
        limits,
        ..claim_req(&id(&scope, "done"), T0)
    };
    for req in [&running, &done] {
        assert_eq!(claim(&*store, req).await, ClaimOutcome::Claimed);
    }
    store
        .complete(complete_req(
            &done,
            Outcome::Success("1".into()),
            later(T0, 1),
        ))
        .await
        .unwrap();
    let third = ClaimRequest {
        limits,
        ..claim_req(&id(&scope, "third"), later(T0, 2))
    };
    assert!(matches!(
        claim(&*store, &third).await,
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 2 })
    ));

    assert!(store.delete(&running.id).await.unwrap());
    assert_eq!(store.get(&running.id, later(T0, 2)).await.unwrap(), None);
    let late = complete_req(&running, Outcome::Success("late".into()), later(T0, 2));
    assert_eq!(store.complete(late).await.unwrap(), Fenced::NotOwner);
    assert_eq!(
        store
            .renew(&running.id, running.owner, later(T0, 60))
            .await
            .unwrap(),
        Fenced::NotOwner
    );
    assert!(!store.delete(&running.id).await.unwrap());
    // The freed place in the quota goes to a new key.
    assert_eq!(claim(&*store, &third).await, ClaimOutcome::Claimed);

    assert!(store.delete(&done.id).await.unwrap());
    let again = ClaimRequest {
        limits,
        ..claim_req(&done.id, later(T0, 3))
    };
    assert_eq!(claim(&*store, &again).await, ClaimOutcome::Claimed);
    let record = store.get(&done.id, later(T0, 3)).await.unwrap().unwrap();
    assert!(matches!(record.state, RecordState::InProgress { owner, .. } if owner == again.owner));

    // An expired record that was not purged yet can be deleted too.
    let expiring = ClaimRequest {
        expires_at: later(T0, 10),
        ..claim_req(&id(&scope, "expiring"), T0)
    };
    assert_eq!(claim(&*store, &expiring).await, ClaimOutcome::Claimed);
    let expired = ListFilter {
        namespace: Some(scope.namespace().to_owned()),
        state: Some(StateFilter::Expired),
        ..ListFilter::default()
    };
    assert_eq!(
        keys(&list(&*store, &expired, later(T0, 20)).await),
        ["expiring"]
    );
    assert!(store.delete(&expiring.id).await.unwrap());
    assert!(list(&*store, &expired, later(T0, 20)).await.is_empty());

    let before = store.stats(later(T0, 4)).await.unwrap();
    assert!(store.delete(&third.id).await.unwrap());
    let after = store.stats(later(T0, 4)).await.unwrap();
    assert_eq!(before.in_progress - after.in_progress, 1);
}
