//! [`StoreWrites`]: a deduplicator's writes to its store (claim, take-over, completion, renewal,
//! release), each with what follows from the store's answer: a claim whose answer was lost is
//! remembered and released once the store answers again, and completions retried in the
//! background are woken. The deduplicator, the running claims and the renewing task all write
//! through it; it knows none of them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::ambiguous::{AfterClaim, Ambiguous, AmbiguousClaims, Remembered, MAX_AMBIGUOUS_CLAIMS};
use super::completion::MAX_PENDING_COMPLETIONS;
use crate::engine::{Claim, Engine};
use crate::record::{FencingToken, RecordId};
use crate::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, Store, StoreError, TakeOverRequest,
};
use crate::time::Clock;

/// Shortest sleep of the release task (a deadline already passed, or a clock that stands still).
const MIN_RELEASE_WAIT: Duration = Duration::from_millis(10);

/// The engine, the store and the clock of a deduplicator, and what its writes left behind:
/// claims whose answer was lost (see "Lost answers" on `Deduplicator`) and completions being
/// retried ("Lost completions"). A cheap clone; clones share all of it.
#[derive(Clone, Debug)]
pub(super) struct StoreWrites {
    pub(super) engine: Engine,
    pub(super) store: Arc<dyn Store>,
    pub(super) clock: Arc<dyn Clock>,
    /// Claims whose answer was lost, to be released.
    ambiguous: Arc<Pending>,
    /// Completions being retried by their running claims.
    completions: Arc<Completions>,
}

/// The completions being retried in the background (see "Lost completions").
#[derive(Debug)]
struct Completions {
    /// How many; a slot is taken with [`StoreWrites::reserve_completion`].
    pending: tokio::sync::watch::Sender<usize>,
    /// Wakes the retries when the store answered something else.
    wake: tokio::sync::Notify,
}

impl Default for Completions {
    fn default() -> Self {
        Self {
            pending: tokio::sync::watch::channel(0).0,
            wake: tokio::sync::Notify::new(),
        }
    }
}

/// One of the [`MAX_PENDING_COMPLETIONS`] slots of completions retried in the background, given
/// back when dropped.
#[derive(Debug)]
pub(super) struct CompletionSlot(Arc<Completions>);

impl Drop for CompletionSlot {
    fn drop(&mut self) {
        self.0.pending.send_modify(|n| *n = n.saturating_sub(1));
        #[cfg(feature = "metrics")]
        crate::metrics::set_pending_completions(*self.0.pending.borrow());
    }
}

/// The ambiguous claims and the task that releases them.
#[derive(Debug, Default)]
struct Pending {
    state: Mutex<PendingState>,
    /// Whether any claim is remembered, so that claims skip the lock while none is (the common
    /// case). Updated under the lock.
    any: AtomicBool,
    /// Wakes the release task when the store answered a claim.
    wake: tokio::sync::Notify,
}

#[derive(Debug)]
struct PendingState {
    claims: AmbiguousClaims,
    /// Whether a release task runs; set and cleared under the lock, with `claims`.
    releasing: bool,
}

impl Default for PendingState {
    fn default() -> Self {
        Self {
            claims: AmbiguousClaims::new(MAX_AMBIGUOUS_CLAIMS),
            releasing: false,
        }
    }
}

impl Pending {
    fn lock(&self) -> MutexGuard<'_, PendingState> {
        // Every update is a single call on `AmbiguousClaims`; a panic cannot leave it half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `update` on the state under the lock, then publishes how many claims are remembered.
    fn update<T>(&self, update: impl FnOnce(&mut PendingState) -> T) -> T {
        let mut state = self.lock();
        let before = state.claims.len();
        let result = update(&mut state);
        let after = state.claims.len();
        self.any
            .store(state.claims.is_watching(), Ordering::Relaxed);
        drop(state);
        if before != after {
            #[cfg(feature = "metrics")]
            crate::metrics::set_ambiguous_pending(after);
        }
        result
    }

    fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }
}

