//! The sans-IO decision engine.
//!
//! The engine decides what happens to a `tools/call`; it never touches a socket, a clock or a store.
//! The caller feeds it the request and the store's answers, and it says what to do next: one
//! call's decision is a [`PendingDecision`], whose [`Step`]s name each store request in turn (see
//! `pending.rs` for the sequence).
//!
//! [`Deduplicator`](crate::Deduplicator) is the ready-made async driver of this loop.

mod decision;
mod pending;

pub(crate) use decision::Companion;
pub use decision::{BypassReason, Claim, Decision, Replay, Step, ToolCall};
pub use pending::{PendingDecision, REPLAYED_META};

use std::time::Duration;

use serde_json::Value;

use crate::config::{AfterCrash, EngineConfig};
use crate::fingerprint::{fingerprint, ArgumentsError};
use crate::key::IdempotencyKey;
use crate::policy::KeyMaterial;
use crate::protocol::IDEMPOTENCY_KEY;
use crate::record::{FencingToken, Outcome, Record, RecordId, RecordState, Scope};
use crate::rejection::{Rejection, RejectionKind};
use crate::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, QuotaExceeded, StoreError, TakeOverRequest,
};
use crate::time::Timestamp;

/// The SEP-3182 decision logic. Cheap to clone; holds only its configuration.
#[derive(Clone, Debug, Default)]
pub struct Engine {
    config: EngineConfig,
}

impl Engine {
    /// An engine with the given settings.
    pub fn new(config: EngineConfig) -> Self {
        Self { config }
    }

    /// The engine's settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The claim of `call`'s key: its key validated, its arguments fingerprinted; or the decision
    /// when there is nothing to claim (an MRTR continuation, no key) or the call is refused.
    fn claim_request(
        &self,
        scope: &Scope,
        call: &ToolCall<'_>,
        owner: FencingToken,
        now: Timestamp,
    ) -> Result<ClaimRequest, Decision> {
        if call.mrtr_continuation {
            return Err(Decision::Bypass(BypassReason::MrtrContinuation));
        }
        let terms = call.terms;
        let source = terms.source;
        let material = source.material();
        let raw_key = match call.idempotency_key {
            Some(raw_key) => raw_key,
            None if material == KeyMaterial::Fingerprint => &Value::Null,
            None => return Err(Decision::Bypass(BypassReason::NoKey)),
        };
        let max_key = self.config.max_key_bytes;
        let value = match (material, raw_key) {
            (KeyMaterial::ClientString, _) => match IdempotencyKey::from_json(raw_key, max_key) {
                Ok(key) => key.as_str().to_owned(),
                Err(err) => {
                    let mut message = err.to_string();
                    if let Some(name) = &terms.shown_as {
                        message = message.replacen(IDEMPOTENCY_KEY, name, 1);
                    }
                    let mut rejection = Rejection::new(RejectionKind::KeyInvalid, message);
                    if let Value::String(key) = raw_key {
                        if key.len() <= max_key {
                            rejection = rejection.with_key(key);
                        }
                    }
                    return Err(Decision::Reject(rejection));
                }
            },
            (KeyMaterial::Digest, Value::String(digest)) => digest.clone(),
            // Errors before the fingerprint name this key; a window's is its fingerprint, below.
            _ => String::new(),
        };
        let key = IdempotencyKey::derived(source, call.tool_name, &value, max_key);
        let arguments_len = call.arguments.map_or(0, str::len);
        if arguments_len > self.config.max_argument_bytes {
            return Err(Decision::Reject(
                Rejection::new(
                    RejectionKind::ArgumentsTooLarge,
                    format!(
                        "arguments are {arguments_len} bytes, more than the limit of {} bytes",
                        self.config.max_argument_bytes
                    ),
                )
                .with_key(key.for_tool())
                .with_detail("limit", self.config.max_argument_bytes),
            ));
        }
        let fingerprint = fingerprint(call.tool_name, call.arguments)
            .map_err(|err| Decision::Reject(arguments_invalid(&err, &key)))?;
        let key = match material {
            KeyMaterial::Fingerprint => {
                IdempotencyKey::derived(source, call.tool_name, &fingerprint.to_hex(), max_key)
            }
            KeyMaterial::ClientString | KeyMaterial::Digest => key,
        };
        let retention = terms.retention.unwrap_or(self.config.retention);
        Ok(ClaimRequest {
            id: RecordId {
                scope: mutated_scope(scope),
                key,
            },
            fingerprint,
            tool_name: call.tool_name.into(),
            owner,
            now,
            lease_expires_at: now.saturating_add(self.config.lease),
            // Retention runs from completion; until then the record must at least outlive its
            // lease, or a retention shorter than the lease would let a duplicate of a running call
            // claim the key again and execute a second time.
            expires_at: now.saturating_add(retention.max(self.config.lease)),
            limits: self.config.limits,
            trace: call.trace,
        })
    }

