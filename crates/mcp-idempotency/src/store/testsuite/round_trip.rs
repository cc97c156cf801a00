//! What a store keeps comes back exactly: every outcome kind, awkward keys, and traces.

use std::sync::Arc;

use super::{claim, claim_req, complete_req, id, later, list, scope, LEASE, RETENTION, T0};
use crate::record::{FencingToken, Outcome, RecordState, TraceLink};
use crate::store::{ClaimOutcome, ClaimRequest, Fenced, ListFilter, Store, TakeOverRequest};

/// Success, error, not-retained and unknown outcomes come back as they were written.
pub async fn every_outcome_kind_round_trips(store: Arc<dyn Store>) {
    let scope = scope();
    let outcomes = [
        Outcome::Success(r#"{"content":[],"isError":true}"#.into()),
        Outcome::Error(r#"{"code":-32603,"message":"card declined","data":{"x":[1,2]}}"#.into()),
        Outcome::NotRetained { size: 5_000_000 },
        Outcome::Unknown {
            reason: "upstream exited with status 137".into(),
        },
        Outcome::Success("\"".to_owned() + &"x".repeat(256 * 1024) + "\""),
    ];
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let req = claim_req(&id(&scope, &format!("k{i}")), T0);
        claim(&*store, &req).await;
        store
            .complete(complete_req(&req, outcome.clone(), later(T0, 1)))
            .await
            .unwrap();
        let record = store.get(&req.id, later(T0, 1)).await.unwrap().unwrap();
        assert!(
            matches!(record.state, RecordState::Completed { outcome: ref got, .. } if *got == outcome),
            "outcome {i}"
        );
    }
}

/// Keys with quotes, SQL, Unicode and maximal length are distinct records, kept exactly.
pub async fn awkward_keys_are_kept_exactly(store: Arc<dyn Store>) {
    let scope = scope();
    let long = "€".repeat(85);
    let keys = [
        "'; DROP TABLE idempotency_records; --",
        "{key}",
        "a\"b\\c",
        "ключ 🔑",
        "K",
        "k",
        "k ",
        long.as_str(),
        "*",
        "%",
    ];
    for key in keys {
        let req = claim_req(&id(&scope, key), T0);
        assert_eq!(claim(&*store, &req).await, ClaimOutcome::Claimed, "{key:?}");
    }
    for key in keys {
        let record = store.get(&id(&scope, key), T0).await.unwrap().expect(key);
        assert_eq!(record.id.key.as_str(), key);
    }
}

/// The claiming call's trace is kept with its record: read back while it runs and once it is
/// completed, listed, replaced by a take-over's, and gone when a claim without one replaces an
/// expired record.
pub async fn traces_are_kept_with_their_record(store: Arc<dyn Store>) {
    let link = |n: u8| TraceLink::new([n; 16], [n; 8], 1).expect("valid ids");
    let scope = scope();
    let traced = ClaimRequest {
        trace: Some(link(1)),
        ..claim_req(&id(&scope, "traced"), T0)
    };
    claim(&*store, &traced).await;
    let untraced = claim_req(&id(&scope, "untraced"), T0);
    claim(&*store, &untraced).await;
    let get = |req: &ClaimRequest, secs| {
        let (store, id) = (Arc::clone(&store), req.id.clone());
        async move { store.get(&id, later(T0, secs)).await.unwrap().unwrap() }
    };
    assert_eq!(get(&traced, 1).await.trace, Some(link(1)));
    assert_eq!(get(&untraced, 1).await.trace, None);
    // A claim that finds the record sees its trace: the running call a duplicate links to.
    let ClaimOutcome::Existing(found) = claim(&*store, &claim_req(&traced.id, later(T0, 1))).await
    else {
        panic!("the key is held");
    };
    assert_eq!(found.trace, Some(link(1)));
    store
        .complete(complete_req(
            &traced,
            Outcome::Success("{}".into()),
            later(T0, 2),
        ))
        .await
        .unwrap();
    assert_eq!(
        get(&traced, 3).await.trace,
        Some(link(1)),
        "kept by the completion"
    );
    let listed = list(
        &*store,
        &ListFilter {
            namespace: Some(scope.namespace().into()),
            ..ListFilter::default()
        },
        later(T0, 3),
    )
    .await;
    let traces: Vec<_> = listed
        .iter()
        .map(|r| (r.id.key.as_str(), r.trace))
        .collect();
    assert!(traces.contains(&("traced", Some(link(1)))), "{traces:?}");
    assert!(traces.contains(&("untraced", None)), "{traces:?}");

    // A take-over replaces the trace with the new owner's.
    let taken_at = untraced.lease_expires_at;
    let take_over = TakeOverRequest {
        id: untraced.id.clone(),
        previous_owner: untraced.owner,
        new_owner: FencingToken::random(),
        now: taken_at,
        lease_expires_at: taken_at.saturating_add(LEASE),
        expires_at: taken_at.saturating_add(RETENTION),
        trace: Some(link(2)),
    };
    assert_eq!(store.take_over(&take_over).await.unwrap(), Fenced::Applied);
    let record = store.get(&untraced.id, taken_at).await.unwrap().unwrap();
    assert_eq!(record.trace, Some(link(2)));

    // An expired record claimed again by a call without a trace keeps none of the old one.
    let after = later(T0, 2).saturating_add(RETENTION).saturating_add(LEASE);
    let again = claim_req(&traced.id, after);
    assert_eq!(claim(&*store, &again).await, ClaimOutcome::Claimed);
    assert_eq!(
        store.get(&again.id, after).await.unwrap().unwrap().trace,
        None
    );
}
