//! Scenarios on every store: 64 concurrent copies of one call, of a take-over, and of retries of a
//! dead call under `reject`.

use super::*;

const RACERS: usize = 64;

/// Runs `n` concurrent `decide`s of the same call, released together by a barrier.
async fn race(
    d: &Deduplicator,
    scope: &Scope,
    args: &'static str,
    key: &str,
    n: usize,
) -> Vec<Decision> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (d, scope, barrier, key) =
                (d.clone(), scope.clone(), barrier.clone(), key.to_owned());
            tokio::spawn(async move {
                barrier.wait().await;
                decide(&d, &scope, TOOL, args, &key).await
            })
        })
        .collect();
    let mut decisions = Vec::with_capacity(n);
    for task in tasks {
        decisions.push(task.await.expect("racer panicked"));
    }
    decisions
}

/// 64 concurrent identical calls: exactly one executes, the rest are told it is in progress; after
/// completion 64 concurrent retries all replay the same bytes.
async fn racing_same_key_executes_once(store: Arc<dyn Store>) {
    let d = dedup(&store, EngineConfig::default());
    let decisions = race(&d, &scope(), ARGS, "hot-key", RACERS).await;
    let mut claims = Vec::new();
    for decision in decisions {
        match decision {
            Decision::Execute(claim) => claims.push(claim),
            other => {
                reject(other, RejectionKind::KeyInProgress);
            }
        }
    }
    assert_eq!(claims.len(), 1, "exactly one racer may execute");
    let stats = stats(&store).await;
    assert_eq!((stats.in_progress, stats.completed), (1, 0));

    d.complete(&claims[0], Outcome::Success(RESULT.into()))
        .await
        .unwrap();
    let decisions = race(&d, &scope(), ARGS, "hot-key", RACERS).await;
    assert_eq!(decisions.len(), RACERS);
    for decision in decisions {
        assert_eq!(replay(decision), Replay::Result(RESULT.into()));
    }
    // Racing with other arguments: every one conflicts, none executes.
    for decision in race(&d, &scope(), OTHER_ARGS, "hot-key", RACERS).await {
        reject(decision, RejectionKind::KeyConflict);
    }
}

/// 64 concurrent retries of a call whose owner died, under `reexecute`: exactly one takes over.
async fn racing_take_over_executes_once(store: Arc<dyn Store>) {
    let dead = claim_dead(&store, &scope(), "dead-key").await;
    let d = dedup(
        &store,
        EngineConfig::default().with_after_crash(AfterCrash::Reexecute),
    );
    let mut claims = Vec::new();
    for decision in race(&d, &scope(), ARGS, "dead-key", RACERS).await {
        match decision {
            Decision::Execute(claim) => claims.push(claim),
            other => {
                reject(other, RejectionKind::KeyInProgress);
            }
        }
    }
    assert_eq!(claims.len(), 1, "exactly one racer may take over");
    assert_ne!(claims[0].owner(), dead);
    assert!(matches!(
        record(&store, &scope(), "dead-key").await.unwrap().state,
        RecordState::InProgress { owner, .. } if owner == claims[0].owner()
    ));
}

/// Under `reject`, 64 concurrent retries of a dead call are all refused as unknown.
async fn racing_dead_lease_rejects_all(store: Arc<dyn Store>) {
    claim_dead(&store, &scope(), "dead-key").await;
    let d = dedup(&store, EngineConfig::default());
    for decision in race(&d, &scope(), ARGS, "dead-key", RACERS).await {
        reject(decision, RejectionKind::OutcomeUnknown);
    }
}

on_every_store!(
    racing_same_key_executes_once,
    racing_take_over_executes_once,
    racing_dead_lease_rejects_all,
);