    /// Turns the store's answer to a claim into the next step.
    fn on_claim(&self, req: ClaimRequest, answer: Result<ClaimOutcome, StoreError>) -> Step {
        let key = req.id.key.for_tool();
        match answer {
            Ok(ClaimOutcome::Claimed) => Step::Done(Decision::Execute(Claim {
                lease_expires_at: req.lease_expires_at,
                owner: req.owner,
                id: req.id,
                retention: self.config.retention,
                forget_errors: false,
                companion: None,
            })),
            Ok(ClaimOutcome::Existing(record)) => self.on_existing(req, record),
            Ok(ClaimOutcome::QuotaExceeded(quota)) => {
                let (whose, limit) = match quota {
                    QuotaExceeded::Scope { limit } => ("this caller", limit),
                    QuotaExceeded::Total { limit } => ("the server", limit),
                };
                reject(
                    Rejection::new(
                        RejectionKind::QuotaExceeded,
                        format!(
                            "{whose} already holds {limit} idempotency records; retry when older ones expire"
                        ),
                    )
                    .with_key(key)
                    .with_detail("limit", limit),
                )
            }
            Err(err) => reject(store_unavailable(&err, key)),
        }
    }

    /// The next step for a claim that found `record` under its key.
    fn on_existing(&self, req: ClaimRequest, record: Record) -> Step {
        let key = req.id.key.for_tool();
        if record.fingerprint != req.fingerprint {
            return reject(
                Rejection::new(
                    RejectionKind::KeyConflict,
                    "idempotencyKey was already used with a different tool name or arguments",
                )
                .with_key(key),
            );
        }
        match record.state {
            RecordState::Completed { outcome, .. } => Step::Done(replay(outcome, key)),
            RecordState::InProgress {
                lease_expires_at, ..
            } if lease_expires_at > req.now => reject(
                self.in_progress(key, Some(lease_expires_at.saturating_since(req.now))),
            ),
            RecordState::InProgress { owner, .. } => match self.config.after_crash {
                AfterCrash::Reject => reject(
                    Rejection::new(
                        RejectionKind::OutcomeUnknown,
                        "the request holding this idempotencyKey stopped before recording its outcome; it may or may not have taken effect",
                    )
                    .with_key(key),
                ),
                AfterCrash::Reexecute => Step::TakeOver(TakeOverRequest {
                    previous_owner: owner,
                    new_owner: req.owner,
                    now: req.now,
                    lease_expires_at: req.lease_expires_at,
                    expires_at: req.expires_at,
                    trace: req.trace,
                    id: req.id,
                }),
            },
        }
    }

    /// `idempotency_key_in_progress` for `key`, whose running call's lease has `lease_left` (when
    /// known). The retry hint is the configured one, shortened to the lease left when that ends
    /// sooner (by then the call has renewed its lease or its owner is gone, and the retry gets
    /// another answer), and never below [`EngineConfig::MIN_IN_PROGRESS_RETRY_AFTER`].
    fn in_progress(&self, key: &str, lease_left: Option<Duration>) -> Rejection {
        let configured = self.config.in_progress_retry_after;
        let after = lease_left
            .map_or(configured, |left| configured.min(left))
            .max(EngineConfig::MIN_IN_PROGRESS_RETRY_AFTER);
        Rejection::new(
            RejectionKind::KeyInProgress,
            format!(
                "a request with this idempotencyKey is still in progress; retry with the same key \
                 and arguments in {} ms to get its outcome",
                after.as_millis()
            ),
        )
        .with_key(key)
        .with_retry_after(after)
    }

    /// Turns the store's answer to a take-over into the decision.
    fn on_take_over(&self, req: TakeOverRequest, answer: Result<Fenced, StoreError>) -> Step {
        match answer {
            Ok(Fenced::Applied) => Step::Done(Decision::Execute(Claim {
                lease_expires_at: req.lease_expires_at,
                owner: req.new_owner,
                id: req.id,
                retention: self.config.retention,
                forget_errors: false,
                companion: None,
            })),
            // Someone else took the record over or completed it first: the key is busy or done, and
            // the client's next retry will see which.
            Ok(Fenced::NotOwner) => reject(self.in_progress(req.id.key.for_tool(), None)),
            Err(err) => reject(store_unavailable(&err, req.id.key.for_tool())),
        }
    }

