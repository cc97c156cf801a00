//! What a store keeps comes back exactly: every outcome kind, and awkward keys.

use std::sync::Arc;

use super::{claim, claim_req, complete_req, id, later, scope, T0};
use crate::record::{Outcome, RecordState};
use crate::store::{ClaimOutcome, Store};

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
