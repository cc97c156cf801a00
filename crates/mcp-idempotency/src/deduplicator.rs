//! The async driver of the [`Engine`] over a [`Store`]: decisions, the claim lifecycle (through
//! [`RunningClaim`]) and the store's health, in one place for every transport.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::engine::{Claim, Decision, Engine, Step, ToolCall};
use crate::record::{FencingToken, Outcome, Scope};
use crate::rejection::RejectionKind;
use crate::running_claim::RunningClaim;
use crate::store::{Fenced, Store, StoreError};
use crate::time::{Clock, SystemClock};

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
}

impl Deduplicator {
    /// A driver for an engine with `config` over `store`, on the system clock.
    pub fn new(config: crate::EngineConfig, store: Arc<dyn Store>) -> Self {
        Self {
            engine: Engine::new(config),
            store,
            clock: Arc::new(SystemClock),
            store_usable: Arc::new(AtomicBool::new(true)),
        }
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

    /// Decides what to do with a call, claiming its key if it is to be executed.
    pub async fn decide(&self, scope: &Scope, call: &ToolCall<'_>) -> Decision {
        let mut step = self
            .engine
            .begin(scope, call, FencingToken::random(), self.clock.now());
        let decision = loop {
            step = match step {
                Step::Done(decision) => break decision,
                Step::TryClaim(req) => {
                    let answer = self.store.claim(&req).await;
                    self.engine.on_claim(req, answer)
                }
                Step::TakeOver(req) => {
                    let answer = self.store.take_over(&req).await;
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
        #[cfg(feature = "metrics")]
        let kind = req.outcome.kind();
        let fenced = self.store.complete(req).await?;
        #[cfg(feature = "metrics")]
        if fenced == Fenced::Applied {
            crate::metrics::on_outcome_recorded(kind);
        }
        if fenced == Fenced::NotOwner {
            tracing::warn!(key = %claim.id().key, "outcome not recorded: the claim was taken over");
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
        if fenced == Fenced::Applied {
            *claim = renewed;
        }
        Ok(fenced)
    }

    /// Gives up a claim whose call certainly did not run, so that a retry may run it.
    pub async fn release(&self, claim: &Claim) -> Result<Fenced, StoreError> {
        self.store.release(claim.id(), claim.owner()).await
    }
}