    /// The store request that records `outcome` for a claimed call. An outcome larger than the
    /// configured limit is recorded as [`Outcome::NotRetained`].
    pub fn completion(&self, claim: &Claim, outcome: Outcome, now: Timestamp) -> CompleteRequest {
        let outcome = match outcome {
            Outcome::Success(raw) | Outcome::Error(raw)
                if raw.len() > self.config.max_outcome_bytes =>
            {
                Outcome::NotRetained {
                    size: raw.len() as u64,
                }
            }
            other => other,
        };
        CompleteRequest {
            id: claim.id.clone(),
            owner: claim.owner,
            outcome,
            completed_at: now,
            expires_at: now.saturating_add(claim.retention),
        }
    }

    /// When the owner should renew its lease: once a third of it has passed.
    pub fn renewal_due(&self, claim: &Claim) -> Timestamp {
        let early = self.config.lease - self.config.lease / 3;
        #[cfg(feature = "simulation")]
        if crate::simulation::is_on(crate::simulation::Mutant::RenewalAfterExpiry) {
            return claim.lease_expires_at.saturating_add(self.config.lease / 2);
        }
        Timestamp::from_millis(
            claim
                .lease_expires_at
                .as_millis()
                .saturating_sub(u64::try_from(early.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// Extends the claim's lease from `now`; returns the new deadline to pass to
    /// [`Store::renew`](crate::store::Store::renew).
    pub fn renew(&self, claim: &mut Claim, now: Timestamp) -> Timestamp {
        claim.lease_expires_at = now.saturating_add(self.config.lease);
        claim.lease_expires_at
    }

    /// The claim that records a client's own key beside its business identifier's record (the
    /// [`Claim`]'s companion), at `now`: its lease and expiry moved on by the time the call ran.
    pub(crate) fn beside(&self, companion: Companion, now: Timestamp) -> ClaimRequest {
        let mut req = *companion.0;
        let elapsed = now.saturating_since(req.now);
        req.lease_expires_at = req.lease_expires_at.saturating_add(elapsed);
        req.expires_at = req.expires_at.saturating_add(elapsed);
        req.now = now;
        req
    }

    /// The store's answer to the claim [`beside`](Self::beside) made: the claim of the client's
    /// key and the completion that records `outcome` under it (sent again like any completion
    /// until the store takes it, so that the record never stays in progress), or `None` when
    /// that key has a record already (or the store did not take the claim), which is left as it
    /// is.
    pub(crate) fn record_beside(
        &self,
        req: ClaimRequest,
        answer: Result<ClaimOutcome, StoreError>,
        outcome: Outcome,
    ) -> Option<(Claim, CompleteRequest)> {
        let now = req.now;
        match self.on_claim(req, answer) {
            Step::Done(Decision::Execute(claim)) => {
                let done = self.completion(&claim, outcome, now);
                Some((claim, done))
            }
            _ => None,
        }
    }
}

fn reject(rejection: Rejection) -> Step {
    Step::Done(Decision::Reject(rejection))
}

fn replay(outcome: Outcome, key: &str) -> Decision {
    match outcome {
        Outcome::Success(raw) => Decision::Replay(Replay::Result(raw)),
        Outcome::Error(raw) => Decision::Replay(Replay::Error(raw)),
        Outcome::NotRetained { size } => Decision::Reject(
            Rejection::new(
                RejectionKind::OutcomeNotRetained,
                format!(
                    "the request with this idempotencyKey completed, but its {size}-byte outcome was too large to keep"
                ),
            )
            .with_key(key),
        ),
        Outcome::Unknown { reason } => Decision::Reject(
            Rejection::new(
                RejectionKind::OutcomeUnknown,
                format!(
                    "the outcome of the request with this idempotencyKey is unknown: {reason}; it may or may not have taken effect"
                ),
            )
            .with_key(key),
        ),
    }
}

fn arguments_invalid(err: &ArgumentsError, key: &IdempotencyKey) -> Rejection {
    Rejection::new(RejectionKind::ArgumentsInvalid, err.to_string()).with_key(key.for_tool())
}

fn store_unavailable(err: &StoreError, key: &str) -> Rejection {
    tracing::warn!(error = %err, "idempotency store unavailable; refusing to execute");
    Rejection::new(
        RejectionKind::StoreUnavailable,
        "the idempotency store is unavailable, so the request was not executed; retry later",
    )
    .with_key(key)
    .with_retry_after(Duration::from_secs(1))
}

/// The scope a claim's record is kept under: `scope`, unless the simulator's
/// [`ReplayAcrossPrincipals`](crate::simulation::Mutant::ReplayAcrossPrincipals) leaves the
/// principal out.
#[cfg(feature = "simulation")]
fn mutated_scope(scope: &Scope) -> Scope {
    if crate::simulation::is_on(crate::simulation::Mutant::ReplayAcrossPrincipals) {
        return Scope::new(scope.namespace(), "");
    }
    scope.clone()
}

#[cfg(not(feature = "simulation"))]
fn mutated_scope(scope: &Scope) -> Scope {
    scope.clone()
}
