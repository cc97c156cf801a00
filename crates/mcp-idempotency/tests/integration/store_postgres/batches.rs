//! Group commit: claims and completions that wait at the same time run in one statement. Each
//! record row's `xmin` names the transaction that last wrote it, so the database itself shows
//! which operations shared a transaction.

use super::*;
use crate::at_once::complete_all;

/// Rows of the scope's records and the distinct transactions that last wrote them.
async fn rows_and_transactions(url: &str, schema: &str, scope: &Scope) -> (i64, i64) {
    let client = admin(url).await;
    let row = client
        .query_one(
            &format!(
                "SELECT count(*), count(DISTINCT xmin::text) FROM \"{schema}\".idem_records
                 WHERE namespace = $1 AND principal = $2"
            ),
            &[&scope.namespace(), &scope.principal()],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// `claim_all`'s answers, each expected to be one.
async fn claimed_all(store: &Arc<TestStore>, reqs: &[ClaimRequest]) -> Vec<ClaimOutcome> {
    let answers = claim_all(store, reqs.to_vec()).await;
    answers.into_iter().map(|a| a.expect("claim")).collect()
}

/// 48 claims and then their 48 completions, each set sent at once: every one gets its own right
/// answer, at most half as many transactions as operations wrote them, and the counters agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operations_that_wait_at_the_same_time_share_transactions() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let store = Arc::new(TestStore::open(&url).await);
    let scope = scope();
    // The scope's first claim takes the exact path and sets up its counter rows.
    let first = claim_req(&record_id(&scope, "first"), T0, RecordLimits::UNLIMITED);
    assert_eq!(store.claim(&first).await.unwrap(), ClaimOutcome::Claimed);

    let reqs: Vec<_> = (0..48)
        .map(|i| {
            claim_req(
                &record_id(&scope, &format!("k{i}")),
                T0,
                RecordLimits::UNLIMITED,
            )
        })
        .collect();
    let answers = claimed_all(&store, &reqs).await;
    assert!(
        answers.iter().all(|a| *a == ClaimOutcome::Claimed),
        "{answers:?}"
    );
    let (rows, transactions) = rows_and_transactions(&url, &store.schema, &scope).await;
    assert_eq!(rows, 49);
    // Half is a bound a loaded machine keeps: the 47 that queue behind the first usually share one.
    assert!(
        transactions <= 24,
        "49 claims were written by {transactions} transactions"
    );

    let completions = reqs.iter().map(|req| CompleteRequest {
        id: req.id.clone(),
        owner: req.owner,
        outcome: Outcome::Success(format!(r#"{{"key":"{}"}}"#, req.id.key.as_str())),
        completed_at: later(T0, 1),
        expires_at: later(T0, 3600),
    });
    for answer in complete_all(&store, completions).await {
        assert_eq!(answer.expect("complete"), Fenced::Applied);
    }
    let (_, transactions) = rows_and_transactions(&url, &store.schema, &scope).await;
    assert!(
        transactions <= 25,
        "48 completions and the first claim were written by {transactions} transactions"
    );
    for req in &reqs {
        let record = store.get(&req.id, later(T0, 2)).await.unwrap().unwrap();
        assert_eq!(
            record.state,
            RecordState::Completed {
                outcome: Outcome::Success(format!(r#"{{"key":"{}"}}"#, req.id.key.as_str())),
                completed_at: later(T0, 1),
            },
            "{:?}",
            req.id.key
        );
    }
    // A completion from another owner, sent alongside the owner's own resends: refused, and
    // the record keeps its outcome.
    let stranger = CompleteRequest {
        id: reqs[0].id.clone(),
        owner: FencingToken::random(),
        outcome: Outcome::Error("{}".into()),
        completed_at: later(T0, 2),
        expires_at: later(T0, 3600),
    };
    assert_eq!(store.complete(stranger).await.unwrap(), Fenced::NotOwner);
    assert_counters_consistent(&url, &store.schema).await;
}

/// Claims of one key in one batch: the first wins, its resend (same owner) is claimed too, and
/// every other owner sees the winner's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_key_twice_in_a_batch_is_claimed_once() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let store = Arc::new(TestStore::open(&url).await);
    let scope = scope();
    let warm = claim_req(&record_id(&scope, "warm"), T0, RecordLimits::UNLIMITED);
    assert_eq!(store.claim(&warm).await.unwrap(), ClaimOutcome::Claimed);

    let id = record_id(&scope, "contended");
    let mut reqs: Vec<_> = (0..20)
        .map(|_| claim_req(&id, T0, RecordLimits::UNLIMITED))
        .collect();
    // Another key holds the first place, so the contended ones all queue behind it.
    reqs.insert(
        0,
        claim_req(&record_id(&scope, "lead"), T0, RecordLimits::UNLIMITED),
    );
    let resend = reqs[5].clone();
    reqs.push(resend);
    let answers = claimed_all(&store, &reqs).await;
    let winners: Vec<_> = (1..reqs.len())
        .filter(|&i| answers[i] == ClaimOutcome::Claimed)
        .map(|i| reqs[i].owner)
        .collect();
    let winner = winners[0];
    assert!(
        winners.iter().all(|owner| *owner == winner),
        "one owner wins the key (its resend may be claimed too): {winners:?}"
    );
    for (req, answer) in reqs.iter().zip(&answers).skip(1) {
        match answer {
            ClaimOutcome::Claimed => assert_eq!(req.owner, winner),
            ClaimOutcome::Existing(record) => assert_eq!(
                record.state,
                RecordState::InProgress {
                    owner: winner,
                    lease_expires_at: later(T0, 30)
                }
            ),
            other => panic!("unexpected {other:?}"),
        }
    }
    let stats = store.stats(T0).await.unwrap();
    assert_eq!(stats.in_progress, 3, "warm, lead and the contended key");
    assert_counters_consistent(&url, &store.schema).await;
}

/// 60 claims of distinct keys at once into a scope with room for 20, and a store with room for
/// 45: batches whose counter rows lack room leave those claims to run alone, on the exact path,
/// so exactly the limits are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_keep_quotas_exact() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let store = Arc::new(TestStore::open(&url).await);
    let limits = RecordLimits {
        max_records_per_scope: 20,
        max_records_total: 45,
    };
    let scopes = [scope(), scope(), scope()];
    for (n, scope) in scopes.iter().enumerate() {
        let reqs: Vec<_> = (0..60)
            .map(|i| claim_req(&record_id(scope, &format!("k{i}")), T0, limits))
            .collect();
        let answers = claimed_all(&store, &reqs).await;
        let claimed = answers
            .iter()
            .filter(|a| **a == ClaimOutcome::Claimed)
            .count();
        let (expected, refusal) = if n < 2 {
            (20, QuotaExceeded::Scope { limit: 20 })
        } else {
            (5, QuotaExceeded::Total { limit: 45 })
        };
        assert_eq!(claimed, expected, "scope {n}");
        for answer in &answers {
            assert!(
                *answer == ClaimOutcome::Claimed || *answer == ClaimOutcome::QuotaExceeded(refusal),
                "scope {n}: {answer:?}"
            );
        }
    }
    assert_eq!(store.stats(T0).await.unwrap().in_progress, 45);
    assert_counters_consistent(&url, &store.schema).await;
}

/// Without the batch function (a schema whose function was dropped under a running store), a
/// batch fails and each of its operations runs alone: every caller still gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_batch_runs_each_operation_alone() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let store = Arc::new(TestStore::open(&url).await);
    admin(&url)
        .await
        .batch_execute(&format!("DROP FUNCTION \"{}\".idem_batch_v2", store.schema))
        .await
        .unwrap();
    let scope = scope();
    let mut reqs: Vec<_> = (0..30)
        .map(|i| {
            claim_req(
                &record_id(&scope, &format!("k{i}")),
                T0,
                RecordLimits::UNLIMITED,
            )
        })
        .collect();
    let duplicate = claim_req(&reqs[3].id, T0, RecordLimits::UNLIMITED);
    reqs.push(duplicate);
    let answers = claimed_all(&store, &reqs).await;
    let claimed = answers
        .iter()
        .filter(|a| **a == ClaimOutcome::Claimed)
        .count();
    assert_eq!(claimed, 30, "{answers:?}");
    assert!(matches!(
        (&answers[3], &answers[30]),
        (ClaimOutcome::Claimed, ClaimOutcome::Existing(_))
            | (ClaimOutcome::Existing(_), ClaimOutcome::Claimed)
    ));
    let (rows, transactions) = rows_and_transactions(&url, &store.schema, &scope).await;
    assert_eq!((rows, transactions), (30, 30), "each claim ran alone");
    assert_counters_consistent(&url, &store.schema).await;
}
