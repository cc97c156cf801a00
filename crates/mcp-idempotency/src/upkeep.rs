//! What a gateway does besides deciding calls, the same under `mcp-idem wrap` and `proxy` and in
//! the bindings: purging expired records while it runs, and waiting, before it exits, for the
//! outcomes the store failed to take at first and that are still being sent again.

use std::time::Duration;

use crate::Deduplicator;

/// How often expired records are purged.
pub const PURGE_EVERY: Duration = Duration::from_secs(600);

/// Purges `dedup`'s expired records every [`PURGE_EVERY`], forever.
pub async fn purge_periodically(dedup: Deduplicator) -> std::convert::Infallible {
    dedup.purge_periodically(PURGE_EVERY).await
}

/// Waits up to `grace` for the completions `dedup` still sends again in the background because
/// the store failed them (call it before the process exits); returns how many are still pending.
/// Those are logged: their records stay in progress until their leases run out.
pub async fn settle_completions(dedup: &Deduplicator, grace: Duration) -> usize {
    let pending = dedup.pending_completions();
    if pending == 0 {
        return 0;
    }
    tracing::info!(
        pending,
        left_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
        "waiting for the outcomes the store has not taken yet"
    );
    if tokio::time::timeout(grace, dedup.completions_settled())
        .await
        .is_err()
    {
        tracing::error!(
            pending = dedup.pending_completions(),
            "the shutdown grace ended before the store took these outcomes: their records stay \
             in progress until their leases run out (then the after-crash policy answers them)"
        );
    }
    dedup.pending_completions()
}