impl StoreWrites {
    /// Writes to `store` with `engine`'s requests, on `clock`, with nothing left behind yet.
    pub(super) fn new(engine: Engine, store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Self {
        Self {
            engine,
            store,
            clock,
            ambiguous: Arc::default(),
            completions: Arc::default(),
        }
    }

    /// How many claims whose store answer was lost are waiting to be released.
    pub(super) fn pending_releases(&self) -> usize {
        if !self.ambiguous.any() {
            return 0;
        }
        self.ambiguous.lock().claims.len()
    }

    /// How many completions that failed are being sent again in the background.
    pub(super) fn pending_completions(&self) -> usize {
        *self.completions.pending.borrow()
    }

    /// Waits until no completion is being sent again in the background.
    pub(super) async fn completions_settled(&self) {
        let mut pending = self.completions.pending.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = pending.wait_for(|n| *n == 0).await;
    }

    /// Takes a slot for a completion to be retried in the background; `None` if
    /// [`MAX_PENDING_COMPLETIONS`] are retried already.
    pub(super) fn reserve_completion(&self) -> Option<CompletionSlot> {
        let taken = self.completions.pending.send_if_modified(|n| {
            let free = *n < MAX_PENDING_COMPLETIONS;
            if free {
                *n += 1;
            }
            free
        });
        #[cfg(feature = "metrics")]
        if taken {
            crate::metrics::set_pending_completions(self.pending_completions());
        }
        taken.then(|| CompletionSlot(Arc::clone(&self.completions)))
    }

    /// Waits until the store answered something else (a claim, a renewal, a completion) while
    /// completions are retried.
    pub(super) async fn store_answered_again(&self) {
        self.completions.wake.notified().await;
    }

    /// Sends a take-over; a failure that may have been applied is remembered.
    pub(super) async fn take_over(&self, req: &TakeOverRequest) -> Result<Fenced, StoreError> {
        let answer = self.store.take_over(req).await;
        match &answer {
            Ok(_) => self.store_answered(),
            Err(error) => self.remember(&req.id, req.new_owner, error, "take-over"),
        }
        answer
    }

    /// Sends a completion made by [`Engine::completion`] (again, if it failed: the store applies
    /// a request sent twice once).
    pub(super) async fn send_completion(
        &self,
        req: &CompleteRequest,
    ) -> Result<Fenced, StoreError> {
        let fenced = self.store.complete(req.clone()).await?;
        self.store_answered();
        #[cfg(feature = "metrics")]
        if fenced == Fenced::Applied {
            crate::metrics::on_outcome_recorded(req.outcome.kind());
        }
        if fenced == Fenced::NotOwner {
            tracing::warn!(key = %req.id.key, "outcome not recorded: the claim was taken over");
        }
        Ok(fenced)
    }

    /// Extends the lease of a running call. The claim's deadline moves only if the store applied
    /// the renewal.
    pub(super) async fn renew(&self, claim: &mut Claim) -> Result<Fenced, StoreError> {
        let mut renewed = claim.clone();
        let lease_expires_at = self.engine.renew(&mut renewed, self.clock.now());
        let fenced = self
            .store
            .renew(renewed.id(), renewed.owner(), lease_expires_at)
            .await?;
        self.store_answered();
        if fenced == Fenced::Applied {
            *claim = renewed;
        }
        Ok(fenced)
    }

    /// Gives up a claim; if the store cannot be reached, the claim is remembered and released once
    /// it can.
    pub(super) async fn release(&self, claim: &Claim) -> Result<Fenced, StoreError> {
        let result = self.store.release(claim.id(), claim.owner()).await;
        if let Err(error) = &result {
            self.remember(claim.id(), claim.owner(), error, "release");
        }
        result
    }

    /// Sends a claim to the store, first getting rid of a claim of the same key whose answer was
    /// lost, if the store's answer shows that it holds the record.
    pub(super) async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let mut answer = self.store.claim(req).await;
        if self.ambiguous.any() {
            let now = self.clock.now();
            let after = self
                .ambiguous
                .update(|pending| pending.claims.on_claim_answer(&req.id, &answer, now));
            match after {
                AfterClaim::Nothing => {}
                AfterClaim::Forgotten(n) => {
                    tracing::debug!(key = %req.id.key, n, "claims whose answer was lost had not been applied");
                    count_resolved("absent", n);
                }
                AfterClaim::Release(owner) => {
                    // The retry of a call that never ran: free the key, fenced, and claim again.
                    if self.release_ambiguous(&req.id, owner, "a retry").await {
                        answer = self.store.claim(req).await;
                    }
                }
                AfterClaim::ClaimAgain => {
                    tracing::debug!(key = %req.id.key, "the key was released after the store read the claim; claiming again");
                    answer = self.store.claim(req).await;
                }
            }
        }
        match &answer {
            Ok(_) => self.store_answered(),
            Err(error) => self.remember(&req.id, req.owner, error, "claim"),
        }
        answer
    }

