//! The async driver of the [`Engine`] over a [`Store`]: decisions, the claim lifecycle (through
//! [`RunningClaim`]) and the store's health, in one place for every transport.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::ambiguous::{AfterClaim, Ambiguous, AmbiguousClaims, Remembered, MAX_AMBIGUOUS_CLAIMS};
use super::completion::MAX_PENDING_COMPLETIONS;
use super::renewals::Renewals;
use super::running_claim::RunningClaim;
use crate::engine::{Claim, Decision, Engine, Step, ToolCall};
use crate::record::{FencingToken, Outcome, RecordId, Scope};
use crate::rejection::RejectionKind;
use crate::store::{ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, Store, StoreError};
use crate::time::{Clock, SystemClock};

/// Shortest sleep of the release task (a deadline already passed, or a clock that stands still).
const MIN_RELEASE_WAIT: Duration = Duration::from_millis(10);

/// Runs the [`Engine`]'s steps against a [`Store`], reading the clock and minting fencing tokens.
///
/// This is the piece every transport adapter shares: hand it a call ([`begin`](Self::begin)), act
/// on the [`Decision`], and finish the [`RunningClaim`] of an executed call with its outcome. The
/// claim renews its own lease while the call runs. The deduplicator also knows whether the store
/// is usable ([`store_usable`](Self::store_usable)), from the answers of its last claims.
///
/// [`decide`](Self::decide), [`complete`](Self::complete), [`renew`](Self::renew) and
/// [`release`](Self::release) are the same steps one by one, for callers that manage a claim's
/// lease themselves.
///
/// # Lost answers
///
/// A claim that fails after it was sent (a timeout, a connection reset) may have been applied
/// although the call is refused with `idempotency_store_unavailable` and never runs. The
/// deduplicator remembers such a claim, and releases it, fenced by its token, as soon as the
/// store answers again: when a retry's claim finds the record held by that token (it is released
/// and the retry claims again, so the retry runs the call), or from a background task on the
/// tokio runtime, which tries once the store answers any claim, and otherwise with a backoff from
/// 100 ms to 5 s. A release that fails is remembered the same way. At most 1024 claims are
/// remembered per deduplicator (clones share them); each one is logged.
///
/// # Lost completions
///
/// A [`RunningClaim`] whose completion fails with an error that may pass (the store went away
/// while the call ran) sends it again in the background, fenced by its token, with the same
/// backoff, while it keeps renewing the lease, until the store applies it, the record is taken
/// over, or the retention window the outcome would have had ends. At most 1024 completions are
/// retried at once per deduplicator ([`pending_completions`](Self::pending_completions));
/// [`completions_settled`](Self::completions_settled) waits for them (graceful shutdown).
///
/// ```
/// # tokio_test_block_on(async {
/// use std::sync::Arc;
/// use mcp_idempotency::{Decision, Deduplicator, EngineConfig, Outcome, Scope, ToolCall};
/// use mcp_idempotency::store::MemoryStore;
///
/// let dedup = Deduplicator::new(EngineConfig::default(), Arc::new(MemoryStore::new()));
/// let scope = Scope::new("payments-server", "local-user");
/// let key = serde_json::json!("order-42");
/// let call = ToolCall {
///     tool_name: "charge_payment",
///     arguments: Some(r#"{"amount": 4200, "currency": "usd"}"#),
///     idempotency_key: Some(&key),
///     mrtr_continuation: false,
/// };
///
/// let Decision::Execute(claim) = dedup.decide(&scope, &call).await else { panic!() };
/// // ... run the tool, then record what it returned:
/// dedup.complete(&claim, Outcome::Success(r#"{"content":[]}"#.into())).await?;
///
/// // A retry with the same key and equivalent arguments replays the outcome.
/// let retry = ToolCall { arguments: Some(r#"{"currency":"usd","amount":4200.0}"#), ..call };
/// assert!(matches!(dedup.decide(&scope, &retry).await, Decision::Replay(_)));
/// # Ok::<(), mcp_idempotency::store::StoreError>(())
/// # }).unwrap();
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Deduplicator {
    engine: Engine,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// Cleared when a claim failed for lack of a store, set again by the next claim that worked.
    store_usable: Arc<AtomicBool>,
    /// Claims whose answer was lost, to be released.
    ambiguous: Arc<Pending>,
    /// Completions being retried by their running claims.
    completions: Arc<Completions>,
    /// The running claims whose leases the one renewing task keeps alive.
    renewals: Arc<Renewals>,
}

/// The completions being retried in the background (see "Lost completions").
#[derive(Debug)]
struct Completions {
    /// How many; a slot is taken with [`Deduplicator::reserve_completion`].
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
pub(crate) struct CompletionSlot(Arc<Completions>);

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

impl Deduplicator {
    /// A driver for an engine with `config` over `store`, on the system clock.
    pub fn new(config: crate::EngineConfig, store: Arc<dyn Store>) -> Self {
        Self {
            engine: Engine::new(config),
            store,
            clock: Arc::new(SystemClock),
            store_usable: Arc::new(AtomicBool::new(true)),
            ambiguous: Arc::default(),
            completions: Arc::default(),
            renewals: Arc::default(),
        }
    }

    /// The running claims whose leases are renewed.
    pub(crate) fn renewals(&self) -> &Renewals {
        &self.renewals
    }

