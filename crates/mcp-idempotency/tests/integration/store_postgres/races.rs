//! Two pools (as two gateway instances) racing on one schema: one key claimed once, per-scope and
//! store-wide quotas held exactly under concurrency, near a limit, and across instances configured
//! with different limits.

use super::*;

/// Two stores with separate pools on one schema, as two gateway instances would have, race 50
/// claims of one key: one wins, everybody else sees the winner's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_pools_race_one_key() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let (a, b) = two_pools(&url).await;
    let id = record_id(&scope(), "contended");
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store: Arc<dyn Store> = if i % 2 == 0 { a.clone() } else { b.clone() };
            let req = claim_req(&id, T0, RecordLimits::UNLIMITED);
            tokio::spawn(async move { (req.owner, store.claim(&req).await.expect("claim")) })
        })
        .collect();
    let mut winners = Vec::new();
    let mut seen = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            (owner, ClaimOutcome::Claimed) => winners.push(owner),
            (_, ClaimOutcome::Existing(record)) => match record.state {
                RecordState::InProgress { owner, .. } => seen.push(owner),
                other => panic!("unexpected state {other:?}"),
            },
            (_, other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim wins");
    assert_eq!(seen.len(), 49);
    assert!(seen.iter().all(|owner| *owner == winners[0]));
    let stats = a.stats(T0).await.unwrap();
    assert_eq!(stats.in_progress, 1);
}

/// 50 distinct keys of one scope claimed at once through two pools, with room for 10: exactly 10
/// win, and the counters stay exact (releasing one makes room for exactly one more).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scope_quota_holds_under_concurrency() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let (a, b) = two_pools(&url).await;
    let limits = RecordLimits {
        max_records_per_scope: 10,
        max_records_total: u64::MAX,
    };
    let scope = scope();
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store: Arc<dyn Store> = if i % 2 == 0 { a.clone() } else { b.clone() };
            let req = claim_req(&record_id(&scope, &format!("k{i}")), T0, limits);
            tokio::spawn(async move { (req.clone(), store.claim(&req).await.expect("claim")) })
        })
        .collect();
    let mut claimed = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            (req, ClaimOutcome::Claimed) => claimed.push(req),
            (_, ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 10 })) => {}
            (_, other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(claimed.len(), 10);
    assert_eq!(a.stats(T0).await.unwrap().in_progress, 10);

    let freed = &claimed[0];
    assert_eq!(
        a.release(&freed.id, freed.owner).await.unwrap(),
        Fenced::Applied
    );
    let next = claim_req(&record_id(&scope, "after-release"), T0, limits);
    assert_eq!(b.claim(&next).await.unwrap(), ClaimOutcome::Claimed);
    let over = claim_req(&record_id(&scope, "one-too-many"), T0, limits);
    assert_eq!(
        a.claim(&over).await.unwrap(),
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 10 })
    );
}

