//! The async driver of the [`Engine`] over a [`Store`]: decisions, the claim lifecycle (through
//! [`RunningClaim`]) and the store's health, in one place for every transport.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::renewals::Renewals;
use super::running_claim::RunningClaim;
use super::writes::StoreWrites;
use crate::call_span::CallSpan;
use crate::config::EngineConfig;
use crate::engine::{Claim, Decision, Engine, Step, ToolCall};
use crate::key::IdempotencyKey;
use crate::record::{FencingTokens, Outcome, Scope, TraceLink};
use crate::rejection::{Rejection, RejectionKind};
use crate::store::{Fenced, Store, StoreError};
use crate::time::{backoff, Clock, SystemClock};

/// The first pause of a duplicate waiting for a running call's outcome ([`Deduplicator::decide`]).
const WAIT_MIN_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause of a duplicate waiting for a running call's outcome.
const WAIT_MAX_PAUSE: Duration = Duration::from_millis(500);

/// How a driver stops taking keyed calls, as [`Deduplicator::begin_guarded`] reads it: the stdio
/// proxy's drain, the HTTP layer's shutdown, an embedded connection's close. The driver keeps its
/// own state; the sequence of the decision is the deduplicator's.
pub(crate) trait StopGate {
    /// The driver was stopping when the call came: the call is refused, and nothing is claimed.
    fn refuses(&self) -> bool;

    /// The stop has gone too far for a call claimed just now to be forwarded: its claim is
    /// released and the call refused.
    fn stopped(&self) -> bool;

    /// Why such a claim is released (logged).
    fn release_reason(&self) -> &'static str {
        "the gateway shut down before forwarding the call"
    }
}

/// Runs the [`Engine`]'s steps against a [`Store`], reading the clock and minting fencing tokens.
///
/// Its time and its randomness are its own, so that a test or a simulation can drive them: every
/// wait of its claims (a duplicate waiting for a running call, the renewals of leases, the
/// completions and releases sent again, the purge) is a sleep on its [`Clock`]
/// ([`with_clock`](Self::with_clock)), and the fencing tokens of its claims come from its
/// [`FencingTokens`] ([`with_tokens`](Self::with_tokens)). By default they are the system clock
/// with tokio's timer, and random tokens.
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
///     ..ToolCall::default()
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
    /// The engine, the store and the clock, and what the writes left behind.
    writes: StoreWrites,
    /// Cleared when a claim failed for lack of a store, set again by the next claim that worked.
    store_usable: Arc<AtomicBool>,
    /// The running claims whose leases the one renewing task keeps alive.
    renewals: Arc<Renewals>,
    /// Where the fencing tokens of claims come from.
    tokens: FencingTokens,
}

/// What the looks at the store for one decision found, for the call's span.
#[derive(Debug, Default)]
struct Looked {
    /// How many times a duplicate looked again while the call it found ran.
    looks: u32,
    /// The trace of the record that decided the call.
    linked: Option<TraceLink>,
    /// The key last claimed or taken over (the record the call is decided under).
    key: Option<IdempotencyKey>,
}

impl Deduplicator {
    /// A driver for an engine with `config` over `store`, on the system clock.
    pub fn new(config: EngineConfig, store: Arc<dyn Store>) -> Self {
        #[cfg(feature = "metrics")]
        crate::metrics::set_record_limits(&config.record_limits());
        Self {
            writes: StoreWrites::new(Engine::new(config), store, Arc::new(SystemClock)),
            store_usable: Arc::new(AtomicBool::new(true)),
            renewals: Arc::default(),
            tokens: FencingTokens::random(),
        }
    }