    /// Reads the time from `clock` instead of the system clock (a [`ManualClock`](crate::ManualClock)
    /// in tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Whether the store answered the last claim (or no claim failed yet). Transports advertise
    /// `tools.idempotency` only while it does.
    pub fn store_usable(&self) -> bool {
        self.store_usable.load(Ordering::Relaxed)
    }

    /// Decides what to do with a call, claiming its key if it is to be executed; an executed
    /// call's [`RunningClaim`] renews its lease until it is finished, released or abandoned.
    pub async fn begin(&self, scope: &Scope, call: &ToolCall<'_>) -> Decision<RunningClaim> {
        let decision = self.decide(scope, call).await;
        decision.map_claim(|claim| RunningClaim::start(self.clone(), claim))
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// How many claims whose store answer was lost are waiting to be released (see the type's
    /// docs, "Lost answers").
    pub fn pending_releases(&self) -> usize {
        if !self.ambiguous.any() {
            return 0;
        }
        self.ambiguous.lock().claims.len()
    }

    /// How many completions that failed are being sent again in the background (see "Lost
    /// completions").
    pub fn pending_completions(&self) -> usize {
        *self.completions.pending.borrow()
    }

    /// Purges the store's expired records every `every`, forever (the gateways run this beside
    /// their traffic; the first purge is at once).
    pub async fn purge_periodically(&self, every: Duration) -> std::convert::Infallible {
        let mut ticks = tokio::time::interval(every);
        loop {
            ticks.tick().await;
            match self.store.purge_expired(self.clock.now()).await {
                Ok(purged) => tracing::debug!(purged, "purged expired records"),
                Err(err) => tracing::warn!(error = %err, "cannot purge expired records"),
            }
        }
    }

    /// Waits until no completion is being sent again in the background: each one was recorded,
    /// or given up (see "Lost completions"). Graceful shutdown waits for this, within its grace.
    pub async fn completions_settled(&self) {
        let mut pending = self.completions.pending.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = pending.wait_for(|n| *n == 0).await;
    }

    /// Takes a slot for a completion to be retried in the background; `None` if
    /// [`MAX_PENDING_COMPLETIONS`] are retried already.
    pub(crate) fn reserve_completion(&self) -> Option<CompletionSlot> {
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
    pub(crate) async fn store_answered_again(&self) {
        self.completions.wake.notified().await;
    }

    /// Decides what to do with a call, claiming its key if it is to be executed.
    pub async fn decide(&self, scope: &Scope, call: &ToolCall<'_>) -> Decision {
        let mut step = self
            .engine
            .begin(scope, call, FencingToken::random(), self.clock.now());
        let decision = loop {
            step = match step {
                Step::Done(decision) => break decision,
                Step::TryClaim(req) => {
                    let answer = self.claim(&req).await;
                    self.engine.on_claim(req, answer)
                }
                Step::TakeOver(req) => {
                    let answer = self.store.take_over(&req).await;
                    match &answer {
                        Ok(_) => self.store_answered(),
                        Err(error) => self.remember(&req.id, req.new_owner, error, "take-over"),
                    }
                    self.engine.on_take_over(req, answer)
                }
            };
        };
        match &decision {
            Decision::Execute(_) | Decision::Replay(_) => {
                self.store_usable.store(true, Ordering::Relaxed);
            }
            Decision::Reject(rejection) if rejection.kind() == RejectionKind::StoreUnavailable => {
                self.store_usable.store(false, Ordering::Relaxed);
            }
            _ => {}
        }
        #[cfg(feature = "metrics")]
        crate::metrics::on_decision(&decision);
        decision
    }

    /// Records the outcome of an executed call. [`Fenced::NotOwner`] means the lease was lost and
    /// someone else owns the record now; the outcome was not written.
    pub async fn complete(&self, claim: &Claim, outcome: Outcome) -> Result<Fenced, StoreError> {
        let req = self.engine.completion(claim, outcome, self.clock.now());
        self.send_completion(&req).await
    }

    /// Sends a completion made by [`Engine::completion`] (again, if it failed: the store applies
    /// a request sent twice once).
    pub(crate) async fn send_completion(
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
    /// the renewal; after an error or [`Fenced::NotOwner`] it still says what the store holds.
    pub async fn renew(&self, claim: &mut Claim) -> Result<Fenced, StoreError> {
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

    /// Gives up a claim whose call certainly did not run, so that a retry may run it. If the store
    /// cannot be reached, the claim is remembered and released once it can (see "Lost answers").
    pub async fn release(&self, claim: &Claim) -> Result<Fenced, StoreError> {
        let result = self.store.release(claim.id(), claim.owner()).await;
        if let Err(error) = &result {
            self.remember(claim.id(), claim.owner(), error, "release");
        }
        result
    }

    /// Sends a claim to the store, first getting rid of a claim of the same key whose answer was
    /// lost, if the store's answer shows that it holds the record.
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
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
async fn release_until_done(dedup: Deduplicator) {
    let mut expired = Vec::new();
    loop {
        let now = dedup.clock.now();
        let next = dedup.ambiguous.update(|pending| {
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
                dedup
                    .release_ambiguous(&claim.id, claim.owner, "the release task")
                    .await;
            }
            Err(None) => return,
            Err(Some(deadline)) => {
                let wait = deadline.saturating_since(now).max(MIN_RELEASE_WAIT);
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = dedup.ambiguous.wake.notified() => {}
                }
            }
        }
    }
}
