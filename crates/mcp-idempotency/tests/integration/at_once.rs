//! Store operations sent at once, each from a task of its own: how the group-commit checks of the
//! PostgreSQL and Redis stores make operations wait together.

use std::sync::Arc;

use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, Store, StoreError,
};

/// Sends every claim at once; the answers in the order of `reqs`.
pub(crate) async fn claim_all<S: Store + 'static>(
    store: &Arc<S>,
    reqs: impl IntoIterator<Item = ClaimRequest>,
) -> Vec<Result<ClaimOutcome, StoreError>> {
    let tasks: Vec<_> = reqs
        .into_iter()
        .map(|req| {
            let store = Arc::clone(store);
            tokio::spawn(async move { store.claim(&req).await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("claim task"));
    }
    answers
}

/// Sends every completion at once; the answers in the order of `reqs`.
pub(crate) async fn complete_all<S: Store + 'static>(
    store: &Arc<S>,
    reqs: impl IntoIterator<Item = CompleteRequest>,
) -> Vec<Result<Fenced, StoreError>> {
    let tasks: Vec<_> = reqs
        .into_iter()
        .map(|req| {
            let store = Arc::clone(store);
            tokio::spawn(async move { store.complete(req).await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("complete task"));
    }
    answers
}