    /// Reads the time from `clock`, and waits on it, instead of the system clock (a
    /// [`ManualClock`](crate::time::ManualClock) in tests: the claims' waits then end only when
    /// the test moves it).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.writes.clock = clock;
        self
    }

    /// Draws the fencing tokens of claims from `tokens` instead of at random
    /// ([`FencingTokens::seeded`] in a simulation: the same seed, the same tokens).
    pub fn with_tokens(mut self, tokens: FencingTokens) -> Self {
        self.tokens = tokens;
        self
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.writes.clock
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
        decision.map_claim(|claim| {
            RunningClaim::start(self.writes.clone(), Arc::clone(&self.renewals), claim)
        })
    }

    /// [`begin`](Self::begin) behind a driver's stop, the one sequence every driver runs for a
    /// keyed call: a call that comes while `gate` refuses is answered `idempotency_shutting_down`
    /// (counted as that decision) and nothing is claimed; a call claimed as the stop came is
    /// released and refused the same way, so that no claim is left behind the stop's back.
    ///
    /// The decision, the store's operations and the record that decided it go to `span`, the
    /// call's ([`CallSpan`]); an executed call's completion too.
    pub(crate) async fn begin_guarded(
        &self,
        scope: &Scope,
        call: &ToolCall<'_>,
        span: &CallSpan,
        gate: &impl StopGate,
    ) -> Decision<RunningClaim> {
        // What is logged meanwhile carries the call's trace (JSON logs).
        let log_span = span.log_span();
        tracing::Instrument::instrument(self.begin_in_span(scope, call, span, gate), log_span).await
    }

    async fn begin_in_span(
        &self,
        scope: &Scope,
        call: &ToolCall<'_>,
        span: &CallSpan,
        gate: &impl StopGate,
    ) -> Decision<RunningClaim> {
        if span.is_live() {
            span.store_system(self.store().system());
        }
        let source = call.terms.source.as_str();
        let shutting_down = || Decision::Reject(Rejection::shutting_down(call.idempotency_key));
        if gate.refuses() {
            let refusal = shutting_down();
            #[cfg(feature = "metrics")]
            crate::metrics::on_decision(&refusal);
            span.decided(&refusal, source, None, None, 0);
            return refusal;
        }
        // A duplicate waiting for a running call's outcome stops waiting when the stop comes.
        let (decision, looked) = self
            .decide_while(scope, call, span, || !gate.stopped())
            .await;
        let decision = decision.map_claim(|claim| {
            RunningClaim::start(self.writes.clone(), Arc::clone(&self.renewals), claim)
                .in_span(span)
        });
        let decision = match decision {
            Decision::Execute(claim) if gate.stopped() => {
                claim.release(gate.release_reason()).await;
                shutting_down()
            }
            decision => decision,
        };
        span.decided(
            &decision,
            source,
            looked.key.as_ref(),
            looked.linked,
            looked.looks,
        );
        decision
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.writes.engine
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.writes.store
    }

    /// How many claims whose store answer was lost are waiting to be released (see the type's
    /// docs, "Lost answers").
    pub fn pending_releases(&self) -> usize {
        self.writes.pending_releases()
    }

    /// How many completions that failed are being sent again in the background (see "Lost
    /// completions").
    pub fn pending_completions(&self) -> usize {
        self.writes.pending_completions()
    }

    /// Purges the store's expired records every `every` on the clock, forever (the gateways run
    /// this beside their traffic; the first purge is at once).
    pub async fn purge_periodically(&self, every: Duration) -> std::convert::Infallible {
        let clock = self.clock();
        loop {
            let started = clock.now();
            match self.store().purge_expired(started).await {
                Ok(purged) => tracing::debug!(purged, "purged expired records"),
                Err(err) => tracing::warn!(error = %err, "cannot purge expired records"),
            }
            let spent = clock.now().saturating_since(started);
            clock.sleep(every.saturating_sub(spent)).await;
        }
    }

    /// Waits until no completion is being sent again in the background: each one was recorded,
    /// or given up (see "Lost completions"). Graceful shutdown waits for this, within its grace.
    pub async fn completions_settled(&self) {
        self.writes.completions_settled().await;
    }

    /// Decides what to do with a call, claiming its key if it is to be executed.
    ///
    /// A duplicate of a running call whose key the client did not send (a business identifier, a
    /// key argument, a window) waits for that call's outcome, up to its tool's `wait`, looking
    /// again with a backoff from 50 ms to 500 ms on the clock; past the wait it gets
    /// `idempotency_key_in_progress` as before. A client's own key is answered at once, as the
    /// SEP says.
    pub async fn decide(&self, scope: &Scope, call: &ToolCall<'_>) -> Decision {
        let (decision, _) = self
            .decide_while(scope, call, &CallSpan::none(), || true)
            .await;
        decision
    }

    /// [`decide`](Self::decide), whose duplicate waits only while `keep_waiting` holds, its
    /// store operations shown in `span`; with what the looks found.
    async fn decide_while(
        &self,
        scope: &Scope,
        call: &ToolCall<'_>,
        span: &CallSpan,
        keep_waiting: impl Fn() -> bool,
    ) -> (Decision, Looked) {
        let wait = call.terms.wait;
        let mut looked = Looked::default();
        let mut decision = self.decide_once(scope, call, span, &mut looked).await;
        if let Some(wait) = wait {
            let clock = self.clock();
            let start = clock.now();
            let mut slept = Duration::ZERO;
            let mut looks = 0;
            while matches!(&decision, Decision::Reject(r) if r.kind() == RejectionKind::KeyInProgress)
            {
                looks += 1;
                let pause = backoff(looks, WAIT_MIN_PAUSE, WAIT_MAX_PAUSE);
                // At least the pauses slept: a wall clock set back does not stretch the wait.
                let waited = clock.now().saturating_since(start).max(slept);
                if waited + pause > wait || !keep_waiting() {
                    break;
                }
                clock.sleep(pause).await;
                slept += pause;
                looked.looks = looks;
                decision = self.decide_once(scope, call, span, &mut looked).await;
            }
        }
        #[cfg(feature = "metrics")]
        crate::metrics::on_keyed_decision(&decision, call.terms.source);
        (decision, looked)
    }

    /// One look at the store: the engine's steps, each store request as it says, to a decision;
    /// each request a child span of `span`, and what decided the call in `looked`.
    async fn decide_once(
        &self,
        scope: &Scope,
        call: &ToolCall<'_>,
        span: &CallSpan,
        looked: &mut Looked,
    ) -> Decision {
        let now = self.clock().now();
        let (mut pending, mut step) = self.engine().begin(scope, *call, self.tokens.mint(), now);
        let decision = loop {
            let started = span.operation_start();
            step = match step {
                Step::Done(decision) => break decision,
                Step::ReadClientKey(req) => {
                    let answer = self.store().get(&req.id, req.now).await;
                    span.store_operation("get", started, answer.as_ref().map(|_| ()));
                    pending.on_client_key(req, answer)
                }
                Step::ReadIdentifier(req) => {
                    let answer = self.store().get(&req.id, req.now).await;
                    span.store_operation("get", started, answer.as_ref().map(|_| ()));
                    pending.on_identifier(req, answer)
                }
                Step::TryClaim(req) => {
                    let answer = self.writes.claim(&req).await;
                    span.store_operation("claim", started, answer.as_ref().map(|_| ()));
                    if span.is_live() {
                        looked.key = Some(req.id.key.clone());
                    }
                    pending.on_claim(req, answer)
                }
                Step::TakeOver(req) => {
                    let answer = self.writes.take_over(&req).await;
                    span.store_operation("take_over", started, answer.as_ref().map(|_| ()));
                    if span.is_live() {
                        looked.key = Some(req.id.key.clone());
                    }
                    pending.on_take_over(req, answer)
                }
            };
        };
        looked.linked = pending.linked();
        match &decision {
            Decision::Execute(_) | Decision::Replay(_) => {
                self.store_usable.store(true, Ordering::Relaxed);
            }
            Decision::Reject(rejection) if rejection.kind() == RejectionKind::StoreUnavailable => {
                self.store_usable.store(false, Ordering::Relaxed);
            }
            _ => {}
        }
        decision
    }

    /// Records the outcome of an executed call. [`Fenced::NotOwner`] means the lease was lost and
    /// someone else owns the record now; the outcome was not written.
    pub async fn complete(&self, claim: &Claim, outcome: Outcome) -> Result<Fenced, StoreError> {
        let req = self.engine().completion(claim, outcome, self.clock().now());
        self.writes.send_completion(&req).await
    }

    /// Extends the lease of a running call. The claim's deadline moves only if the store applied
    /// the renewal; after an error or [`Fenced::NotOwner`] it still says what the store holds.
    pub async fn renew(&self, claim: &mut Claim) -> Result<Fenced, StoreError> {
        self.writes.renew(claim).await
    }

    /// Gives up a claim whose call certainly did not run, so that a retry may run it. If the store
    /// cannot be reached, the claim is remembered and released once it can (see "Lost answers").
    pub async fn release(&self, claim: &Claim) -> Result<Fenced, StoreError> {
        self.writes.release(claim).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    /// A stop that is where the test says.
    struct Gate {
        refuses: bool,
        stopped: bool,
    }

    impl StopGate for Gate {
        fn refuses(&self) -> bool {
            self.refuses
        }

        fn stopped(&self) -> bool {
            self.stopped
        }
    }

    const OPEN: Gate = Gate {
        refuses: false,
        stopped: false,
    };

    fn run<T>(test: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(test)
    }

    fn is_shutting_down(decision: &Decision<RunningClaim>) -> bool {
        matches!(decision, Decision::Reject(r) if r.kind() == RejectionKind::ShuttingDown)
    }

    #[test]
    fn a_stop_during_the_claim_releases_it_and_refuses_the_call() {
        run(async {
            let dedup = Deduplicator::new(EngineConfig::default(), Arc::new(MemoryStore::new()));
            let scope = Scope::new("test", "alice");
            let key = serde_json::json!("k-1");
            let call = ToolCall {
                tool_name: "charge",
                arguments: Some(r#"{"amount":1}"#),
                idempotency_key: Some(&key),
                mrtr_continuation: false,
                ..Default::default()
            };
            let stopped = Gate {
                refuses: false,
                stopped: true,
            };
            let decision = dedup
                .begin_guarded(&scope, &call, &CallSpan::none(), &stopped)
                .await;
            assert!(is_shutting_down(&decision), "{decision:?}");
            // The key was released: the retry runs the call, as if the first never came.
            let Decision::Execute(claim) = dedup
                .begin_guarded(&scope, &call, &CallSpan::none(), &OPEN)
                .await
            else {
                panic!("the key was left claimed")
            };
            claim.release("the test ends").await;
        });
    }

    #[test]
    fn a_call_that_comes_while_stopping_is_refused_unclaimed_and_counted() {
        let refused = || {
            run(async {
                let dedup =
                    Deduplicator::new(EngineConfig::default(), Arc::new(MemoryStore::new()));
                let scope = Scope::new("test", "alice");
                let key = serde_json::json!("k-1");
                let call = ToolCall {
                    tool_name: "charge",
                    arguments: None,
                    idempotency_key: Some(&key),
                    mrtr_continuation: false,
                    ..Default::default()
                };
                let refusing = Gate {
                    refuses: true,
                    stopped: true,
                };
                let decision = dedup
                    .begin_guarded(&scope, &call, &CallSpan::none(), &refusing)
                    .await;
                assert!(is_shutting_down(&decision), "{decision:?}");
                let Decision::Reject(rejection) = decision else {
                    unreachable!()
                };
                assert_eq!(rejection.key(), Some("k-1"));
                let now = dedup.clock().now();
                let id = crate::record::RecordId {
                    scope,
                    key: crate::key::IdempotencyKey::new("k-1", 255).expect("a valid key"),
                };
                let record = dedup
                    .store()
                    .get(&id, now)
                    .await
                    .expect("the store answers");
                assert!(record.is_none(), "nothing was claimed: {record:?}");
            })
        };
        #[cfg(not(feature = "metrics"))]
        refused();
        #[cfg(feature = "metrics")]
        {
            let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
            let metrics = recorder.handle();
            metrics::with_local_recorder(&recorder, refused);
            let text = metrics.render();
            assert!(
                text.contains(r#"mcp_idem_rejections_total{type="idempotency_shutting_down"} 1"#),
                "{text}"
            );
        }
    }
}