    /// Releases `owner`'s lost claim of `id`; whether the store answered.
    async fn release_ambiguous(&self, id: &RecordId, owner: FencingToken, by: &str) -> bool {
        #[cfg(feature = "simulation")]
        let answer = if crate::simulation::is_on(crate::simulation::Mutant::SettleNeverReleases) {
            Ok(Fenced::Applied)
        } else {
            self.store.release(id, owner).await
        };
        #[cfg(not(feature = "simulation"))]
        let answer = self.store.release(id, owner).await;
        let now = self.clock.now();
        match answer {
            Ok(fenced) => {
                self.ambiguous
                    .update(|pending| pending.claims.on_released(id, owner, now));
                if fenced == Fenced::Applied {
                    tracing::info!(key = %id.key, by, "released a claim whose answer was lost; its call never ran");
                    count_resolved("released", 1);
                } else {
                    tracing::debug!(key = %id.key, by, "a claim whose answer was lost holds nothing");
                    count_resolved("absent", 1);
                }
                true
            }
            Err(error) => {
                self.ambiguous
                    .update(|pending| pending.claims.on_release_failed(now));
                tracing::debug!(key = %id.key, %error, by, "cannot release a claim whose answer was lost yet");
                false
            }
        }
    }

    /// Remembers a claim (or take-over, or failed release) of `id` under `owner` that failed with
    /// `error` and may hold the record, and starts the release task if it is not running.
    fn remember(&self, id: &RecordId, owner: FencingToken, error: &StoreError, what: &str) {
        if !error.may_have_applied() {
            return;
        }
        let config = self.engine.config();
        let now = self.clock.now();
        let claim = Ambiguous {
            id: id.clone(),
            owner,
            give_up_at: now.saturating_add(config.retention.max(config.lease)),
        };
        let runtime = tokio::runtime::Handle::try_current().ok();
        let (remembered, start) = self.ambiguous.update(|pending| {
            let remembered = pending.claims.remember(claim, now);
            let start = remembered == Remembered::Queued && !pending.releasing && runtime.is_some();
            pending.releasing |= start;
            (remembered, start)
        });
        match remembered {
            Remembered::Queued => tracing::warn!(
                key = %id.key, what, %error,
                "the store may have applied this without answering; if it holds the key, the key \
                 will be released once the store answers"
            ),
            Remembered::Full => tracing::error!(
                key = %id.key, what, %error,
                "the store may have applied this without answering, and too many such claims wait \
                 for release: if it holds the key, the key stays held until its lease runs out"
            ),
        }
        #[cfg(feature = "metrics")]
        crate::metrics::on_ambiguous(remembered == Remembered::Queued);
        if let (true, Some(runtime)) = (start, runtime) {
            runtime.spawn(release_until_done(self.clone()));
        }
    }

    /// The store answered: releases and completions that were backing off are due at once.
    fn store_answered(&self) {
        if self.pending_completions() > 0 {
            self.completions.wake.notify_waiters();
        }
        if !self.ambiguous.any() {
            return;
        }
        let now = self.clock.now();
        self.ambiguous
            .update(|pending| pending.claims.store_answered(now));
        self.ambiguous.wake.notify_one();
    }
}

/// Counts claims whose answer was lost and that were resolved `how` (a metric label).
fn count_resolved(how: &'static str, n: usize) {
    #[cfg(feature = "metrics")]
    crate::metrics::on_ambiguous_resolved(how, n);
    #[cfg(not(feature = "metrics"))]
    let _ = (how, n);
}

/// The release task: releases the remembered claims one by one as they fall due, until none is
/// left.
async fn release_until_done(writes: StoreWrites) {
    let mut expired = Vec::new();
    loop {
        let now = writes.clock.now();
        let next = writes.ambiguous.update(|pending| {
            let next = pending.claims.poll_release(now, &mut expired);
            let deadline = pending.claims.next_deadline();
            if next.is_none() && deadline.is_none() {
                pending.releasing = false;
            }
            next.ok_or(deadline)
        });
        for claim in expired.drain(..) {
            tracing::warn!(
                key = %claim.id.key,
                "gave up releasing a claim whose answer was lost: its retention window ended"
            );
            count_resolved("expired", 1);
        }
        match next {
            Ok(claim) => {
                writes
                    .release_ambiguous(&claim.id, claim.owner, "the release task")
                    .await;
            }
            Err(None) => return,
            Err(Some(deadline)) => {
                let wait = deadline.saturating_since(now).max(MIN_RELEASE_WAIT);
                // Biased, as every select of the claims: no step depends on tokio's random choice.
                tokio::select! {
                    biased;
                    () = writes.ambiguous.wake.notified() => {}
                    () = writes.clock.sleep(wait) => {}
                }
            }
        }
    }
}