/// The store-wide limit under concurrency: 40 scopes race for 7 slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn total_quota_holds_under_concurrency() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let (a, b) = two_pools(&url).await;
    let limits = RecordLimits {
        max_records_per_scope: 1,
        max_records_total: 7,
    };
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let store: Arc<dyn Store> = if i % 2 == 0 { a.clone() } else { b.clone() };
            let req = claim_req(&record_id(&scope(), "k"), T0, limits);
            tokio::spawn(async move { store.claim(&req).await.expect("claim") })
        })
        .collect();
    let mut claimed = 0;
    for task in tasks {
        match task.await.unwrap() {
            ClaimOutcome::Claimed => claimed += 1,
            ClaimOutcome::QuotaExceeded(QuotaExceeded::Total { limit: 7 }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(claimed, 7);
    assert_eq!(a.stats(T0).await.unwrap().in_progress, 7);
}

/// Runs `requests` on `tasks` tasks, alternately on each of two stores, each task taking the
/// next request when done with one.
async fn claim_concurrently(
    pools: [Arc<dyn Store>; 2],
    requests: Vec<ClaimRequest>,
    tasks: usize,
) -> Vec<(ClaimRequest, ClaimOutcome)> {
    let queue = Arc::new(Mutex::new(requests));
    let workers: Vec<_> = (0..tasks)
        .map(|i| {
            let store = pools[i % 2].clone();
            let queue = queue.clone();
            tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    let Some(req) = queue.lock().unwrap().pop() else {
                        break done;
                    };
                    let outcome = store.claim(&req).await.expect("claim");
                    done.push((req, outcome));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.unwrap());
    }
    all
}

/// Two stores (separate pools) on one fresh schema.
async fn two_pools(url: &str) -> (Arc<TestStore>, Arc<dyn Store>) {
    let a = Arc::new(TestStore::open(url).await);
    let b = Arc::new(PostgresStore::open_in_schema(url, &a.schema).await.unwrap());
    (a, b)
}

/// Many distinct keys of ONE scope claimed at once from two pools (the case whose claims all
/// locked one scope row and one store row before sharding): all win, every counter shard is used,
/// and the counters stay exact through completion, release and purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_keys_of_one_scope_from_two_pools() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let (a, b) = two_pools(&url).await;
    let limits = RecordLimits {
        max_records_per_scope: 100_000,
        max_records_total: 1_000_000,
    };
    let scope = scope();
    let requests: Vec<_> = (0..800)
        .map(|i| claim_req(&record_id(&scope, &format!("k{i}")), T0, limits))
        .collect();
    let results = claim_concurrently([a.clone(), b.clone()], requests, 32).await;
    assert_eq!(results.len(), 800);
    assert!(results.iter().all(|(_, o)| *o == ClaimOutcome::Claimed));
    assert_eq!(a.stats(T0).await.unwrap().in_progress, 800);
    assert_counters_consistent(&url, &a.schema).await;
    let client = admin(&url).await;
    let used = count(
        &client,
        &format!(
            "SELECT count(*) FROM \"{}\".idem_scope_shards WHERE records > 0",
            a.schema
        ),
    )
    .await;
    assert_eq!(used, 16, "800 keys spread over all 16 shards");

    // Release half (through the other pool), complete the other half with a short retention.
    for (i, (req, _)) in results.iter().enumerate() {
        let store: &dyn Store = if i % 2 == 0 { &*b } else { &*a };
        let fenced = if i % 2 == 0 {
            store.release(&req.id, req.owner).await.unwrap()
        } else {
            let done = CompleteRequest {
                id: req.id.clone(),
                owner: req.owner,
                outcome: Outcome::Success("{}".into()),
                completed_at: T0,
                expires_at: later(T0, 60),
            };
            store.complete(done).await.unwrap()
        };
        assert_eq!(fenced, Fenced::Applied);
    }
    assert_eq!(a.stats(T0).await.unwrap().completed, 400);
    assert_counters_consistent(&url, &a.schema).await;
    assert_eq!(a.purge_expired(later(T0, 60)).await.unwrap(), 400);
    assert_counters_consistent(&url, &a.schema).await;
    let s = &a.schema;
    assert_eq!(
        count(
            &client,
            &format!("SELECT count(*) FROM \"{s}\".idem_scope_shards")
        )
        .await,
        0,
        "the empty scope's counter rows are dropped"
    );
    assert_eq!(
        count(
            &client,
            &format!("SELECT coalesce(sum(records), 0)::int8 FROM \"{s}\".idem_total_shards")
        )
        .await,
        0
    );
}

/// Near a limit, shards run out of room one by one and claims take the exact path: rounds of
/// races through two pools for the last few slots (of a scope, then of the store) admit exactly
/// as many as there is room for, never more, and never fewer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_races_near_the_limit_are_exact() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let (a, b) = two_pools(&url).await;
    let limits = RecordLimits {
        max_records_per_scope: 40,
        max_records_total: u64::MAX,
    };
    let scope = scope();
    let mut held = Vec::new();
    for i in 0..33 {
        let req = claim_req(&record_id(&scope, &format!("fill{i}")), T0, limits);
        assert_eq!(a.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
        held.push(req);
    }
    for round in 0..4 {
        let room = 40 - held.len();
        let requests: Vec<_> = (0..30)
            .map(|i| claim_req(&record_id(&scope, &format!("r{round}-{i}")), T0, limits))
            .collect();
        let results = claim_concurrently([a.clone(), b.clone()], requests, 12).await;
        let mut won = 0;
        for (req, outcome) in results {
            match outcome {
                ClaimOutcome::Claimed => {
                    won += 1;
                    held.push(req);
                }
                ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 40 }) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(won, room, "round {round}");
        assert_eq!(a.stats(T0).await.unwrap().in_progress, 40);
        assert_counters_consistent(&url, &a.schema).await;
        // Free a few slots for the next round.
        for req in held.drain(..round + 2) {
            assert_eq!(
                b.release(&req.id, req.owner).await.unwrap(),
                Fenced::Applied
            );
        }
    }

    // The store-wide limit, with claims spread over five scopes.
    let (a, b) = two_pools(&url).await;
    let limits = RecordLimits {
        max_records_per_scope: u64::MAX,
        max_records_total: 25,
    };
    let scopes: Vec<_> = (0..5).map(|_| self::scope()).collect();
    for i in 0..20 {
        let req = claim_req(&record_id(&scopes[i % 5], &format!("fill{i}")), T0, limits);
        assert_eq!(b.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    }
    let requests: Vec<_> = (0..40)
        .map(|i| claim_req(&record_id(&scopes[i % 5], &format!("race{i}")), T0, limits))
        .collect();
    let results = claim_concurrently([a.clone(), b.clone()], requests, 12).await;
    let won = results
        .iter()
        .filter(|(_, outcome)| match outcome {
            ClaimOutcome::Claimed => true,
            ClaimOutcome::QuotaExceeded(QuotaExceeded::Total { limit: 25 }) => false,
            other => panic!("unexpected {other:?}"),
        })
        .count();
    assert_eq!(won, 5);
    assert_eq!(a.stats(T0).await.unwrap().in_progress, 25);
    assert_counters_consistent(&url, &a.schema).await;
}

/// Capacities computed for one limit never let a claim with a lower limit through: a scope filled
/// to 40 under a limit of 64 refuses claims under a limit of 32 until it is down to 31 records.
/// Instances configured with different limits racing each other stay within the higher limit,
/// and reach it only if some claim under it was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lower_limit_is_never_exceeded() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let (a, b) = two_pools(&url).await;
    let with_limit = |n: u64| RecordLimits {
        max_records_per_scope: n,
        max_records_total: u64::MAX,
    };
    let scope = scope();
    let mut held = Vec::new();
    for i in 0..40 {
        let req = claim_req(&record_id(&scope, &format!("k{i}")), T0, with_limit(64));
        assert_eq!(a.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
        held.push(req);
    }
    for i in 0..16 {
        let req = claim_req(&record_id(&scope, &format!("low{i}")), T0, with_limit(32));
        assert_eq!(
            b.claim(&req).await.unwrap(),
            ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 32 })
        );
    }
    for req in held.drain(..9) {
        assert_eq!(
            a.release(&req.id, req.owner).await.unwrap(),
            Fenced::Applied
        );
    }
    let req = claim_req(&record_id(&scope, "low-fits"), T0, with_limit(32));
    assert_eq!(b.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    let req = claim_req(&record_id(&scope, "low-over"), T0, with_limit(32));
    assert_eq!(
        b.claim(&req).await.unwrap(),
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 32 })
    );
    let req = claim_req(&record_id(&scope, "high-fits"), T0, with_limit(64));
    assert_eq!(a.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    assert_counters_consistent(&url, &a.schema).await;

    // Two configurations racing on a fresh scope.
    let scope = self::scope();
    let requests: Vec<_> = (0..60)
        .map(|i| {
            let limit = if i % 2 == 0 { 30 } else { 20 };
            claim_req(
                &record_id(&scope, &format!("mixed{i}")),
                T0,
                with_limit(limit),
            )
        })
        .collect();
    let results = claim_concurrently([a.clone(), b.clone()], requests, 12).await;
    let won = results
        .iter()
        .filter(|(_, o)| *o == ClaimOutcome::Claimed)
        .count();
    let high_refused = results
        .iter()
        .any(|(_, o)| *o == ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 30 }));
    assert!(won <= 30, "{won}");
    if high_refused {
        assert_eq!(won, 30);
    }
    assert_counters_consistent(&url, &a.schema).await;
}
